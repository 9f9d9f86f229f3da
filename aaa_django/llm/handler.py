"""``LLMHandler``: turns each ``aaa.llm.requested`` into exactly one result event.

The request carries only delta messages; the handler rebuilds the whole conversation
from the log (:data:`~aaa_django.llm.conversation.CONVERSATION`), calls the client and
appends ``aaa.llm.completed`` (``response.message``, ``usage``, ``cost``, ``tag``) or
``aaa.llm.failed`` (``reason``: ``error`` or ``timeout``). Nothing is raised across the
bus. A request that is answered already, or whose run has ended or is over a limit,
is not sent.

Given a ``deltas`` sink and a client that streams (:class:`StreamingLLMClient`,
detected once here), the handler streams each call and publishes its text as
:class:`~aaa_django.llm.deltas.TokenDelta` s as they come; the log gets the same one
``aaa.llm.completed`` either way.
"""

from __future__ import annotations

import asyncio
import traceback
from typing import Any

from aaa_django.events import Event, InvalidEventError, derive_id, encode_json
from aaa_django.runtime import Engine
from aaa_django.runtime.event_types import (
    LLM_COMPLETED,
    LLM_FAILED,
    LLM_REQUESTED,
    result_event,
    result_id,
)

from .client import LLMClient, PricedClient, StreamingLLMClient
from .conversation import conversation_of
from .deltas import DeltaSink, TokenDelta
from .messages import LLMRequest


class LLMHandler:
    """Calls ``client`` for model requests; ``timeout`` (seconds) bounds each call;
    ``deltas`` receives the reply's text as it streams (when ``client`` streams)."""

    def __init__(self, client: LLMClient, *, timeout: float | None = None,
                 deltas: DeltaSink | None = None) -> None:
        self.client = client
        self.timeout = timeout
        self.deltas = deltas
        #: the client, when it streams and someone listens
        self.streaming: StreamingLLMClient | None = (
            client if deltas is not None and isinstance(client, StreamingLLMClient) else None)
        #: the client when it can tell priced models from unpriced ones (detected once)
        self.pricer: PricedClient | None = client if isinstance(client, PricedClient) else None
        self.engine: "Engine | None" = None
        self._inflight: set[str] = set()

    def attach(self, engine: "Engine") -> "LLMHandler":
        """Subscribe to ``aaa.llm.requested`` on ``engine``."""
        self.engine = engine
        engine.subscribe(LLM_REQUESTED, self)
        return self

    async def __call__(self, event: Event) -> None:
        if event.id in self._inflight:  # delivered again while we are on it
            return
        self._inflight.add(event.id)
        try:
            await self._handle(event)
        finally:
            self._inflight.discard(event.id)

    async def _handle(self, event: Event) -> None:
        engine = self.engine
        assert engine is not None, "attach the handler to an engine first"
        if await engine.over(event):
            return
        rid = result_id(event.id)
        if await engine.find_after(event, [rid]):
            return
        d = event.data
        request = LLMRequest(
            messages=await conversation_of(engine, event),
            tools=list(d.get("tools") or ()),
            model=d.get("model"),
            tag=d.get("tag"),
            params=dict(d.get("params") or {}),
            output=d.get("output"),
            request_id=event.id,
            run_id=event.stream,
            agent=d.get("agent"),
        )
        base = {"request_id": event.id, "tag": d.get("tag"), "thread": d.get("thread") or "main"}
        try:
            call = (self.client.complete(request) if self.streaming is None
                    else self.streaming.stream(request, self._publisher(event)))
            async with engine.waiting():  # other runs' work goes on meanwhile
                response = await (asyncio.wait_for(call, self.timeout) if self.timeout else call)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            await engine.answer([result_event(event, LLM_FAILED, {**base, **self.failure(exc)})])
            return
        message = _with_call_ids(response.message, event.id)
        data = {
            **base,
            "response": {
                "message": message.to_dict(),
                "finish_reason": response.finish_reason,
            },
            "usage": response.usage.model_dump(),
            "cost": response.cost,
            "model": response.model,
        }
        if not response.priced:
            data["priced"] = False  # cost 0 because nobody priced the model, not free
        await engine.answer([result_event(event, LLM_COMPLETED, data)])

    def _publisher(self, event: Event) -> Any:
        sink, run_id, request_id = self.deltas, event.stream, event.id
        assert sink is not None

        def on_text(index: int, text: str) -> None:
            sink.publish(TokenDelta(run_id=run_id, request_id=request_id, index=index, text=text))

        return on_text
    def unpriced(self, model: str | None) -> str | None:
        """The name of ``model`` (None: the client's default) when this handler's
        client knows it has no price; None when it has one or the client cannot tell."""
        if self.pricer is None or self.pricer.prices(model):
            return None
        return model or self.pricer.model or "the client's default model"

    def start_errors(self, config: Any, budget: Any) -> list[dict[str, Any]]:
        """A run's start checked (``runtime.engine_api.ChecksStart``): a cost budget
        over a model (the run's ``config.model``, else the client's default) without a
        price could never trip (every call would cost 0)."""
        if not isinstance(budget, dict) or budget.get("cost") is None:
            return []
        model = config.get("model") if isinstance(config, dict) else None
        name = self.unpriced(model if isinstance(model, str) else None)
        if name is None:
            return []
        return [{"loc": ["budget", "cost"], "type": "unpriced_model",
                 "msg": f"model {name!r} has no price, so a cost budget cannot be enforced: add it "
                        "to the model client's pricing table (AAA['LLM']['PRICING'])"}]

    def failure(self, exc: BaseException) -> dict[str, Any]:
        """The data of ``aaa.llm.failed`` for ``exc``: ``reason`` (a client error's own
        ``reason``, e.g. ``rate_limit``; else ``timeout`` or ``error``), ``error``, and
        the client's ``status`` / ``attempts`` when it gives them."""
        if isinstance(exc, asyncio.TimeoutError):
            why = f"model call timed out after {self.timeout}s" if self.timeout else f"TimeoutError: {exc}"
            return {"reason": "timeout", "error": why}
        reason = getattr(exc, "reason", None)
        data: dict[str, Any] = {
            "reason": reason if isinstance(reason, str) and reason else "error",
            "error": f"{type(exc).__name__}: {exc}",
            "traceback": "".join(traceback.format_exception(type(exc), exc, exc.__traceback__)),
        }
        status = getattr(exc, "status", None)
        if isinstance(status, int):
            data["status"] = status
        attempts = getattr(exc, "attempts", None)
        if isinstance(attempts, list):
            try:
                encode_json(attempts)
                data["attempts"] = attempts
            except InvalidEventError:
                data["attempts"] = [str(a) for a in attempts]
        return data


def _with_call_ids(message: Any, request_id: str) -> Any:
    """Give every tool call an id; missing ones are derived from the request id."""
    if not message.tool_calls or all(c.id for c in message.tool_calls):
        return message
    calls = tuple(
        c if c.id else c.model_copy(update={"id": "call_" + derive_id(request_id, "call", i)[:13]})
        for i, c in enumerate(message.tool_calls)
    )
    return message.model_copy(update={"tool_calls": calls})
