"""The run page's attempts panel: each model call of the run and its attempts.

An attempt (``aaa.llm.attempted``) is on the log before it is sent; how it went is
told by a later event: the result that names it (``aaa.llm.completed`` /
``aaa.llm.failed``, whose ``attempts`` records say how the client's earlier attempts
of the same call went), its abandonment (``aaa.llm.abandoned``: counted at its
estimate), or the run's end that cut it off. Read from the run's rows (two indexed
queries), the newest :data:`CALLS_SHOWN` model calls; the events' own data only, so a
claim-checked request shows what its stub keeps.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from aaa_django.models import EventRecord
from aaa_django.runtime.event_types import (
    LLM_ABANDONED,
    LLM_ATTEMPTED,
    LLM_COMPLETED,
    LLM_FAILED,
    LLM_REQUESTED,
)

#: model calls the panel shows, the newest
CALLS_SHOWN = 100


@dataclass
class Attempt:
    """One attempt of a model call, as the panel shows it."""

    number: int
    seq: int
    time: datetime
    #: "answered", "failed: <reason>", "retried: <reason>", "abandoned", "cut off: <reason>",
    #: "in flight"
    outcome: str = "in flight"
    #: dollars: the reply's, or the estimate an abandoned or cut-off attempt counts at
    cost: float | None = None
    tokens: str = ""
    #: the cost is the attempt's estimate (its reply never came)
    estimated: bool = False
    abandoned: bool = False
    #: the seq of the event that says how it went
    outcome_seq: int | None = None


@dataclass
class ModelCall:
    """A model request and its attempts, oldest first."""

    request_id: str
    seq: int
    tag: str | None
    attempts: list[Attempt] = field(default_factory=list)

    @property
    def abandoned(self) -> int:
        return sum(a.abandoned for a in self.attempts)


@dataclass
class Calls:
    calls: list[ModelCall]
    #: model calls before the ones shown
    earlier: int = 0

    @property
    def attempts(self) -> int:
        return sum(len(c.attempts) for c in self.calls)

    @property
    def abandoned(self) -> int:
        return sum(c.abandoned for c in self.calls)


def model_calls(run_id: str, using: str = "default", *, shown: int = CALLS_SHOWN) -> Calls:
    """The run's newest ``shown`` model calls with their attempts."""
    rows = EventRecord.objects.using(using).filter(stream=run_id)
    requests = list(rows.filter(type=LLM_REQUESTED).order_by("-seq").values_list("id", "seq", "data")[: shown + 1])
    total = rows.filter(type=LLM_REQUESTED).count() if len(requests) > shown else len(requests)
    requests = requests[:shown][::-1]
    if not requests:
        return Calls([], 0)
    calls = {rid: ModelCall(rid, seq, _data(raw).get("tag")) for rid, seq, raw in requests}
    told = (
        rows.filter(type__in=(LLM_ATTEMPTED, LLM_ABANDONED, LLM_COMPLETED, LLM_FAILED), seq__gt=requests[0][1])
        .order_by("seq")
        .values_list("seq", "type", "time", "data")
    )
    by_number: dict[tuple[str, int], Attempt] = {}
    for seq, kind, time, raw in told:
        d = _data(raw)
        call = calls.get(d.get("request_id") or "")
        if call is None:
            continue
        number = d.get("attempt")
        if kind == LLM_ATTEMPTED and isinstance(number, int):
            made = by_number[call.request_id, number] = Attempt(number, seq, time)
            call.attempts.append(made)
            continue
        told_of = by_number.get((call.request_id, number)) if isinstance(number, int) else None
        if kind == LLM_ABANDONED and told_of is not None:
            _told(told_of, "abandoned", seq, d, estimated=True)
            told_of.abandoned = True
        elif kind in (LLM_COMPLETED, LLM_FAILED):
            _result(call, told_of, kind, seq, d)
    for call in calls.values():
        for earlier in call.attempts[:-1]:
            if earlier.outcome == "in flight":  # a later attempt of the same call followed it
                earlier.outcome = "retried"
    return Calls(list(calls.values()), max(0, total - len(calls)))


def _result(call: ModelCall, attempt: Attempt | None, kind: str, seq: int, d: Mapping[str, object]) -> None:
    """How the attempt a result names went, and the client's attempts before it."""
    if attempt is None:
        return
    if kind == LLM_COMPLETED:
        _told(attempt, "answered", seq, d)
    elif d.get("cut_off"):
        _told(attempt, f"cut off: {d.get('reason')}", seq, d, estimated=bool(d.get("estimated")))
    else:
        _told(attempt, f"failed: {d.get('reason')}", seq, d)
    records = d.get("attempts")
    if not isinstance(records, list) or len(records) < 2:
        return
    first = attempt.number - len(records) + 1
    for record, number in zip(records[:-1], range(first, attempt.number)):
        earlier = next((a for a in call.attempts if a.number == number), None)
        if earlier is not None and earlier.outcome == "in flight" and isinstance(record, dict):
            status = f", HTTP {record['status']}" if record.get("status") else ""
            earlier.outcome = f"retried: {record.get('reason')}{status}"
            earlier.outcome_seq = seq
            earlier.cost = 0.0


def _told(attempt: Attempt, outcome: str, seq: int, d: Mapping[str, object], *, estimated: bool = False) -> None:
    attempt.outcome = outcome
    attempt.outcome_seq = seq
    attempt.estimated = estimated
    cost = d.get("cost")
    attempt.cost = float(cost) if isinstance(cost, (int, float)) else None
    usage = d.get("usage")
    if isinstance(usage, dict):
        attempt.tokens = f"{usage.get('input_tokens', 0)} in / {usage.get('output_tokens', 0)} out"


def _data(raw: object) -> dict[str, Any]:
    try:
        d = json.loads(raw) if isinstance(raw, str) else raw
    except ValueError:
        return {}
    return d if isinstance(d, dict) else {}


def attempted_summary(d: dict[str, Any]) -> str:
    """The timeline's line for an ``aaa.llm.attempted``."""
    estimate = d.get("estimate") or {}
    usage = estimate.get("usage") or {}
    line = f"attempt {d.get('attempt')} of the model call, sent to {d.get('model') or 'the model'}"
    return line + (
        f" · at most {usage.get('input_tokens', 0)} in / {usage.get('output_tokens', 0)} out tokens, "
        f"${float(estimate.get('cost') or 0):.6f}"
    )


def abandoned_summary(d: Mapping[str, Any]) -> str:
    """The timeline's line for an ``aaa.llm.abandoned``."""
    return (
        f"attempt {d.get('attempt')} abandoned (its process died with it in flight) · counted at its "
        f"estimate, ${float(d.get('cost') or 0):.6f}"
    )
