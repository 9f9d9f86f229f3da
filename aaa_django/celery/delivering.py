"""The delivery of one stored event in a worker (:func:`deliver_event`).

A delivery is the engine's own (:meth:`Engine.handle <aaa_django.runtime.Engine.handle>`)
of the stored event the message names (:class:`~aaa_django.runtime.Stored`), with the
worker's hooks: the event read from this worker's view of the run, which the message
brings up to date when it carries the event that follows the view (or this process's
own tail, for a local delivery), else with one read; the run's step (serialised by
:meth:`DistributedBus.serial`, its appends guarded by the head of that view, run
again when the log moved on); then the handlers, only while this process holds the
run, a model or tool call handed off as it starts. Around it: the run's busy lease
for a call that runs longer than ``SLOW_DELIVERY`` (tool work) or ``SLOW_CALL`` (a
model call), held by a guard (:mod:`aaa_django.celery.slow`): the sweeper leaves the
run alone; a dead worker's lease expires and the sweeper re-drives the run; tool work
is cancelled when the run ends in another worker. After it: re-enqueueing what an
interrupted earlier delivery of the same event may have left unenqueued, and the
run's deadline or an approval's expiry already due when its event is delivered fired
at once (later ones are the duty's, :mod:`aaa_django.celery.duty`: no message waits
for a timer). The worker's loop that carries deliveries, and tries again one that
fails, is :class:`~aaa_django.celery.worker.WorkerRuntime`.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Callable

from aaa_django.events import Event
from aaa_django.events.tail import Tail
from aaa_django.runtime import Engine, Stored
from aaa_django.runtime.event_types import (
    APPROVAL_DECISIONS,
    APPROVAL_REQUESTED,
    LLM_REQUESTED,
    RUN_STARTED,
    TOOL_REQUESTED,
)
from aaa_django.site.holding import RunKeeper

from .engines import cluster_bus
from .slow import SLOW_STEP, Leases, guard_slow, lease_after

log = logging.getLogger("aaa_django.bus")

#: events that set a timer (a deadline, an approval's expiry)
TIMED = frozenset({RUN_STARTED, APPROVAL_REQUESTED})
#: events whose handlers wait (a model call, a tool call), and a run's start (its input's
#: validation): once the run's step is done their delivery is handed off, and its task
#: returns (the message is acknowledged) while the handlers go on on the worker's loop.
#: What makes that safe: the request is durable before the call starts, its result has
#: a deterministic id (a second one is absorbed), a call past SLOW_DELIVERY holds its
#: run's busy lease (renewed while held), and the sweeper re-drives a run that no live
#: process holds. (A run's start: held by its task, a burst of starts would go through
#: each pool slot one validation's commit at a time, 200 runs started at once 0.5-0.6 s
#: on -c 2; benchmarks/bench_concurrency.py --lags.)
HANDED_OFF = frozenset({RUN_STARTED, LLM_REQUESTED, TOOL_REQUESTED, *APPROVAL_DECISIONS})


async def deliver_event(
    engine: Engine,
    stream: str,
    seq: int,
    event_id: str,
    *,
    redelivered: bool = False,
    wire: str | None = None,
    handed: asyncio.Future | None = None,
    event: Event | None = None,
    leases: Leases | None = None,
) -> str:
    """Deliver one stored event to ``engine`` as a worker does; returns what happened
    (``"delivered"``, or ``"missing"`` when the log no longer holds that event).
    ``wire``: the event itself from the message (see :meth:`DistributedBus._args`).
    ``handed``: set once the step is done when the event is one whose handlers wait
    (:data:`HANDED_OFF`), before they start: from then on the message is not needed
    (see :meth:`WorkerRuntime.deliver`). ``event``: the event itself, when this
    process has just appended it (:meth:`WorkerRuntime.take`). ``leases``: where the
    run's busy lease, if the delivery takes one, is kept (a worker's
    :attr:`WorkerRuntime.leases`, which its shutdown releases)."""
    leases = leases if leases is not None else Leases()
    keeper = cluster_bus(engine).holder
    if keeper is not None and not await _hold(keeper, stream, local=event is not None):
        # Not this process's to deliver, nor to drop: whoever drives the run now gets
        # it through the broker (``take`` sends, not delivers, a fenced run's events).
        log.info(
            "run %s: seq %s sent to the broker, not delivered here: another process took the run while this one "
            "stood down",
            stream,
            seq,
        )
        assert event is not None  # (only a local delivery is refused: one by message claims the run)
        await engine.bus.publish([event])
        return "not held"

    def synced() -> bool:
        # (asked by the engine in the delivery's scope, before it reads the event)
        if event is not None and engine.tail.holds(event):
            return True
        # A first delivery whose message carries the event that follows this worker's
        # cached view of the run: the view is current without a query. Not after a
        # redelivery: the view may be old, and handlers would redo answered work.
        return not redelivered and wire is not None and _accept(engine.tail, stream, seq, event_id, wire)

    try:
        with engine.tail.delivery():  # (what follows the step reads the run from the tail)
            return await _deliver(engine, Stored(stream, seq, event_id), redelivered, synced, handed, leases)
    finally:
        engine.delivered(stream)


async def _hold(keeper: RunKeeper, stream: str, *, local: bool) -> bool:
    """Before a delivery of ``stream``: claim the run unless this process holds it (a
    delivery by message takes it from whoever holds it: it is this process's work
    now). False for a local delivery of a run another process adopted while this one
    stood down: not this process's to deliver. (Whether its handlers may call out is
    asked again after the step: :func:`_deliver`.)"""
    if stream in keeper.fenced:
        if local:
            return False
        await keeper.claim(stream)
    elif stream not in keeper.held:
        await keeper.claim(stream)
    return True


def _accept(tail: Tail, stream: str, seq: int, event_id: str, wire: str) -> bool:
    try:
        prev, data, *rest = json.loads(wire)
        event = Event.from_dict(data)
        # the events before it (a young run's message) matter only to a cache without the run
        new_to_us = rest and tail.cached(stream, 1) is None
        earlier = [Event.from_dict(d) for d in rest[0]] if new_to_us else []
    except (ValueError, TypeError, KeyError, AttributeError, IndexError):
        log.warning("a delivery of %s %s carried an unreadable event; reading it", stream, seq)
        return False
    if (event.id, event.stream, event.seq) != (event_id, stream, seq):
        return False
    return tail.accept(event, prev, earlier)


async def _deliver(
    engine: Engine,
    stored: Stored,
    redelivered: bool,
    synced: Callable[[], bool],
    handed: asyncio.Future | None,
    leases: Leases,
) -> str:
    """The engine's delivery of ``stored`` (:meth:`Engine.handle`), with the worker's
    hooks: ``loaded`` tells the slow-delivery guard which event it guards; after the
    step, the handlers run only while this process holds the run, and a model or tool
    call is handed off (``calling``) before they start."""
    bus = cluster_bus(engine)
    stream = stored.stream
    loop = asyncio.get_running_loop()
    loaded: asyncio.Future = loop.create_future()
    finished: asyncio.Future = loop.create_future()
    guard: list[asyncio.Future] = []

    def start_guard() -> None:
        guard.append(leases.guard(guard_slow(engine, bus.coordination(), stream, loaded, finished, leases.given_up)))

    def calling(event: Event) -> None:
        # The step is done and a model or tool call starts: hand it off, and hold the
        # run's lease if the call takes longer than SLOW_DELIVERY (tool work) or
        # SLOW_CALL (a model call).
        if handed is not None and not handed.done():
            handed.set_result(None)
        timers[0].cancel()
        if not guard:
            timers[0] = loop.call_later(lease_after(event, time.time()), start_guard)

    def dispatching(event: Event) -> bool:
        if not bus.holds(stream):
            # stood down (or the run was taken) since the delivery began: no call
            log.info(
                "run %s: the handlers of seq %s not run here: this process does not hold the run now (it is driven "
                "again after the next renewal of its leases)",
                stream,
                stored.seq,
            )
            return False
        if event.type in HANDED_OFF:
            calling(event)
        return True

    with bus.recording() as published:
        # Most steps end well before SLOW_STEP, most calls before SLOW_DELIVERY: a
        # timer starts the guard of the others, no task and no wait for the quick ones.
        timers = [loop.call_later(SLOW_STEP, start_guard)]
        try:
            event = await engine.handle(stored, synced=synced, loaded=loaded.set_result, dispatching=dispatching)
        finally:
            timers[0].cancel()
            if not loaded.done():  # (the delivery ended before its read: a cancellation)
                loaded.set_result(None)
            if not finished.done():
                finished.set_result(None)
            for g in guard:
                await g
        if event is None:
            return "missing"  # erased (or erased and written again): nothing to do
        # The step's read brought the tail's view of the run up to date, in the engine's
        # delivery scope, now closed: in this one, too, the run is read from the tail.
        engine.tail.holds(event)
        if event.type in TIMED:  # a due time already past (an expiry of 0 s): at once
            await engine.fire_due(stream)
        if redelivered:
            await _republish_caused(engine, event, published)
    return "delivered"


async def _republish_caused(engine: Engine, event: Event, published: set[str]) -> None:
    """After a redelivery: events this one caused that are stored but were appended by
    the earlier, interrupted delivery may never have been enqueued (it died between
    commit and enqueue). Publish them again; delivering twice is harmless."""
    caused = [e for e in await engine.read_after(event) if e.causation == event.id and e.id not in published]
    if caused:
        await engine.bus.publish(caused)
