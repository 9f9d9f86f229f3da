"""Limits: the outcome a run's limits impose, decided from its ``RUNMETA`` (pure).

A run ends ``cancelled`` once asked to, ``invalid_input`` when its input failed
validation, ``timeout`` past its deadline, ``budget_exceeded`` once its spend is over
its budget, and ``failed`` when one of its model calls had too many attempts
abandoned (:func:`breach`). A step whose requests would go over a call budget is
refused before they are recorded (:func:`over_budget`). However a run ends, each
model or tool call still waiting for its result gets one before the run's
``aaa.run.completed`` (:func:`cut_off`), so a log reads whole.

Nothing here reads or writes: the engine (:meth:`Engine.limit_breach
<aaa_django.runtime.Engine.limit_breach>`, its step and its appends) asks, and appends
what the answer calls for.
"""

from __future__ import annotations

import time
from typing import Any

from aaa_django.events import Event

from .event_types import (
    LLM_FAILED,
    LLM_REQUESTED,
    RUN_COMPLETED,
    TOOL_FAILED,
    TOOL_REQUESTED,
    result_id,
)
from .meta import OpenCall, RunMeta
from .meta import apply as fold_runmeta
from .outcome import BUDGET_EXCEEDED, CANCELLED, FAILED, INVALID_INPUT, TIMEOUT, Outcome

#: the ``reason`` of the result a run's end records for a call it cut off, by outcome
#: (any other outcome: ``run_ended``)
CUT_OFF_REASONS: dict[str | None, str] = {
    CANCELLED: "cancelled",
    TIMEOUT: "timeout",
    BUDGET_EXCEEDED: "budget_exceeded",
}


def breach(meta: RunMeta, max_abandoned: int, now: float | None = None) -> Outcome | None:
    """The outcome a limit imposes on the run now, if any. ``max_abandoned``: attempts
    of one model call recorded abandoned that end the run ``failed``."""
    if meta.cancel is not None:
        return Outcome(CANCELLED, meta.cancel)
    if meta.input_errors is not None:
        return Outcome(INVALID_INPUT, {"errors": meta.input_errors})
    if meta.deadline is not None and (time.time() if now is None else now) >= meta.deadline:
        return Outcome(TIMEOUT, {"deadline": meta.deadline})
    if meta.budget is not None:
        over = meta.budget.exceeded(meta.spend)
        if over is not None:
            return Outcome(BUDGET_EXCEEDED, over)
    for request_id, call in meta.calls.items():
        if call.abandoned >= max_abandoned:
            return Outcome(
                FAILED,
                {
                    "error": f"model call {request_id} had {call.abandoned} attempts abandoned (the process "
                    "making each died, or lost the run, with it in flight): it is not sent again",
                    "reason": "abandoned_attempts",
                    "request_id": request_id,
                    "abandoned": call.abandoned,
                    "limit": max_abandoned,
                },
            )
    return None


def over_budget(meta: RunMeta, out: list[Event]) -> dict | None:
    """The call budget a step's requests would exceed, if any (a step that ends its run
    asks for nothing more)."""
    if meta.budget is None:
        return None
    counts = {LLM_REQUESTED: 0, TOOL_REQUESTED: 0, RUN_COMPLETED: 0}
    for e in out:
        if e.type in counts and e.stream == meta.run_id:
            counts[e.type] += 1
    if counts[RUN_COMPLETED]:
        return None
    return meta.budget.refuses(meta.spend, model_calls=counts[LLM_REQUESTED], tool_calls=counts[TOOL_REQUESTED])


def cut_off(batch: list[Event], meta: RunMeta, done: int = 0) -> list[Event]:
    """``batch``, which ends with the run's ``aaa.run.completed``, with a result
    before the completion for each model or tool call still waiting for one (``meta``:
    the run's RUNMETA with the batch's first ``done`` events folded; the rest of the
    batch is folded here): ``aaa.llm.failed`` / ``aaa.tool.failed``, ``reason``
    ``cancelled``, ``timeout``, ``budget_exceeded``, ``abandoned`` (the call whose
    abandoned attempts ended the run) or ``run_ended``, and ``"cut_off": true``, so a
    log reads whole. A model call with an attempt in flight is counted at that
    attempt's estimate (``"estimated": true``): its reply, if it comes, is not part of
    the log. Each has the request's one result id: a handler's own result, appended
    meanwhile, wins."""
    completion = batch[-1]
    if not meta.started or meta.completed:
        return batch  # (the store refuses the batch)
    state = meta
    if len(batch) - 1 > done:
        state = meta.__deepcopy__()
        for e in batch[done:-1]:
            state = fold_runmeta(state, e)
    if not state.calls:
        return batch
    outcome = completion.data.get("outcome")
    value = completion.data.get("value")
    cut = [cut_off_result(completion, rid, call, outcome, value) for rid, call in state.calls.items()]
    return [*batch[:-1], *cut, completion]


def cut_off_result(completion: Event, request_id: str, call: OpenCall, outcome: str | None, value: object) -> Event:
    """The result a run's end (``completion``) records for a call it cut off."""
    abandoned = (
        outcome == FAILED
        and isinstance(value, dict)
        and value.get("reason") == "abandoned_attempts"
        and value.get("request_id") == request_id
    )
    reason = "abandoned" if abandoned else CUT_OFF_REASONS.get(outcome, "run_ended")
    data: dict[str, Any]
    if call.kind == "llm":
        data = {
            "request_id": request_id,
            "tag": call.tag,
            "thread": call.thread or "main",
            "reason": reason,
            "error": f"the run ended ({outcome}) before the model call had a result",
            "cut_off": True,
        }
        if call.in_flight is not None:  # sent, and never to be recorded: counted at its estimate
            data.update(attempt=call.attempts, estimated=True, **call.in_flight.data())
        kind = LLM_FAILED
    else:
        data = {
            "call_id": call.call_id,
            "name": call.name,
            "reason": reason,
            "error": f"the run ended ({outcome}) before the tool call had a result",
            "cut_off": True,
        }
        kind = TOOL_FAILED
    return Event(
        id=result_id(request_id),
        stream=completion.stream,
        type=kind,
        data=data,
        causation=request_id,
        tenant=completion.tenant,
    )
