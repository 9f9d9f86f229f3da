"""The sweeper: finds runs that nothing is working on any more and re-drives them.

A run is *stalled* when it has started and not completed, its newest event is older
than ``stall_after`` seconds, and no live worker holds a delivery lease on it (see
:meth:`aaa_django.celery.coordination.Coordinator.busy`). That is what is left behind when a
worker died between committing an event and enqueueing its delivery, when a broker
lost a message, or when a deadline's timer task was lost.

Re-driving is :meth:`Engine.resume`: the run's events are delivered again. Every
reaction is idempotent (deterministic ids), so this only does what was left undone:
a request without a result gets one, a past deadline ends the run ``timeout``, an
expired approval is recorded as expired.

Run it from Celery beat (task ``aaa.sweep``, see :data:`BEAT_SCHEDULE`) or
with ``python manage.py aaa_sweep``.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from aaa_django.conf import aaa_settings
from aaa_django.events import EventStore
from aaa_django.runtime import RUNMETA, Bus, Engine
from aaa_django.runtime.event_types import RUN_COMPLETED, RUN_STARTED

from .coordination import Coordinator

#: what a site puts in CELERY_BEAT_SCHEDULE to run the sweeper every 30 s, on the
#: algorithms queue (rename it here too if you renamed that queue)
BEAT_SCHEDULE = {
    "aaa-sweep": {"task": "aaa.sweep", "schedule": 30.0, "options": {"queue": "aaa.algorithms"}},
}


@dataclass
class SweepReport:
    """What one sweep saw and did."""

    #: unfinished runs looked at
    unfinished: int = 0
    #: unfinished runs with a recent event (someone is on them)
    active: list[str] = field(default_factory=list)
    #: idle runs that a live worker is still delivering to (a long tool call)
    busy: list[str] = field(default_factory=list)
    #: runs re-driven (or that would be, in a dry run)
    redriven: list[str] = field(default_factory=list)

    def summary(self) -> dict[str, Any]:
        return {"unfinished": self.unfinished, "active": len(self.active), "busy": len(self.busy),
                "redriven": len(self.redriven), "runs": list(self.redriven)}


async def unfinished_runs(store: EventStore) -> dict[str, float]:
    """Run id -> the time (epoch seconds) of its newest event, for every run that has
    started and not completed."""
    if isinstance(store, FindsUnfinished):  # a store that can ask in one query
        return await store.unfinished()
    out: dict[str, float] = {}
    for stream in await store.streams():
        first = await store.read(stream, limit=1)
        if not first or first[0].type != RUN_STARTED:
            continue
        head = await store.head(stream)
        last = (await store.read(stream, after=head[0] - 1, limit=1))[0] if head else first[0]
        if last.type == RUN_COMPLETED or await _completed(store, stream):
            continue
        out[stream] = last.time.timestamp()
    return out


async def _completed(store: EventStore, stream: str) -> bool:
    return (await RUNMETA.load(store, stream)).completed


async def sweep(
    engine: Engine,
    *,
    stall_after: float | None = None,
    now: float | None = None,
    dry_run: bool = False,
    limit: int | None = 1000,
) -> SweepReport:
    """Re-drive the stalled runs of ``engine``'s store (at most ``limit``, oldest first).

    ``stall_after`` defaults to ``AAA["STALL_AFTER"]``. With a bus that has no
    coordinator (the in-process bus) there are no leases to consult.
    """
    stall_after = float(aaa_settings()["STALL_AFTER"] if stall_after is None else stall_after)
    now = time.time() if now is None else now
    report = SweepReport()
    runs = await unfinished_runs(engine.store)
    report.unfinished = len(runs)
    coord = _coordinator_of(engine.bus)
    idle = []
    for run_id, last in sorted(runs.items(), key=lambda kv: kv[1]):
        if now - last < stall_after:
            report.active.append(run_id)
        else:
            idle.append(run_id)
    for run_id in idle:
        if limit is not None and len(report.redriven) >= limit:
            break
        if coord is not None and await asyncio.to_thread(coord.is_busy, run_id):
            report.busy.append(run_id)
            continue
        report.redriven.append(run_id)
    if report.redriven and not dry_run:
        await engine.resume(report.redriven)
    return report


@runtime_checkable
class FindsUnfinished(Protocol):
    """A store that finds the unfinished runs in one query (``DjangoEventStore``)."""

    async def unfinished(self) -> dict[str, float]:
        """Run id -> the time (epoch seconds) of its newest event, for every run
        started and not completed."""
        ...


@runtime_checkable
class Coordinated(Protocol):
    """A bus whose deliveries hold leases in the cluster (the Celery bus)."""

    def coordination(self) -> Coordinator: ...


def _coordinator_of(bus: Bus) -> Coordinator | None:
    return bus.coordination() if isinstance(bus, Coordinated) else None
