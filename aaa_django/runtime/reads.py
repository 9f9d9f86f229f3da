"""Reads: what the engine and its parts read of a run besides ``RUNMETA``.

A run's ``aaa.run.started`` (hydrated, kept: it never changes), an event's payload
back from the blob store (kept a while: a delivery and its handlers hydrate the same
event), the events after one (whether a request was answered already), whether a run
is over for a handler's purposes, a run's outcome, and the wait for its end
(:meth:`Reads.wait`: woken by the engine's hub, polling with backoff for an end no one
announces).
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from dataclasses import replace

from aaa_django.data import hydrate, is_claimed
from aaa_django.data.errors import BlobError
from aaa_django.events import Event

from . import bounded
from .event_types import RUN_STARTED
from .facade import Facade
from .outcome import Outcome
from .wakeups import RELIABLE_POLL, poll_intervals


class Reads:
    """An engine's reads of its runs."""

    def __init__(self, engine: Facade) -> None:
        self.engine = engine

    async def started(self, run_id: str) -> Event | None:
        """The run's hydrated ``aaa.run.started`` (immutable, so cached)."""
        engine = self.engine
        e = engine._started.get(run_id)
        if e is None:
            first = await engine.store.read(run_id, limit=1)
            if not first or first[0].type != RUN_STARTED:
                return None
            e = await engine.hydrate(first[0])
            bounded.keep(engine._started, run_id, e, bounded.STARTED_KEPT)
        return e

    async def hydrate(self, event: Event) -> Event:
        """The event with its claim-checked payload restored (a no-op for others)."""
        if not is_claimed(event.data):
            return event
        engine = self.engine
        cached = engine._hydrated.get(event.id)
        if cached is not None and cached.seq == event.seq:
            return cached
        if engine.blobs is None or not event.blobs:
            raise BlobError(f"event {event.id} is claim-checked but the engine has no blob store")
        data = await engine._blob_call(hydrate, event.data, event.blobs[-1], store=engine.blobs)
        full = replace(event, data=data)
        bounded.keep(engine._hydrated, event.id, full, bounded.HYDRATED_KEPT)
        return full

    async def find_after(self, event: Event, ids: Iterable[str], *, page: int = 64) -> dict[str, Event]:
        """Which of ``ids`` are in the event's stream after it (raw), by id
        (:meth:`Engine.find_after <aaa_django.runtime.Engine.find_after>`).

        Reads page by page and stops once all are found: a result usually follows its
        request closely, so checking "answered already?" stays cheap in a long log.
        """
        want = set(ids)
        found: dict[str, Event] = {}
        after = event.seq or 0
        while want:
            batch = await self.engine.store.read(event.stream, after=after, limit=page)
            for e in batch:
                if e.id in want:
                    found[e.id] = e
                    want.discard(e.id)
            if len(batch) < page:
                break
            after = batch[-1].seq or after + len(batch)
        return found

    async def outcome(self, run_id: str) -> Outcome | None:
        """The run's outcome if it has ended, else None."""
        e = await self.engine._children.completion_event(run_id)
        return Outcome.from_dict(e.data) if e is not None else None

    async def wait(self, run_id: str, *, timeout: float | None = None) -> Outcome:
        """Wait for a run to end (:meth:`Engine.wait <aaa_django.runtime.Engine.wait>`).
        The wait is a subscription to the run on the engine's ``wakeups``, woken at
        once when this engine ends the run, when a bus that hears of other processes'
        ends does (:class:`~.bus.WatchesEnds`), and on the
        site's PostgreSQL when any process ends it (not at each append: the
        subscription is ``ends_only``); it reads the run's end when woken (an end this
        engine appended it has, without a read), and polls for an end no one
        announces, first after ``poll_interval``, then at intervals doubling up to
        ``POLL_BACKOFF`` times it (:func:`poll_intervals`): a poll is a read of the
        run, and a thousand runs waited on at once must not read their logs a
        thousand times a second. A run this engine is driving (it holds its log, it
        has not ended it) is not read when the wait begins: its end wakes the wait,
        and the first poll, ``poll_interval`` later (even while the hub hears
        everything: an end another process appended before the wait began woke
        nobody), reads it. While the hub hears every process's changes
        (``wakeups.reliable()``: the site's PostgreSQL listening), a poll is only a
        safety net, at least ``RELIABLE_POLL`` apart."""
        engine = self.engine
        if engine._watch_ends is not None:
            engine._watch_ends()
        # (ends_only: on PostgreSQL, the run's appends before its end wake no read)
        sub = engine.wakeups.subscribe(run_id, asyncio.get_running_loop(), ends_only=True)

        # A run whose log this engine holds, and whose end it has not appended, is one
        # it is driving: its end wakes the wait, so the first look reads nothing (a
        # read racing the run's own appends, on a store of one writer, delays them).
        driving = run_id not in engine._completions and engine.tail.held(run_id) is not None

        async def loop() -> Outcome:
            first = driving
            for interval in poll_intervals(engine.poll_interval):
                sub.clear()  # (before the read: what moves the run after it wakes us)
                if first:  # (the first poll then comes after poll_interval, whatever the hub)
                    first = False
                else:
                    outcome = await engine.outcome(run_id)
                    if outcome is not None:
                        return outcome
                    if engine.wakeups.reliable():
                        interval = max(interval, RELIABLE_POLL)
                await sub.until(interval)
            raise AssertionError("unreachable")  # (poll_intervals never ends)

        try:
            return await asyncio.wait_for(loop(), timeout)
        finally:
            sub.close()
