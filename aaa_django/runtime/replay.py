"""Replay a run's log through the current code and compare its decisions (Temporal's
replay tests, for runs): a recorded production run becomes a golden test.

The replay builds an engine with no handlers on a fresh memory store and feeds it the
recorded events the algorithm does not decide (:data:`FED`: the run's start, the
input's verdict, model and tool results, approvals, child results, cancel requests,
a deadline's timeout, a conversation's messages and close, a tool's questions and
every question's answer or expiry) in recorded order, letting the current algorithm and engine
decide after each, exactly as the engine does live (their own events are delivered
to them too). What they decided (requests, child runs, plans, FSM states, the
completion) must equal the recording: same type, same id, same data.

Limits are judged at the recorded time of the event being fed (a deadline long past
today was not past then), and timers never ring: the recorded timeout is fed instead.
A fork's inherited events (its first N, copied from the run it forked) are history,
decided under the other run's configuration: they are fed, and only what the fork
decided itself is compared.

Normalised away: event times; seqs and causation (which delivery made a decision, and
where it lands among the results, depend on delivery timing: decisions are compared
as a set of type, id and data, ids being deterministic); tracebacks (they name files
on the recording machine). Claim-checked events must be given hydrated.
"""

from __future__ import annotations

import asyncio
import json
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from typing import Any, TypedDict

from aaa_django.data import is_claimed
from aaa_django.events import Event, FoldCache, InMemoryEventStore

from .bus import Work
from .engine import Engine
from .engine_api import EngineAPI
from .event_types import (
    APPROVAL_DECISIONS,
    APPROVAL_REQUESTED,
    CANCEL_REQUESTED,
    CHILD_COMPLETED,
    CLOSE_REQUESTED,
    INPUT_REJECTED,
    INPUT_VALIDATED,
    LLM_ABANDONED,
    LLM_ATTEMPTED,
    LLM_COMPLETED,
    LLM_FAILED,
    MESSAGE_RECEIVED,
    QUESTION_ASKED,
    QUESTION_DECISIONS,
    RUN_COMPLETED,
    RUN_STARTED,
    TOOL_COMPLETED,
    TOOL_FAILED,
    TOOL_STARTED,
)
from .lineage import FORKED_FROM
from .meta import RunMeta
from .outcome import TIMEOUT, Outcome

#: What the world writes into a run: fed to the replay, never decided by it.
FED = frozenset(
    {
        RUN_STARTED,
        INPUT_VALIDATED,
        INPUT_REJECTED,
        LLM_ATTEMPTED,
        LLM_ABANDONED,
        LLM_COMPLETED,
        LLM_FAILED,
        TOOL_STARTED,
        TOOL_COMPLETED,
        TOOL_FAILED,
        APPROVAL_REQUESTED,
        *APPROVAL_DECISIONS,
        CHILD_COMPLETED,
        CANCEL_REQUESTED,
        MESSAGE_RECEIVED,
        CLOSE_REQUESTED,
        *QUESTION_DECISIONS,
    }
)


def is_fed(e: Event) -> bool:
    """Whether the replay feeds ``e`` rather than expects the code to decide it. A
    timeout is the clock's doing (a timer rang), like an approval's expiry; a tool's
    question is the tool's (the algorithm's own questions are decided). The result a
    run's end records for a call it cut off (``"cut_off": true``) is the engine's
    decision, made with the end."""
    if e.type == RUN_COMPLETED:
        return e.data.get("outcome") == TIMEOUT
    if e.type == QUESTION_ASKED:
        return "tool_request_id" in e.data
    return e.type in FED and not e.data.get("cut_off")


class ReplayBus:
    """Delivers appended events one at a time, only when :meth:`pump` is called: the
    replay decides when the world moves on. Timers never ring: the recorded timeouts
    and expiries are fed, so the engine holds none (``DurableTimers``)."""

    durable_timers = True

    def __init__(self) -> None:
        self.engine: EngineAPI | None = None
        self.queue: deque[Event] = deque()

    def bind(self, engine: EngineAPI) -> None:
        self.engine = engine

    async def publish(self, events: Iterable[Event]) -> None:
        self.queue.extend(events)

    def serial(self, key: str, *, contended: bool = False, synced: bool = False) -> asyncio.Lock:
        return asyncio.Lock()  # one delivery at a time already

    def spawn(self, coro: Work) -> None:
        coro.close()

    async def pump(self) -> None:
        assert self.engine is not None
        while self.queue:
            await self.engine.handle(self.queue.popleft())

    async def drain(self, timeout: float | None = None) -> None:
        await self.pump()

    async def close(self, *, cancel: bool = True) -> None:
        self.queue.clear()


class ReplayEngine(Engine):
    """An engine whose limits are judged at :attr:`clock` (the recorded time of the
    event being fed), not at today's time."""

    clock: float | None = None

    def limit_breach(self, meta: RunMeta, now: float | None = None) -> Outcome | None:
        return super().limit_breach(meta, self.clock if now is None else now)


class Decision(TypedDict):
    """A decided event as a replay compares it (:func:`decision`)."""

    type: str
    id: str
    data: dict[str, Any]


def decision(e: Event) -> Decision:
    """What is compared of a decided event: type, id and data (tracebacks dropped)."""
    return {"type": e.type, "id": e.id, "data": {k: v for k, v in e.data.items() if k != "traceback"}}


def _key(d: Decision) -> str:
    return json.dumps(d, sort_keys=True)


