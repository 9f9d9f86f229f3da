"""The sweeper: fires the timers that have come due, and re-drives the runs that
nothing is working on any more.

**Due times** (a run's deadline, an approval's expiry) live in durable state, not in
held messages or a process's memory: the run index keeps each run's next due time
(``RunRecord.due_at``, kept by the store's appends; any store that offers
:class:`DueIndex`), and :func:`fire_due` asks it what has come due, lets the engine
record it (:meth:`Engine.fire_due`: the run ends ``timeout``, an approval is recorded
expired; deterministic ids, so firing twice records once) and moves the index on to
the run's next due time. A timer days away costs one row's column while it waits.
The workers' periodic duty (:mod:`aaa_django.celery.duty`) calls it every
``AAA["DUTY_EVERY"]`` seconds; every sweep calls it first.

A run is *stalled* when it has started and not completed, its newest event is older
than ``stall_after`` seconds, and no live worker holds a delivery lease on it (see
:meth:`aaa_django.celery.coordination.Coordinator.busy`). That is what is left behind when a
worker died between committing an event and enqueueing its delivery, when a broker
lost a message, or when a deadline's timer task was lost.

Re-driving is :meth:`Engine.resume`: the run's events are delivered again. Every
reaction is idempotent (deterministic ids), so this only does what was left undone:
a request without a result gets one, a past deadline ends the run ``timeout``, an
expired approval is recorded as expired.

A run the sweeper re-drove is left alone until the re-drive has had time to move it
(``stall_after`` after the first, the wait doubling while the run does not move, at
most ``8 * stall_after``): its messages may only be queued behind a backlog, and
re-driving it on every sweep would add to that backlog. The ledger of re-drives is
the run's index row (``RunRecord.redriven_at``, ``redrives``); see
:mod:`aaa_django.celery.redrives`.

A run that waits only for a person (its open tool calls are the ones its pending
approvals gate, no model call or child run is open) is not stalled: it is left alone,
however long it waits (the decision, or the approval's expiry, moves it on).

A run last held by a process of another *fleet* (a site, or a deployment, that shares
the database but not the queues: :func:`aaa_django.site.holding.fleet`) is neither
fired, adopted nor re-driven here: this fleet's workers may lack its agent, tools or
model (:func:`elsewhere`).

The workers' periodic duty sweeps every ``AAA["STALL_AFTER"] / 2`` seconds; by hand:
``python manage.py aaa_sweep``.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass, field
from typing import Protocol, TypedDict, runtime_checkable

from aaa_django.conf import aaa_settings
from aaa_django.events import EventStore
from aaa_django.runtime import RUNMETA, Bus, Engine, RunMeta
from aaa_django.runtime.event_types import RUN_COMPLETED, RUN_STARTED
from aaa_django.site.holding import RunKeeper, fleet_of

from .coordination import Coordinator
from .redrives import MemoryLedger, due_again, ledger_of

log = logging.getLogger("aaa_django.sweeper")

#: due runs fired per call of :func:`fire_due` (the rest on the next call)
FIRE_LIMIT = 500


@runtime_checkable
class DueIndex(Protocol):
    """A store that indexes its runs' next due times (``DjangoEventStore``: the run
    index's ``due_at``). A due time may be early (a decided approval's expiry that
    lingers), never late."""

    async def due(self, now: float, limit: int) -> list[tuple[str, int]]:
        """``(run id, seq)`` of the runs due by ``now``: ``seq`` is how far the index
        has folded the run's log."""
        ...

    async def settle_due(self, run_id: str, seq: int, due: float | None) -> bool:
        """Set the run's next due time unless its index moved past ``seq``."""
        ...


class SweepSummary(TypedDict):
    """A sweep's or a duty pass's :class:`SweepReport` as JSON (the tasks' result):
    how many runs of each kind, and the re-driven runs' ids."""

    unfinished: int
    active: int
    busy: int
    waiting: int
    recent: int
    redriven: int
    fired: int
    adopted: int
    elsewhere: int
    runs: list[str]


