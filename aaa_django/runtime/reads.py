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
import threading
import weakref
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import replace

from aaa_django.data import hydrate, is_claimed
from aaa_django.data.errors import BlobError
from aaa_django.events import Event, KnowsRunning

from . import bounded
from .event_types import RUN_STARTED
from .facade import Facade
from .outcome import Outcome
from .wakeups import RELIABLE_POLL, poll_intervals

#: seconds a wait's poll waits for the polls of other waits, to ask the store of them
#: all in one query (:class:`Polls`): a poll is a safety net, half a second apart at the
#: least; three thousand waits that poll one by one are three thousand reads
POLL_BATCH = 0.05


class Polls:
    """The polls of an engine's waits, asked of a store that says which of many runs
    still go (:class:`~aaa_django.events.KnowsRunning`) in one query for all the waits
    that poll within ``POLL_BATCH`` seconds: ``await polls.running(run_id)``. Only a
    run that no longer goes is then read (its end, or nothing: erased, never started).
    One batch a loop at a time (an engine's waits may run on several loops)."""

    def __init__(self, ask: Callable[[Sequence[str]], Awaitable[set[str]]], *, batch: float = POLL_BATCH) -> None:
        self.ask = ask
        self.batch = batch
        #: per loop, the polls waiting for the next query: run id -> their futures
        self._pending: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, dict[str, list[asyncio.Future[bool]]]] = (
            weakref.WeakKeyDictionary()
        )
        self._lock = threading.Lock()
        self._asking: set[asyncio.Task[None]] = set()
        #: queries made, and the polls they answered (tests, benchmarks)
        self.queries = 0
        self.answered = 0

    async def running(self, run_id: str) -> bool:
        """Does run ``run_id`` still go (started, not ended), as the store says within
        ``batch`` seconds? Raises what the store's query raised."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[bool] = loop.create_future()
        with self._lock:  # (each loop its own batch; the loops' threads share the map)
            pending = self._pending.get(loop)
            if pending is None:
                pending = self._pending[loop] = {}
                loop.call_later(self.batch, self._start, loop)
        pending.setdefault(run_id, []).append(future)
        return await future

    def _start(self, loop: asyncio.AbstractEventLoop) -> None:
        with self._lock:
            pending = self._pending.pop(loop, None)
        if pending:
            task = loop.create_task(self._answer(pending))
            self._asking.add(task)
            task.add_done_callback(self._asking.discard)

    async def _answer(self, pending: dict[str, list[asyncio.Future[bool]]]) -> None:
        self.queries += 1
        try:
            going = await self.ask(list(pending))
        except Exception as exc:  # every poll of the batch raises it (as its read would)
            for futures in pending.values():
                for f in futures:
                    if not f.done():
                        f.set_exception(exc)
            return
        for run_id, futures in pending.items():
            for f in futures:
                if not f.done():  # (a wait cancelled meanwhile is not answered)
                    self.answered += 1
                    f.set_result(run_id in going)


class Reads:
    """An engine's reads of its runs."""

    def __init__(self, engine: Facade) -> None:
        self.engine = engine
        base = engine.base_store
        #: the waits' polls, asked of the store in batches when it can say which runs
        #: still go (detected once, on the site's store); else each poll reads its run
        self.polls: Polls | None = Polls(base.running) if isinstance(base, KnowsRunning) else None

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
        ``POLL_BACKOFF`` times it (:func:`poll_intervals`): a thousand runs waited on
        at once must not read their logs a thousand times a second. On a store that
        says which runs still go (:class:`~aaa_django.events.KnowsRunning`: the
        site's database), a poll asks that, in one query with the other waits' polls
        of the next ``POLL_BATCH`` seconds (:class:`Polls`), and reads only a run that
        no longer goes; elsewhere a poll reads its run. A run this engine is driving (it holds its log, it
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
        polls = self.polls

        async def loop() -> Outcome:
            first = driving
            woken = True  # (the first look, and a look the hub woke, read the run at once)
            for interval in poll_intervals(engine.poll_interval):
                sub.clear()  # (before the read: what moves the run after it wakes us)
                if first:  # (the first poll then comes after poll_interval, whatever the hub)
                    first = False
                else:
                    # A poll asks first whether the run still goes, with the other waits'
                    # polls (one query), and reads only a run that does not.
                    if woken or polls is None or run_id in engine._completions or not await polls.running(run_id):
                        outcome = await engine.outcome(run_id)
                        if outcome is not None:
                            return outcome
                    if engine.wakeups.reliable():
                        interval = max(interval, RELIABLE_POLL)
                woken = await sub.until(interval)
            raise AssertionError("unreachable")  # (poll_intervals never ends)

        try:
            return await asyncio.wait_for(loop(), timeout)
        finally:
            sub.close()
