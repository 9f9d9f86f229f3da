"""The scripted model and the tools of the conversation tests over the REST API (the
engine host's ``AAA["LLM_CLIENT"]`` and ``AAA["TOOLS"]``, in the pytest process).

The model says what it heard and how long the conversation was; to "which city?" it
calls ``choose_city``, a tool that asks the person (the answer is its result); a
message starting with "wait" is answered once the test sets :data:`GATE`. Every
request it is sent is kept in :data:`REQUESTS`."""

from __future__ import annotations

import asyncio
import threading

from aaa_django.llm import FakeLLMClient
from aaa_django.llm.fake import text, tool_call
from aaa_django.tools import Ask, tool

#: every request the model was sent, in order
REQUESTS: list = []
#: set by a test: the model answers a message that starts with "wait"
GATE = threading.Event()

CITY = {
    "type": "object",
    "properties": {"city": {"enum": ["Lyon", "Porto"]}},
    "required": ["city"],
    "additionalProperties": False,
}


@tool(inline=True)
def choose_city(why: str, expires: float | None = None) -> str:
    """Ask the person which city they mean."""
    raise Ask(f"Which city? ({why})", schema=CITY, expires=expires)


async def script(request):
    REQUESTS.append(request)
    last = request.messages[-1]
    if last.role == "tool":
        return text(f"you chose {last.content}")
    if last.content == "which city?":
        return tool_call("choose_city", why="two are known")
    if last.content == "which city, quickly?":
        return tool_call("choose_city", why="be quick", expires=0.5)
    if (last.content or "").startswith("wait"):
        await asyncio.to_thread(GATE.wait, 30)
    return text(f"heard {last.content!r} ({len(request.messages)} messages)")


def model():
    """``AAA["LLM_CLIENT"]``: the scripted model."""
    return FakeLLMClient(script)


class StreamingModel(FakeLLMClient):
    """The same script, its text handed over a word at a time (``AAA["STREAM_TOKENS"]``)."""

    async def stream(self, request, on_text):
        reply = await self.complete(request)
        for i, word in enumerate((reply.message.content or "").split(" ")):
            on_text(i, word if i == 0 else " " + word)
        return reply


def streaming_model():
    """``AAA["LLM_CLIENT"]`` of the tests that read the replies' tokens."""
    return StreamingModel(script)
