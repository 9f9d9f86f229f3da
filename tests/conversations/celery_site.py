"""``AAA["WORKER_SETUP"]`` of the conversation's Celery workers
(``tests.conversations.celery_site.setup``): the scripted model of the conversation
tests (it says what it heard and how many messages the conversation had) and its tool
that asks a person."""

from __future__ import annotations

from aaa_django.llm import FakeLLMClient, LLMHandler
from aaa_django.llm.fake import text, tool_call
from aaa_django.tools import ToolHandler, ToolRegistry

from . import site


def heard(request):
    last = request.messages[-1]
    if last.role == "tool":
        return text(f"you chose {last.content}")
    if last.content == "which city?":
        return tool_call("choose_city", why="a worker asks")
    return text(f"heard {last.content!r} ({len(request.messages)} messages)")


def setup(engine) -> None:
    LLMHandler(FakeLLMClient(heard)).attach(engine)
    ToolHandler(ToolRegistry([site.choose_city])).attach(engine)