@dataclass
class Difference:
    """The first place where the current code decides otherwise than the recording.

    ``seq`` is the recorded decision's seq; for a decision the recording does not
    have, the seq of the recorded event it was made after (its cause)."""

    seq: int | None
    recorded: Decision | None
    replayed: Decision | None

    def describe(self) -> str:
        where = f"event {self.seq}" if self.seq is not None else "an event"
        if self.recorded is None:
            assert self.replayed is not None
            return (
                f"after {where} the code now decides {self.replayed['type']} "
                f"{self.replayed['id']}, which the recording does not have:\n"
                f"  + {_key(self.replayed)[:600]}"
            )
        if self.replayed is None:
            return (
                f"at {where} the recording has {self.recorded['type']} "
                f"{self.recorded['id']}, which the code no longer decides:\n"
                f"  - {_key(self.recorded)[:600]}"
            )
        lines = [f"at {where} the code decides {self.recorded['type']} {self.recorded['id']} with other data:"]
        old, new = self.recorded["data"], self.replayed["data"]
        for k in sorted(set(old) | set(new)):
            if old.get(k, ...) != new.get(k, ...):
                lines.append(f"  {k}: recorded {json.dumps(old.get(k), ensure_ascii=False)[:300]}")
                lines.append(f"  {' ' * len(k)}  now      {json.dumps(new.get(k), ensure_ascii=False)[:300]}")
        return "\n".join(lines)


@dataclass
class Replay:
    """The recorded decisions of a run and those the current code made."""

    run_id: str
    recorded: list[Decision]
    replayed: list[Decision]
    #: seq of each recorded decision, by id
    seqs: dict[str, int] = field(default_factory=dict)
    #: the recorded seq of what each replayed decision was made after, by id
    causes: dict[str, int | None] = field(default_factory=dict)

    @property
    def missing(self) -> list[Decision]:
        """Decisions in the recording that the current code did not make."""
        have = {_key(d) for d in self.replayed}
        return [d for d in self.recorded if _key(d) not in have]

    @property
    def extra(self) -> list[Decision]:
        """Decisions the current code made that the recording does not have."""
        have = {_key(d) for d in self.recorded}
        return [d for d in self.replayed if _key(d) not in have]

    @property
    def same(self) -> bool:
        return not self.missing and not self.extra and len(self.recorded) == len(self.replayed)

    def first_difference(self) -> Difference | None:
        """Where the decisions first part (None when they do not)."""
        if self.same:
            return None
        now = {d["id"]: d for d in self.replayed}
        first = None
        missing = self.missing
        if missing:
            d = min(missing, key=lambda d: self.seqs.get(d["id"], 0))
            first = Difference(self.seqs.get(d["id"]), d, now.get(d["id"]))
        recorded_ids = {d["id"] for d in self.recorded}
        new = [d for d in self.extra if d["id"] not in recorded_ids]
        if new:
            d = min(new, key=lambda d: self.causes.get(d["id"]) or 0)
            cause = self.causes.get(d["id"])
            if first is None or (cause is not None and first.seq is not None and cause < first.seq):
                first = Difference(cause, None, d)
        return first

    def explain(self) -> str:
        lines = [f"replaying {self.run_id}: the decisions differ from the recording"]
        first = self.first_difference()
        if first is not None:
            lines.append("first difference: " + first.describe())
        lines += [f"  - recorded, not made now: {_key(d)[:600]}" for d in self.missing]
        lines += [f"  + made now, not recorded: {_key(d)[:600]}" for d in self.extra]
        return "\n".join(lines)


async def replay(events: list[Event]) -> Replay:
    """Feed ``events`` (one run's log, hydrated) to the current code; compare decisions."""
    if not events or events[0].type != RUN_STARTED:
        raise ValueError("a run's log starts with aaa.run.started")
    run_id = events[0].stream
    mine = [e for e in events if e.stream == run_id]
    claimed = next((e for e in mine if is_claimed(e.data)), None)
    if claimed is not None:
        raise ValueError(
            f"event {claimed.seq} ({claimed.type}) is claim-checked: "
            "replay the log with its payloads (an export with its blobs)"
        )
    inherited = (events[0].data.get(FORKED_FROM) or {}).get("seq") or 0

    def fed(e: Event) -> bool:
        return is_fed(e) or (e.seq is not None and e.seq <= inherited)

    bus = ReplayBus()
    engine = ReplayEngine(store=InMemoryEventStore(), bus=bus, cache=FoldCache(), validate=False)
    try:
        for e in mine:
            if fed(e):
                engine.clock = e.time.timestamp()
                await engine.append([replace(e, seq=None)])
                await bus.pump()
        log = await engine.store.read(run_id)
    finally:
        await engine.close()
    recorded_seqs = {e.id: e.seq for e in mine if e.seq is not None}
    by_id = {e.id: e for e in log}
    fed_ids = {e.id for e in mine if fed(e)}
    return Replay(
        run_id,
        recorded=[decision(e) for e in mine if not fed(e)],
        replayed=[decision(e) for e in log if e.id not in fed_ids and not is_fed(e)],
        seqs={e.id: e.seq for e in mine if not fed(e) and e.seq is not None},
        causes={e.id: _cause_seq(e, by_id, recorded_seqs) for e in log if e.id not in fed_ids and not is_fed(e)},
    )


def _cause_seq(e: Event, by_id: dict[str, Event], recorded: dict[str, int]) -> int | None:
    """The recorded seq of the event a replayed decision follows from: its cause, or
    the cause of its cause (a decision made on a decision the recording lacks)."""
    cause, seen = e.causation, set()
    while cause is not None and cause not in seen:
        if cause in recorded:
            return recorded[cause]
        seen.add(cause)
        parent = by_id.get(cause)
        cause = parent.causation if parent is not None else None
    return None
