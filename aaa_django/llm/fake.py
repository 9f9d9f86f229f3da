"""A scripted model for tests, examples and benchmarks: ``FakeLLMClient(model_fn)``.

``model_fn(request)`` gets the whole conversation (``request.messages``) and the tool
specs (``request.tools``) and returns a reply built with :func:`text` or
:func:`tool_call` (or a plain string). Usage is computed deterministically from
character counts (about four characters a token), and cost from per-token prices, so
budgets can be tested exactly.
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Awaitable, Callable, Mapping

from .messages import LLMRequest, LLMResponse, Message, ToolCall, Usage

ModelFn = Callable[[LLMRequest], "LLMResponse | str | Awaitable[LLMResponse | str]"]

#: runs whose conversation a client remembers, to count only what each request adds
COUNTED_RUNS = 1024


def text(content: str) -> LLMResponse:
    """A reply that is plain text (the model is done)."""
    return LLMResponse(message=Message(role="assistant", content=content), finish_reason="stop")


def tool_call(name: str, /, **arguments: object) -> LLMResponse:
    """A reply asking for one tool call (its id is assigned by the handler)."""
    return tool_calls((name, arguments))


def tool_calls(*calls: tuple[str, Mapping[str, object]], content: str | None = None) -> LLMResponse:
    """A reply asking for several tool calls at once: ``tool_calls(("a", {...}), ...)``."""
    message = Message(
        role="assistant",
        content=content,
        tool_calls=tuple(ToolCall(name=n, arguments=dict(a)) for n, a in calls),
    )
    return LLMResponse(message=message, finish_reason="tool_calls")


def count_tokens(chars: int) -> int:
    """The fake tokenizer: about four characters a token."""
    return math.ceil(chars / 4)


def message_chars(m: Message) -> int:
    n = len(m.content or "")
    for c in m.tool_calls:
        n += len(c.name) + sum(len(str(k)) + len(str(v)) for k, v in c.arguments.items())
    return n


class FakeLLMClient:
    """An :class:`~aaa_django.llm.client.LLMClient` whose replies come from ``model_fn``.

    ``price_in`` / ``price_out`` are dollars per token. ``calls`` counts the calls
    (a redelivered request that was answered already is never sent again).
    """

    #: the provider it stands for (tracing: ``gen_ai.provider.name``)
    provider = "fake"

    def __init__(
        self,
        model_fn: ModelFn,
        *,
        model: str = "fake",
        price_in: float = 1e-6,
        price_out: float = 2e-6,
    ) -> None:
        self.model_fn = model_fn
        self.model = model
        self.price_in = price_in
        self.price_out = price_out
        self.calls = 0
        # run id -> (messages of its previous request, their character count): a
        # conversation grows by appending, so counting only the new messages keeps a
        # long run's per-call cost flat. Same numbers as counting everything. Bound:
        # the COUNTED_RUNS runs asked about last.
        self._counted: dict[str | None, tuple[list[Message], int]] = {}

    def input_chars(self, request: LLMRequest) -> int:
        """Characters of the whole conversation (incrementally, per run)."""
        msgs = request.messages
        prev = self._counted.get(request.run_id)
        if (
            prev is not None
            and prev[0]
            and len(msgs) >= len(prev[0])
            and (msgs[len(prev[0]) - 1] is prev[0][-1] and msgs[0] is prev[0][0])
        ):
            chars = prev[1] + sum(message_chars(m) for m in msgs[len(prev[0]) :])
        else:
            chars = sum(message_chars(m) for m in msgs)
        self._counted.pop(request.run_id, None)  # (the newest last)
        self._counted[request.run_id] = (msgs, chars)
        if len(self._counted) > COUNTED_RUNS:
            self._counted.pop(next(iter(self._counted)))
        return chars

    async def complete(self, request: LLMRequest) -> LLMResponse:
        self.calls += 1
        reply = self.model_fn(request)
        if inspect.isawaitable(reply):
            reply = await reply
        if isinstance(reply, str):
            reply = text(reply)
        elif isinstance(reply, Message):
            reply = LLMResponse(message=reply)
        if not isinstance(reply, LLMResponse):
            raise TypeError(f"model_fn must return text(...), tool_call(...) or a str, got {reply!r}")
        usage = Usage(
            input_tokens=count_tokens(self.input_chars(request)),
            output_tokens=max(1, count_tokens(message_chars(reply.message))),
        )
        cost = round(usage.input_tokens * self.price_in + usage.output_tokens * self.price_out, 12)
        return reply.model_copy(update={"usage": usage, "cost": cost, "model": self.model})