@dataclass
class SweepReport:
    """What one sweep saw and did."""

    #: unfinished runs looked at
    unfinished: int = 0
    #: unfinished runs with a recent event (someone is on them)
    active: list[str] = field(default_factory=list)
    #: idle runs that a live worker is still delivering to (a long tool call)
    busy: list[str] = field(default_factory=list)
    #: idle runs that wait only for a person's decision (left alone)
    waiting: list[str] = field(default_factory=list)
    #: idle runs re-driven lately, left to move (see :func:`~.redrives.due_again`)
    recent: list[str] = field(default_factory=list)
    #: runs re-driven (or that would be, in a dry run)
    redriven: list[str] = field(default_factory=list)
    #: runs whose due time had come: fired first (not in a dry run)
    fired: list[str] = field(default_factory=list)
    #: runs whose holder was gone (its lease lapsed, or it is known dead), adopted and
    #: re-driven (with a keeper, not in a dry run)
    adopted: list[str] = field(default_factory=list)
    #: idle runs held by a process of another fleet (with a keeper): another site's, or
    #: another deployment's, on the same database; never re-driven or fired here
    elsewhere: list[str] = field(default_factory=list)

    def summary(self) -> SweepSummary:
        return {
            "unfinished": self.unfinished,
            "active": len(self.active),
            "busy": len(self.busy),
            "waiting": len(self.waiting),
            "recent": len(self.recent),
            "redriven": len(self.redriven),
            "fired": len(self.fired),
            "adopted": len(self.adopted),
            "elsewhere": len(self.elsewhere),
            "runs": list(self.redriven),
        }

    def did_something(self) -> bool:
        """Did it fire, adopt or re-drive anything?"""
        return bool(self.fired or self.adopted or self.redriven)


async def fire_due(
    engine: Engine, *, now: float | None = None, limit: int = FIRE_LIMIT, keeper: RunKeeper | None = None
) -> list[str]:
    """Fire what has come due by ``now`` in ``engine``'s store: for each run whose due
    time has come, :meth:`Engine.fire_due`, then the index moves on to the run's next
    due time. Returns those runs. A store without a :class:`DueIndex` (memory, Redis)
    is asked for its unfinished runs and each run's ``RUNMETA`` instead (the sweeper's
    pace, not the duty's). With ``keeper``, the runs of another fleet are left to it
    (:func:`elsewhere`)."""
    now = time.time() if now is None else now
    store = engine.base_store
    if not isinstance(store, DueIndex):
        due = []
        runs = sorted(await unfinished_runs(store))
        others = await elsewhere(keeper, runs)
        for run_id in runs:
            if run_id in others:
                continue
            at = (await engine.meta(run_id)).due
            if at is not None and at <= now:
                due.append(run_id)
                await engine.fire_due(run_id, now=now)
        return due
    fired = []
    found = await store.due(now, limit)
    others = await elsewhere(keeper, [run_id for run_id, _ in found])
    for run_id, seq in found:
        if run_id in others:
            continue
        try:
            new = await engine.fire_due(run_id, now=now)
            # The index as of the log now: past what this firing appended (its append
            # folded the same events into the row), else as far as the row had folded.
            at = (await engine.meta(run_id)).due
            await store.settle_due(run_id, (new[-1].seq or seq) if new else seq, at)
        except Exception:  # one run's trouble must not hold up the others' timers
            log.exception("firing the due time of %s failed; the next look tries again", run_id)
            continue
        fired.append(run_id)
    return fired


