"""The chat page's demo agent: a SCRIPTED model and a tool that asks the person.

No model provider is called unless the environment configures one (``AAA_LLM_*``).
:func:`demo_model` is the example site's ``AAA["LLM_CLIENT"]``: requests of the chat
page's runs (model :data:`CHAT_MODEL`) get the chat script, streamed a word at a time
(``AAA["STREAM_TOKENS"]``: the page shows each reply as it is written); every other
request goes to the site's demo model (``project.api_demo``). The chat script answers
what it is told, and to a question about inhabitants asks the person which city with
``choose_city`` (a form on the page), then looks the population up.
"""

from __future__ import annotations

import asyncio
import re
from typing import Any

from aaa_django.llm.client import TextSink
from aaa_django.llm.fake import FakeLLMClient, text, tool_call
from aaa_django.llm.messages import LLMRequest, LLMResponse
from aaa_django.tools import Ask, tool

#: the model the chat page's runs name: answered by the chat script below
CHAT_MODEL = "chat-demo"
#: the chat agent's instructions (its runs' ``config.system``)
SYSTEM = (
    "You are the demo assistant of aaa_django's example site. Answer briefly. To say how many "
    "people live in a city, ask which city with choose_city, then use lookup_population."
)
#: seconds between two words of a streamed reply
WORD_GAP = 0.04

CITY = {
    "type": "object",
    "title": "City",
    "properties": {"city": {"enum": ["Lyon", "Porto"], "title": "City"}},
    "required": ["city"],
    "additionalProperties": False,
}


@tool(inline=True)
def choose_city(why: str) -> str:
    """Ask the person which city they mean (they answer in a form).

    Args:
        why: what the city is for.
    """
    raise Ask(f"Which city do you mean ({why})?", schema=CITY, expires=600)


def chat_script(request: LLMRequest) -> LLMResponse:
    """The scripted chat (see the module)."""
    last = request.messages[-1]
    if last.role == "tool":
        if last.name == "choose_city":
            city = re.search(r'"city":\s*"(\w+)"', last.content or "")
            return tool_call("lookup_population", city=city.group(1) if city else "Lyon")
        return text(f"It has {int(last.content or 0):,} inhabitants, by the demo's table.")
    said = (last.content or "").strip()
    turn = sum(1 for m in request.messages if m.role == "user")
    if re.search(r"\b(inhabitants|population|people live)\b", said, re.I):
        return tool_call("choose_city", why="for its population")
    return text(
        f"You said: \u201c{said}\u201d. This is turn {turn} of our conversation "
        f"({len(request.messages)} messages so far). Ask me how many people live in a city."
    )


class DemoModel:
    """The chat script for the chat page's runs (streamed), the site's demo model for
    the others."""

    provider = "fake"

    def __init__(self, other: Any) -> None:
        self.chat = FakeLLMClient(chat_script, model=CHAT_MODEL)
        self.other = other

    async def complete(self, request: LLMRequest) -> LLMResponse:
        return await (self.chat if request.model == CHAT_MODEL else self.other).complete(request)

    async def stream(self, request: LLMRequest, on_text: TextSink) -> LLMResponse:
        """The reply, its text handed over a word at a time as it is "written"."""
        if request.model != CHAT_MODEL:
            streams = getattr(self.other, "stream", None)
            if streams is not None:
                return await streams(request, on_text)
            return await self.other.complete(request)
        reply = await self.chat.complete(request)
        words = re.findall(r"\S+\s*", reply.message.content or "")
        for i, word in enumerate(words):
            await asyncio.sleep(WORD_GAP)
            on_text(i, word)
        return reply


def demo_model() -> Any:
    """``AAA["LLM_CLIENT"]`` of the example site: the provider of ``AAA["LLM"]`` when the
    environment configures one (then the chat page's runs name no model), else the
    scripted models."""
    from project.api_demo import scripted_model

    client = scripted_model()
    return client if not isinstance(client, FakeLLMClient) else DemoModel(client)
