"""Replaying a golden log through the current code (Temporal's replay tests, for runs).

A golden log is one run's events as JSON lines, recorded with the fake model. The
replay builds an engine with no handlers on a fresh store, feeds it the recorded
events the algorithm does not decide (the run's start, input verdict, model and tool
results, approvals, child results, cancel requests) in recorded order, and lets the
current algorithm decide after each, exactly as the engine does live (its own events
are delivered to it too). What the algorithm and the engine decided (requests, child
runs, plans, FSM states, the completion) must equal the recording: same type, same
id, same data.

Normalised away: event times; seqs and causation (which delivery made a decision, and
where it lands among the results, depend on delivery timing: decisions are compared
as a set of type, id and data, ids being deterministic); tracebacks (they name files
on the recording machine). Recordings pass a fixed run id, so every id in them is
deterministic.
"""

from __future__ import annotations

import asyncio
import json
from collections import deque
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Iterable

import aaa_django.algos  # noqa: F401  (registers the built-in algorithms)
from aaa_django.events import Event, FoldCache, InMemoryEventStore
from aaa_django.events.event import utcnow
from aaa_django.runtime import Engine
from aaa_django.runtime import types as T

HERE = Path(__file__).resolve().parent

#: What the world writes into a run: fed to the replay, never decided by it.
FED = frozenset({
    T.RUN_STARTED,
    T.INPUT_VALIDATED,
    T.INPUT_REJECTED,
    T.LLM_COMPLETED,
    T.LLM_FAILED,
    T.TOOL_STARTED,
    T.TOOL_COMPLETED,
    T.TOOL_FAILED,
    T.APPROVAL_REQUESTED,
    *T.APPROVAL_DECISIONS,
    T.CHILD_COMPLETED,
    T.CANCEL_REQUESTED,
})


def path_of(name: str) -> Path:
    return HERE / f"{name}.jsonl"


def normalise(e: Event) -> dict[str, Any]:
    """An event as a golden line: no time, no traceback (machine-specific)."""
    d = e.to_dict()
    d.pop("time", None)
    d["data"] = {k: v for k, v in d["data"].items() if k != "traceback"}
    if not d["blobs"]:
        d.pop("blobs")
    return d


def dump(events: Iterable[Event]) -> str:
    return "".join(json.dumps(normalise(e), ensure_ascii=False, sort_keys=True) + "\n" for e in events)


def load(name: str) -> list[Event]:
    lines = path_of(name).read_text(encoding="utf-8").splitlines()
    return [Event.from_dict(json.loads(line)) for line in lines if line.strip()]


class ReplayBus:
    """Delivers appended events one at a time, only when :meth:`pump` is called: the
    replay decides when the world moves on. No timers (a recording has no deadline)."""

    def __init__(self) -> None:
        self.engine: Engine | None = None
        self.queue: deque[Event] = deque()
        self.errors: list[BaseException] = []

    def bind(self, engine: Engine) -> None:
        self.engine = engine

    async def publish(self, events: Iterable[Event]) -> None:
        self.queue.extend(events)

    def serial(self, key: str, *, contended: bool = False, synced: bool = False) -> asyncio.Lock:
        return asyncio.Lock()  # one delivery at a time already

    def spawn(self, coro: Any) -> None:
        coro.close()

    async def pump(self) -> None:
        assert self.engine is not None
        while self.queue:
            await self.engine.handle(self.queue.popleft())

    async def drain(self, timeout: float | None = None) -> None:
        await self.pump()

    async def close(self, *, cancel: bool = True) -> None:
        self.queue.clear()


@dataclass
class Replay:
    run_id: str
    recorded: list[dict[str, Any]]
    replayed: list[dict[str, Any]]

    @property
    def missing(self) -> list[dict[str, Any]]:
        """Decisions in the recording that the current code did not make."""
        have = {json.dumps(d, sort_keys=True) for d in self.replayed}
        return [d for d in self.recorded if json.dumps(d, sort_keys=True) not in have]

    @property
    def extra(self) -> list[dict[str, Any]]:
        """Decisions the current code made that the recording does not have."""
        have = {json.dumps(d, sort_keys=True) for d in self.recorded}
        return [d for d in self.replayed if json.dumps(d, sort_keys=True) not in have]

    @property
    def same(self) -> bool:
        return not self.missing and not self.extra and len(self.recorded) == len(self.replayed)

    def explain(self) -> str:
        lines = [f"replaying {self.run_id}: the decisions differ from the recording"]
        lines += [f"  - recorded, not made now: {json.dumps(d, sort_keys=True)[:600]}" for d in self.missing]
        lines += [f"  + made now, not recorded: {json.dumps(d, sort_keys=True)[:600]}" for d in self.extra]
        return "\n".join(lines)


def decision(e: Event) -> dict[str, Any]:
    """What is compared of a decided event: type, id and data (tracebacks dropped)."""
    return {"type": e.type, "id": e.id,
            "data": {k: v for k, v in e.data.items() if k != "traceback"}}


async def replay(events: list[Event]) -> Replay:
    """Feed ``events`` (one run's golden log) to the current code; compare decisions."""
    run_id = events[0].stream
    bus = ReplayBus()
    engine = Engine(store=InMemoryEventStore(), bus=bus, cache=FoldCache(), validate=False)
    try:
        for e in events:
            if e.stream == run_id and e.type in FED:
                await engine.append([replace(e, seq=None, time=utcnow())])
                await bus.pump()
        log = await engine.store.read(run_id)
    finally:
        await engine.close()
    return Replay(
        run_id,
        recorded=[decision(e) for e in events if e.stream == run_id and e.type not in FED],
        replayed=[decision(e) for e in log if e.type not in FED],
    )


def replay_file(name: str) -> Replay:
    return asyncio.run(replay(load(name)))
