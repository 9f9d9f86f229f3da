"""Uncertain side-effecting calls, reconciled by a person.

A guarded tool call (``@tool(side_effects=True)``) writes its intent
(``aaa.tool.started``) before it acts. When a process finds the intent of a call with
no result, and no live process holds the call (the one that ran it died, or was cut
off from the cluster), the call *may* have acted: it is **uncertain**. It is never run
again by itself (a non-idempotent side effect twice), and its run does not go on as
if it had failed: ``ToolHandler(uncertain=...)`` (``AAA["UNCERTAIN"]``) decides.

- ``"reconcile"`` (the default): the run waits for a person. The handler asks, through
  the engine's approval machinery: an ``aaa.approval.requested`` derived from the
  call's request with key ``"reconcile"`` (:func:`gate_id`), whose data carries
  ``reconcile`` (the reason, the choices). It is listed and answered as any approval
  (the REST API's approvals, the admin's run page): *grant* runs the call again
  ("run it again"), *deny* records it as not run (``aaa.tool.failed``, reason
  ``not_run``: the run's algorithm decides what to do about it). The third answer,
  "it ran", is :func:`reconcile` with ``"ran"``: the call is recorded
  ``aaa.tool.completed`` with the result its late outcome brought (below), or the one
  the person gives. A run waiting so is not stalled (the sweeper leaves it alone).
- ``"fail"``: the run ends ``failed``, with the reason ``uncertain_tool_call`` and the
  call named, after the call's ``aaa.tool.failed`` (reason ``uncertain``).

**A late outcome.** The call that was cut off may still finish, in the process that
ran it, after its call was found uncertain. Its outcome is recorded as its own event,
``aaa.tool.returned`` (:func:`returned_id`; the result, or the error), never dropped
and never as the call's result: the person reconciling sees what the call did. (With
``"fail"`` the run has ended by then and its log takes nothing more: the outcome is
logged as a warning.)
"""

from __future__ import annotations

import time

from aaa_django.events import Event, derive_id
from aaa_django.runtime import Engine
from aaa_django.runtime.event_types import (
    APPROVAL_DENIED,
    APPROVAL_GRANTED,
    APPROVAL_REQUESTED,
    TOOL_RETURNED,
    decision_id,
)

#: what ``ToolHandler(uncertain=...)`` does with an uncertain call
POLICIES = ("reconcile", "fail")
#: a person's answers: the call ran, it did not, run it again
VERDICTS = ("ran", "not_run", "run_again")
#: the reason of a run ended because of an uncertain call (``uncertain="fail"``)
UNCERTAIN_REASON = "uncertain_tool_call"

#: the key of a call's reconciliation gate (derived from its request)
GATE_KEY = "reconcile"
#: the key of the intent of a call run again by a person's answer
AGAIN_KEY = "run_again"


def gate_id(request_id: str) -> str:
    """The id of the reconciliation gate of the tool request ``request_id``."""
    return derive_id(request_id, APPROVAL_REQUESTED, GATE_KEY)


def returned_id(request_id: str) -> str:
    """The id of the late outcome of the tool request ``request_id``."""
    return derive_id(request_id, TOOL_RETURNED, "")


def gate(request: Event, name: str) -> Event:
    """The reconciliation gate of the uncertain call ``request`` (of tool ``name``)."""
    d = request.data
    return request.derive(
        APPROVAL_REQUESTED,
        {
            "tool_request_id": request.id,
            "tool_request_seq": request.seq,
            "call_id": d.get("call_id"),
            "name": name,
            "args": d.get("args") or {},
            "expires_at": None,
            "reconcile": {
                "reason": "uncertain",
                "message": (
                    "the call may have run: its intent is in the log, its result is not, and the "
                    "process that ran it is gone. Did it run? Grant to run it again, deny to record "
                    "that it did not run, or answer that it ran."
                ),
                "choices": list(VERDICTS),
            },
        },
        key=GATE_KEY,
    )


def verdict_of(decision: Event) -> str:
    """What a decision of a reconciliation gate says: its ``verdict``, else grant runs
    the call again and deny (or an expiry) records it as not run."""
    verdict = decision.data.get("verdict")
    if verdict in VERDICTS:
        return str(verdict)
    return "run_again" if decision.type == APPROVAL_GRANTED else "not_run"


async def reconcile(
    engine: Engine,
    run_id: str,
    request_id: str,
    verdict: str,
    *,
    by: str | None = None,
    reason: str | None = None,
    result: object = None,
) -> bool:
    """Answer the reconciliation gate ``request_id`` (its ``aaa.approval.requested``
    id) of run ``run_id``: ``"ran"`` (``result``: what it returned, if no late outcome
    says), ``"not_run"`` or ``"run_again"``. Recorded as the gate's decision (granted,
    or denied for ``"not_run"``) with who answered and why. False if the gate is not
    pending (decided already, or the run has ended)."""
    if verdict not in VERDICTS:
        raise ValueError(f"a verdict is one of {', '.join(VERDICTS)}, not {verdict!r}")
    meta = await engine.meta(run_id, fresh=True)
    pending = meta.approvals.get(request_id)
    if pending is None or meta.completed:
        return False
    data = {
        "request_id": request_id,
        "tool_request_id": pending.tool_request_id,
        "tool_request_seq": pending.tool_request_seq,
        "call_id": pending.call_id,
        "name": pending.name,
        "verdict": verdict,
        "by": by,
        "reason": reason,
        "at": time.time(),
    }
    if verdict == "ran" and result is not None:
        data["result"] = result
    kind = APPROVAL_DENIED if verdict == "not_run" else APPROVAL_GRANTED
    decision = Event(id=decision_id(request_id), stream=run_id, type=kind, data=data, causation=request_id)
    return bool(await engine.append([decision]))
