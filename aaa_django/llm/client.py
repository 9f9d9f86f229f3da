"""The ``LLMClient`` protocol: one async call from a whole conversation to a reply;
``StreamingLLMClient``: a client that can also hand out the reply's text as it comes."""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol, runtime_checkable

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


@runtime_checkable
class PricedClient(Protocol):
    """A client that prices its calls from a table (the provider clients): it can say
    before a run starts whether a model has a price, so a cost budget is never set on
    calls that would all cost 0."""

    #: the model asked when a request names none
    model: str | None

    def prices(self, model: str | None) -> bool:
        """Whether calls to ``model`` (None: the client's default model) have a price."""
        ...
