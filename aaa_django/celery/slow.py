"""A slow delivery's guard: a worker's delivery that runs longer than a step or a
quick call takes its run's busy lease (the sweeper leaves the run alone; a dead
worker's lease expires and the sweeper re-drives the run) and, for tool work, cancels
the work when the run ends in another worker. Quick deliveries never touch Redis for
it: a timer starts the guard (:mod:`aaa_django.celery.worker`).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Coroutine
from typing import Any

from aaa_django.conf import aaa_settings
from aaa_django.events import Event
from aaa_django.runtime import Engine
from aaa_django.runtime.event_types import APPROVAL_DECISIONS, RUN_COMPLETED, TOOL_REQUESTED

from .coordination import Coordinator

#: deliveries that may run a tool: they listen for their run's end
TOOL_WORK = frozenset({TOOL_REQUESTED, *APPROVAL_DECISIONS})
#: tool work still running after this many seconds takes its run's busy lease and
#: starts listening for its run's end (a cancelled run's tool call is cancelled at once);
#: quicker ones never touch Redis for it
SLOW_DELIVERY = 0.05
#: a model call (or a start's validation) still running after this many seconds takes
#: its run's busy lease, or sooner: by a quarter of ``STALL_AFTER`` after its request was
#: written (:func:`lease_after`). Nothing listens for the run's end there, and the
#: sweeper needs the lease only once the run's newest event is ``STALL_AFTER`` old; a
#: call that answers within this never touches Redis for it. Taking and releasing a
#: lease after 50 ms, for every call, cost a tenth of the workers' CPU on
#: bench_concurrency's Celery row (200 x 3 x 1 s, alternating runs: 2.9-3.0 s -> 2.6 s,
#: 60 -> 50 KB a run; 1 s here was not enough: a 1 s call outlives a 1 s timer
#: started before it)
SLOW_CALL = 5.0
#: a run's step (no call) takes the lease after this many seconds (a step is quick; the
#: sweeper leaves a run alone for STALL_AFTER after its newest event anyway)
SLOW_STEP = 1.0


class Leases:
    """The busy leases a process's deliveries hold (their guards, :func:`guard_slow`),
    and the moment to give them up: a worker that shuts down with calls still in flight
    (:meth:`~aaa_django.celery.worker.WorkerRuntime.drain`) frees their runs at once, so
    the sweeper re-drives them without waiting for the leases to expire (``LEASE_TTL``).
    Used on the loop only."""

    def __init__(self) -> None:
        #: set when the holder gives its leases up: a guard then releases its lease
        self.given_up = asyncio.Event()
        #: the guards now running (each holds, or is taking, one run's lease)
        self.guards: set[asyncio.Task[object]] = set()

    def guard(self, coro: Coroutine[Any, Any, object]) -> asyncio.Task[object]:
        task = asyncio.ensure_future(coro)
        self.guards.add(task)
        task.add_done_callback(self.guards.discard)
        return task

    async def give_up(self, timeout: float = 5) -> int:
        """Release every lease held (the calls go on); returns how many guards were
        running. Waits (up to ``timeout``) until Redis has them back."""
        self.given_up.set()
        guards = set(self.guards)
        if guards:
            await asyncio.wait(guards, timeout=timeout)
        return len(guards)


def lease_after(event: Event, now: float) -> float:
    """Seconds after its call starts that a delivery of ``event`` takes its run's busy
    lease: tool work after SLOW_DELIVERY; a model call after SLOW_CALL, or sooner so
    that it holds the lease by a quarter of ``STALL_AFTER`` after the request was
    written (a delivery that started late, behind a backlog), never sooner than
    SLOW_DELIVERY. The sweeper counts a run's idle time from its newest event, which is
    no older than the request: the lease is always there before the run could look
    stalled."""
    if event.type in TOOL_WORK:
        return SLOW_DELIVERY
    by = event.time.timestamp() + float(aaa_settings()["STALL_AFTER"]) / 4 - now
    return max(SLOW_DELIVERY, min(SLOW_CALL, by))


async def guard_slow(
    engine: Engine,
    coord: Coordinator,
    stream: str,
    loaded: asyncio.Future,
    work: asyncio.Future,
    given_up: asyncio.Event,
) -> None:
    """A long delivery: hold a busy lease (the sweeper leaves the run alone) and, for
    tool work, cancel it when the run ends in another worker. ``coord``: the cluster's
    coordinator; ``loaded``: the event once read; ``work``: done when the delivery is;
    ``given_up``: set when the worker shuts down with the delivery still in flight
    (the lease is released, the work goes on until the process ends)."""
    if given_up.is_set():
        return
    watcher = None
    release = asyncio.ensure_future(given_up.wait())
    try:
        async with coord.busy(stream):
            await asyncio.wait({loaded, work, release}, return_when=asyncio.FIRST_COMPLETED)
            event = loaded.result() if loaded.done() else None
            if event is not None and event.type in TOOL_WORK and not work.done() and not release.done():
                watcher = asyncio.ensure_future(cancel_on_end(engine, coord, stream))
            await asyncio.wait({work, release}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        release.cancel()
        if watcher is not None:
            watcher.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await watcher


async def cancel_on_end(engine: Engine, coord: Coordinator, run_id: str) -> None:
    """Wait for the run's end (another worker may append it), then give the handlers
    the end: a tool call of an ended run is cancelled."""
    stale = engine.tail.stale

    async def ended() -> bool:
        stale(run_id)  # this delivery's cached view of the run would not see the end
        return (await engine.meta(run_id, fresh=True)).completed

    await coord.wait_ended(run_id, ended)
    stale(run_id)
    meta = await engine.meta(run_id, fresh=True)
    if not meta.completed:
        return
    found = await engine.store.read(run_id, after=(meta.completion_seq or 1) - 1, limit=1)
    if found and found[0].type == RUN_COMPLETED:
        # The handlers' reaction to the end (ToolHandler cancels this run's calls).
        await engine.dispatch(await engine.hydrate(found[0]))