async def elsewhere(keeper: RunKeeper | None, run_ids: list[str]) -> set[str]:
    """Those of ``run_ids`` held by a process of a fleet other than ``keeper``'s, their
    lease lapsed or not (none without a keeper). Two sites, or two deployments, that
    share a database but not their queues may not have the same agents, tools or
    models: a run is re-driven, adopted or fired only by the processes of its own
    fleet (:func:`aaa_django.site.holding.fleet`). A run nobody has held yet is
    anybody's."""
    if keeper is None or not run_ids:
        return set()
    held = await keeper.lease_of(run_ids)
    return {r for r, (holder, _) in held.items() if holder is not None and fleet_of(holder) != keeper.fleet}


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
    keeper: RunKeeper | None = None,
) -> SweepReport:
    """Fire what has come due (:func:`fire_due`), adopt the runs whose holder is gone
    (with ``keeper``: this process's leases, :func:`adopt`), then re-drive the stalled
    runs of ``engine``'s store (at most ``limit``, oldest first).

    ``stall_after`` defaults to ``AAA["STALL_AFTER"]``. With a bus that has no
    coordinator (the in-process bus) there are no busy leases to consult: with a
    ``keeper``, a run another live process holds is left alone (it is driven there),
    and a run is claimed before it is re-driven here.
    """
    stall_after = float(aaa_settings()["STALL_AFTER"] if stall_after is None else stall_after)
    now = time.time() if now is None else now
    report = SweepReport()
    if not dry_run:
        report.fired = await fire_due(engine, now=now, keeper=keeper)
        if keeper is not None:
            report.adopted = await adopt(engine, keeper)
    runs = await unfinished_runs(engine.base_store)
    report.unfinished = len(runs)
    coord = _coordinator_of(engine.bus)
    idle = []
    for run_id, last in sorted(runs.items(), key=lambda kv: kv[1]):
        if run_id in report.adopted:
            continue  # (re-driven just now)
        if now - last < stall_after:
            report.active.append(run_id)
        else:
            idle.append(run_id)
    others = await elsewhere(keeper, idle)
    if others:
        report.elsewhere = [r for r in idle if r in others]
        idle = [r for r in idle if r not in others]
    held_elsewhere = set()
    if keeper is not None and coord is None and idle:
        # On the in-process bus every run is driven where it is held: a run another
        # live process holds is working (a long call), not stalled.
        now_epoch = time.time()
        held_elsewhere = {
            r
            for r, (holder, until) in (await keeper.lease_of(idle)).items()
            if holder is not None and holder != keeper.id and until is not None and until > now_epoch
        }
    ledger = ledger_of(engine.base_store)
    if isinstance(ledger, MemoryLedger):
        ledger.keep(runs)
    seen = await ledger.seen(idle) if idle else {}
    for run_id in idle:
        if limit is not None and len(report.redriven) >= limit:
            break
        if not due_again(runs[run_id], seen.get(run_id), now, stall_after):
            report.recent.append(run_id)
            continue
        if coord is not None and await asyncio.to_thread(coord.is_busy, run_id):
            report.busy.append(run_id)
            continue
        if coord is None and run_id in held_elsewhere:  # driven by a live process here
            report.busy.append(run_id)
            continue
        if waits_for_a_person(await engine.meta(run_id)):
            report.waiting.append(run_id)
            continue
        # Recorded before the re-drive: a re-drive lost on its way (a publish that
        # failed, a broker that dropped it) is followed by another after the wait.
        if dry_run or await ledger.claim(run_id, seen.get(run_id), now):
            report.redriven.append(run_id)
        else:
            report.recent.append(run_id)  # another sweep re-drove it just now
    if keeper is not None and coord is None and report.redriven and not dry_run:
        # (in-process: a run another process takes meanwhile is its to drive; on the
        # Celery bus the delivery that takes the re-driven event claims it)
        report.redriven = [r for r in report.redriven if await keeper.claim(r, force=False)]
    if report.redriven and not dry_run:
        log.info(
            "re-driving %d stalled runs (%d re-driven lately left to move, %d busy): %s",
            len(report.redriven),
            len(report.recent),
            len(report.busy),
            " ".join(report.redriven[:20]) + (" ..." if len(report.redriven) > 20 else ""),
        )
        await engine.resume(report.redriven)
    return report


async def adopt(engine: Engine, keeper: RunKeeper) -> list[str]:
    """The unfinished runs whose holder is gone (known dead on this machine, or its lease
    lapsed), taken by ``keeper``'s process (each by one process) and re-driven here
    (:meth:`Engine.resume`); returns them."""
    taken = sorted(await keeper.adopt())
    if taken:
        resumed = await engine.resume(taken)
        log.info(
            "re-driving %d adopted runs: %s",
            len(resumed),
            " ".join(resumed[:20]) + (" ..." if len(resumed) > 20 else ""),
        )
    return taken


async def duty(engine: Engine, keeper: RunKeeper | None, *, sweeping: bool) -> SweepReport:
    """One turn of the workers' periodic duty: fire what has come due, adopt the runs
    whose holder is gone, and (``sweeping``) re-drive the stalled ones. Logs at INFO
    what it did, and nothing when it did nothing."""
    if sweeping:
        report = await sweep(engine, keeper=keeper)
    else:
        report = SweepReport(fired=await fire_due(engine, keeper=keeper))
        if keeper is not None:
            report.adopted = await adopt(engine, keeper)
    if report.fired:
        log.info(
            "fired the due times of %d runs: %s",
            len(report.fired),
            " ".join(report.fired[:20]) + (" ..." if len(report.fired) > 20 else ""),
        )
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


def waits_for_a_person(meta: RunMeta) -> bool:
    """Does the run wait only for people (approvals, a conversation's next message,
    questions)? Its open tool calls are the ones its pending approvals and questions
    hold, and no model call or child run is open: every step it could take follows a
    person's decision (or an expiry, which its timer records)."""
    held = len(meta.approvals) + sum(1 for q in meta.questions.values() if q.tool_request_id)
    return (
        (bool(meta.approvals) or meta.status == "waiting")
        and not meta.completed
        and meta.llm_open == 0
        and not meta.children
        and meta.tool_open <= held
    )
