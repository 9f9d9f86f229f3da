"""The ``LLMClient`` protocol: one async call from a whole conversation to a reply;
``StreamingLLMClient``: a client that can also hand out the reply's text as it comes."""

from __future__ import annotations

from typing import Callable, Protocol, runtime_checkable

from .messages import LLMRequest, LLMResponse

#: ``on_text(index, text)``: a piece of the reply's text; index 0 starts a reply (again
#: after a retried attempt)
TextSink = Callable[[int, str], None]


@runtime_checkable
class LLMClient(Protocol):
    """A model provider. ``complete`` may raise: the handler records ``aaa.llm.failed``."""

    async def complete(self, request: LLMRequest) -> LLMResponse: ...


@runtime_checkable
class StreamingLLMClient(LLMClient, Protocol):
    """A model provider that streams: ``stream`` returns the same reply ``complete``
    would, calling ``on_text`` with each piece of its text as the provider sends it."""

    async def stream(self, request: LLMRequest, on_text: TextSink) -> LLMResponse: ...
