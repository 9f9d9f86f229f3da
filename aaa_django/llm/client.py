"""The ``LLMClient`` protocol: one async call from a whole conversation to a reply."""

from __future__ import annotations

from typing import Protocol, runtime_checkable

from .messages import LLMRequest, LLMResponse


@runtime_checkable
class LLMClient(Protocol):
    """A model provider. ``complete`` may raise: the handler records ``aaa.llm.failed``."""

    async def complete(self, request: LLMRequest) -> LLMResponse: ...
