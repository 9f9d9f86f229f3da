"""``TailCachedStore``: the engine's cache of the streams it delivers events of.

One delivery makes several reads of its run's stream (the engine's view of the run,
the algorithm's projection, the handler's "is it answered already?"), each a query
and a thread hop. Streams only ever grow at the end, and an event never changes, so a
process can keep the events it has read or appended and ask the database only for
what is new: one query per *sync* instead of one per read, and none for what this
process has just appended. Every engine reads through one (``Engine`` wraps its store
in one unless given one), on the in-process bus and in a Celery worker alike.

**Bound**: the logs of at most ``max_streams`` streams (least recently used dropped;
the engine drops a run's log when the run ends), each held whole while it is kept.

When is the cached tail current enough? Outside a delivery, never: every read catches
up first (one query for what is new), so the store behaves as any EventStore (it
passes the contract suite). Inside :meth:`TailCachedStore.delivery` a stream is
synced on its first read and stays synced while this delivery appends to it, until
the bus marks it stale (when a run's step begins, see
:class:`aaa_django.celery.bus.DistributedBus`). Reads outside a step (handlers) may miss an
event another worker appended meanwhile; they only decide whether work is still
needed, and the work's result has a deterministic id, so a second result is absorbed.

**The step's guard** (:meth:`TailCachedStore.guard`): while a run's step runs, every
append to the run's stream is conditional on the log's head being the cached one
(``expected_seq``): the step decided from exactly that log, so a decision is stored
only if nothing was appended since the step read it. When something was, the append
raises :class:`~aaa_django.events.ConcurrencyError`, stores nothing, and the bus runs
the step again from the log as it is now (an optimistic check on the stream head:
two workers' steps of one run may overlap, but never both decide from the same log).

**Staged events** (:meth:`TailCachedStore.staging`): within, in this context only, reads
of a stream see events not yet appended after its log (numbered after it), as a view
that says it is not committed (an :class:`~aaa_django.events.EventList` with
``committed = False``: no fold of it is shared), and no snapshot is saved. The engine steps a
run on a handler's result this way before appending the result and the step's output
together (``Engine.answer``); other contexts never see them.

The cache checks that its tail is a prefix of the log (the id at its last seq), so an
erased and rewritten stream is read again from the start. Reads of one stream overlap
(a worker carries hundreds of deliveries, several of one run) while this process appends
to it: a sync extends the tail it holds even when those appends grew it meanwhile, and
never keeps the older of two views of one log, so an event this process appended stays
held once the tail has it (a delivery told it holds its event found it missing, and its
run waited for the sweeper: found by benchmarks/field_trial.py).
"""

from __future__ import annotations

import contextlib
import contextvars
from collections import OrderedDict
from collections.abc import Sequence
from typing import Protocol, runtime_checkable

from .cache import Publication
from .errors import ConcurrencyError
from .event import Event
from .store import (
    EventList,
    EventStore,
    LearnsAppends,
    ReadsFromSnapshot,
    RecentAppends,
    RecentIds,
    Snapshot,
)

#: a synced log shorter than this is folded from its start, no snapshot asked for
SHORT_LOG = 64

#: the streams synced in the current delivery (None: not in a delivery)
_synced: contextvars.ContextVar[set[str] | None] = contextvars.ContextVar("aaa_synced", default=None)


class _Guard:
    """The stream of the step running in this context (see :meth:`TailCachedStore.guard`);
    within (a context manager): the step's appends to it are guarded. Closed on exit,
    also for tasks the step started."""

    __slots__ = ("stream", "open", "_token")

    def __init__(self, stream: str) -> None:
        self.stream = stream
        self.open = True

    def __enter__(self) -> None:
        self._token = _guarded.set(self)

    def __exit__(self, *exc: object) -> None:
        self.open = False
        _guarded.reset(self._token)


_guarded: contextvars.ContextVar[_Guard | None] = contextvars.ContextVar("aaa_guarded", default=None)

#: the staged events this context's reads see (see :meth:`TailCachedStore.staging`)
_staged: contextvars.ContextVar[Staged | None] = contextvars.ContextVar("aaa_staged", default=None)


class Staged:
    """Events staged after a stream's held log, seen by one context's reads
    (:meth:`TailCachedStore.staging`), and what reads of them would have kept: the
    folds to publish (``(cache, key, entry)``, left by projections through
    ``EventList.pending``) and the snapshots to save, once the events are appended as
    they were read."""

    __slots__ = ("stream", "events", "folds", "snapshots", "_token")

    def __init__(self, stream: str, events: Sequence[Event]) -> None:
        self.stream, self.events = stream, events
        self.folds: list[Publication] = []
        self.snapshots: list[Snapshot] = []

    def __enter__(self) -> Staged:
        synced = _synced.get()
        if synced is not None:
            synced.add(self.stream)
        self._token = _staged.set(self)
        return self

    def __exit__(self, *exc: object) -> None:
        _staged.reset(self._token)


class _Delivery:
    """Within: a delivery (see :meth:`TailCachedStore.delivery`). (A class, not a
    generator: entered once per delivery, in a third of the time.)"""

    __slots__ = ("_synced", "_guarded")

    def __enter__(self) -> None:
        self._synced = _synced.set(set())
        self._guarded = _guarded.set(None)

    def __exit__(self, *exc: object) -> None:
        _guarded.reset(self._guarded)
        _synced.reset(self._synced)


@runtime_checkable
class Tail(EventStore, Protocol):
    """What the engine asks of a store that keeps the tails of the streams it serves
    (detected once, where the engine is built): a delivery's scope, in which a synced
    stream is read from memory; the step's guard; what it holds already; and the
    store it keeps them of (``inner``: what that store offers beyond the EventStore
    protocol is found there; a tail forwards nothing it does not declare)."""

    inner: EventStore

    def delivery(self) -> contextlib.AbstractContextManager[None]: ...

    def stale(self, stream: str) -> None: ...

    def guard(self, stream: str) -> contextlib.AbstractContextManager[None]: ...

    def holds(self, event: Event) -> bool: ...

    def forget(self, stream: str) -> None: ...

    def accept(self, event: Event, prev_id: str | None, earlier: Sequence[Event] = ()) -> bool: ...

    def cached(self, stream: str, seq: int) -> Event | None: ...

    def fresh(self, event_id: str) -> bool: ...

    def held(self, stream: str) -> int | None: ...

    def staging(self, stream: str, events: Sequence[Event]) -> contextlib.AbstractContextManager[Staged]: ...


#: streams whose logs an engine keeps by default (see the module docstring): the runs
#: in flight one process carries (``aaa_django.runtime.bounded.RUNS_KEPT``). Below the
#: runs in flight, a least-recently-used bound drops exactly the logs needed next: the
#: runs that have waited longest on their models are the next to have their replies
#: (at 3,000 runs in flight under a bound of 2,048, the turns of the runs whose logs
#: were dropped each read their whole log again: bench_concurrency.py, profiled)
MAX_STREAMS = 16_384


class TailCachedStore:
    """Wraps an EventStore; the same log (``cache_key``), fewer queries."""

    def __init__(self, inner: EventStore, *, max_streams: int = MAX_STREAMS) -> None:
        self.inner = inner
        self.cache_key = inner.cache_key
        self.max_streams = max_streams
        self._logs: OrderedDict[str, list[Event]] = OrderedDict()
        #: stream -> (name, version) -> the snapshot this store saved last (for the
        #: streams whose logs it keeps)
        self._snapshots: dict[str, dict[tuple[str, int], Snapshot]] = {}
        #: ids of events this store appended, until the bus publishes them (newest last)
        #: (a store that keeps its own, as DjangoEventStore does, answers ``fresh``)
        self._recent: RecentAppends | None = inner if isinstance(inner, RecentAppends) else None
        self._fresh = None if self._recent is not None else RecentIds()
        #: the inner store, when it learns what a delivery's message carried
        self._learner: LearnsAppends | None = inner if isinstance(inner, LearnsAppends) else None
        #: the inner store, when it reads a snapshot and the log after it at once
        self._from_snapshot: ReadsFromSnapshot | None = inner if isinstance(inner, ReadsFromSnapshot) else None
        #: queries made to catch up, and reads served without one
        self.syncs = 0
        self.hits = 0

    def __repr__(self) -> str:
        return f"TailCachedStore({self.inner!r})"

    @staticmethod
    def delivery() -> contextlib.AbstractContextManager[None]:
        """Within: reads of a synced stream are served from memory. A delivery never
        inherits the guard of the step that published its event (in-process, a
        delivery's task starts inside that step's context)."""
        return _Delivery()

    @staticmethod
    def stale(stream: str) -> None:
        """The next read of ``stream`` (in this delivery) catches up first."""
        synced = _synced.get()
        if synced is not None:
            synced.discard(stream)

    @staticmethod
    def guard(stream: str) -> contextlib.AbstractContextManager[None]:
        """Within: appends to ``stream`` expect the head this delivery has read (a step
        of ``stream``'s run). Closed on exit, also for tasks the step started."""
        return _Guard(stream)

    def _expected(self, stream: str) -> int | None:
        """The head a guarded append of ``stream`` must find, or None (unguarded)."""
        guard = _guarded.get()
        if guard is None or not guard.open or guard.stream != stream:
            return None
        synced = _synced.get()
        log = self._logs.get(stream)
        if log is None or synced is None or stream not in synced:
            return None  # the step read nothing of it: it decided from nothing in it
        return len(log)

    def accept(self, event: Event, prev_id: str | None, earlier: Sequence[Event] = ()) -> bool:
        """Take ``event``, just committed by someone else (its first delivery's message
        carries it), as current news of its stream. The cache either holds it already
        (it appended it itself), or holds the events before it, the last one being
        ``prev_id`` (the same prefix check as a sync): then it is appended. Either way
        the stream counts as synced in this delivery, without a query: the step's
        appends are guarded by this view's head, so a view that missed a later event
        costs a retry, never a decision. False: the cache cannot tell (read instead).

        ``earlier``: the events before it, all of them (a young run's message carries
        them): a cache that holds none of the run takes them as its log."""
        stream, seq = event.stream, event.seq or 0
        log = self._logs.get(stream)
        if log is not None and 0 < seq <= len(log):
            if log[seq - 1].id != event.id:
                return False
        else:
            if not log and (seq == 1 or (earlier and _whole(earlier, seq, prev_id))):
                new = [*earlier, event] if seq > 1 else [event]
                log = self._logs[stream] = new
            elif log is not None and seq == len(log) + 1 and log[-1].id == prev_id:
                new = [event]
                log.append(event)
            else:
                return False
            if self._learner is not None:
                self._learner.observe(new)  # (the store's hint of the run's head and row follows them)
        self._logs.move_to_end(stream)
        self._trim()
        synced = _synced.get()
        if synced is not None:
            synced.add(stream)
        return True

    def holds(self, event: Event) -> bool:
        """Does the cache hold ``event`` at its seq (this process appended or read it)?
        Then, in this delivery, the stream counts as synced: the cache is the log as
        this process wrote it, and the step's guard catches any later write of
        another process (its append raises, and the step runs again from a sync)."""
        log = self._logs.get(event.stream)
        seq = event.seq or 0
        if log is None or not 0 < seq <= len(log) or log[seq - 1].id != event.id:
            return False
        synced = _synced.get()
        if synced is not None:
            synced.add(event.stream)
        self._logs.move_to_end(event.stream)
        return True

    def held(self, stream: str) -> int | None:
        """How many events of ``stream`` the cache holds (a prefix of its log: what this
        process appended or read), or None when it holds none of it."""
        log = self._logs.get(stream)
        return len(log) if log else None

    @staticmethod
    def staging(stream: str, events: Sequence[Event]) -> contextlib.AbstractContextManager[Staged]:
        """Within (this context and the tasks it starts): reads of ``stream`` see
        ``events`` (numbered on from the held log: ``seq`` = :meth:`held` + 1, ...)
        after the held log, which counts as synced without a read, as a view that is
        not committed. For a step on events about to be appended with its output; the
        caller appends them after, guarded by the held head, and then publishes the
        :class:`Staged` folds and saves its snapshots (a snapshot saved within is
        kept there, not written)."""
        return Staged(stream, events)

    def forget(self, stream: str) -> None:
        """Drop ``stream``'s log (its run ended): the next read of it reads it whole;
        and the store's hint of it, if it keeps one (:class:`LearnsAppends`)."""
        self._drop(stream)
        self.stale(stream)
        if self._learner is not None:
            self._learner.forget_hint(stream)

    def fresh(self, event_id: str) -> bool:
        """Was ``event_id`` appended by this store just now, and not asked about yet?
        (The bus sends such an event along with its delivery; a re-drive of an old
        event must not, as its receiver could not tell it from news.)"""
        if self._recent is not None:
            return self._recent.fresh(event_id)
        assert self._fresh is not None
        return self._fresh.pop(event_id)

    def cached(self, stream: str, seq: int) -> Event | None:
        """The event at ``seq`` if this process holds it already (events never change)."""
        log = self._logs.get(stream)
        return log[seq - 1] if log is not None and 0 < seq <= len(log) else None

    async def _log(self, stream: str) -> list[Event]:
        log = self._logs.get(stream)
        synced = _synced.get()
        if log is not None and synced is not None and stream in synced:
            self.hits += 1
            self._logs.move_to_end(stream)
            return log
        self.syncs += 1
        held = log
        if held:
            n = len(held)
            more = await self.inner.read(stream, after=n - 1)
            # (the held list may have grown meanwhile: this process's appends extend it)
            if more and more[0].id == held[n - 1].id and more[0].seq == n and _extend(held, more, n):
                log = held
            else:  # erased (and perhaps written again): start over
                log = list(await self.inner.read(stream))
        else:
            log = list(await self.inner.read(stream))
        current = self._logs.get(stream)
        if current is None and held is not None and synced is None:
            # Outside a delivery (a background self-check), the stream was dropped while
            # it was read (its run ended, it was erased): what was read is returned, not
            # kept, or every run whose end overtook a check would stay here until the
            # LRU bound pushed it out. (In a delivery it is kept: the step's guard
            # expects the head of the view it read.)
            return log
        if current is not None and current is not log:
            # Another read of the stream installed its view while this one waited, and
            # this process's appends may have extended that one since: what this read
            # saw can be older. Never keep the older of two views of one log (the events
            # this process appended, and told its deliveries it holds, would go).
            log = _newest(current, log)
        self._logs[stream] = log
        self._logs.move_to_end(stream)
        if synced is not None:
            synced.add(stream)
        self._trim()
        return log

    async def read(
        self, stream: str, *, after: int = 0, limit: int | None = None, tenant: str | None = None
    ) -> list[Event]:
        if tenant is not None or (_synced.get() is None and stream not in self._logs):
            # (outside a delivery, a stream this engine does not hold, e.g. an ended
            # run's: read through, and keep nothing of it)
            return await self.inner.read(stream, after=after, limit=limit, tenant=tenant)
        log = await self._log(stream)
        start = max(after, 0)
        staged = _staged.get()
        if staged is not None and staged.stream == stream:
            return _with_staged(log, staged, start, limit)
        return log[start:] if limit is None else log[start : start + max(limit, 0)]

    async def append(self, events: Sequence[Event], *, expected_seq: int | None = None) -> list[Event]:
        if expected_seq is None and events:
            expected_seq = self._expected(events[0].stream)
        try:
            stored = await self.inner.append(events, expected_seq=expected_seq)
        except ConcurrencyError:
            if events:
                self.stale(events[0].stream)
            raise
        if stored:
            if self._fresh is not None:
                self._fresh.add(stored)
            stream = stored[0].stream
            log = self._logs.get(stream)
            if isinstance(stored, EventList) and not stored.committed:
                # Inside a caller's transaction: it may still roll back. Not a fact yet.
                self._drop(stream)
                self.stale(stream)
            elif log is not None and stored[0].seq == len(log) + 1:
                log.extend(stored)  # nobody wrote in between: still a prefix, caught up
            elif log is None and stored[0].seq == 1:
                self._keep(stream, list(stored))  # a new stream: all of it is ours
            else:
                self.stale(stream)
        return stored

    def _keep(self, stream: str, log: list[Event]) -> None:
        self._logs[stream] = log
        self._logs.move_to_end(stream)
        self._trim()

    def _trim(self) -> None:
        while len(self._logs) > self.max_streams:
            self._drop(next(iter(self._logs)))

    def _drop(self, stream: str) -> None:
        self._logs.pop(stream, None)
        self._snapshots.pop(stream, None)

    async def erase(self, stream: str) -> int:
        self._drop(stream)
        self.stale(stream)
        return await self.inner.erase(stream)

    async def head(self, stream: str) -> tuple[int, str] | None:
        return await self.inner.head(stream)

    async def load_snapshot(self, stream: str, name: str, version: int) -> Snapshot | None:
        synced = _synced.get()
        log = self._logs.get(stream)
        if synced is not None and stream in synced and log is not None:
            # In a delivery, with the whole log in memory: the snapshot this process
            # saved last, if any (it knows what it wrote); else, for a short log,
            # none: folding it from its start costs less than asking (a snapshot
            # only ever saves folds; without one, a projection replays the log).
            saved = self._snapshots.get(stream, {}).get((name, version))
            if saved is not None or len(log) < SHORT_LOG:
                return saved
        return await self.inner.load_snapshot(stream, name, version)

    async def read_from_snapshot(self, stream: str, name: str, version: int) -> tuple[Snapshot | None, list[Event]]:
        """The snapshot and the log from its seq on (``ReadsFromSnapshot``): outside a
        delivery, of a stream this engine does not hold, one query of the inner store
        (when it can); else as :meth:`load_snapshot` and :meth:`read` answer."""
        if self._from_snapshot is not None and _synced.get() is None and stream not in self._logs:
            return await self._from_snapshot.read_from_snapshot(stream, name, version)
        snap = await self.load_snapshot(stream, name, version)
        return snap, ([] if snap is None else await self.read(stream, after=snap.seq - 1))

    async def save_snapshot(self, snapshot: Snapshot) -> bool:
        staged = _staged.get()
        if staged is not None and staged.stream == snapshot.stream:
            staged.snapshots.append(snapshot)  # a fold of events not yet appended: saved after
            return False
        saved = await self.inner.save_snapshot(snapshot)
        if saved and snapshot.stream in self._logs:  # kept as long as the stream's log
            self._snapshots.setdefault(snapshot.stream, {})[snapshot.name, snapshot.version] = snapshot
        return saved

    async def streams(self) -> list[str]:
        return await self.inner.streams()


def _with_staged(log: list[Event], staging: Staged, start: int, limit: int | None) -> EventList:
    """``log`` followed by the staged events, from ``start`` (at most ``limit``), as a
    view that is not committed (its folds' publications kept for later)."""
    end = None if limit is None else start + max(limit, 0)
    n = len(log)
    view = EventList(log[start:end] if start < n else ())
    if end is None or end > n:
        view.extend(staging.events[max(start - n, 0) : None if end is None else end - n])
    view.committed, view.pending = False, staging.folds
    return view


def _whole(earlier: Sequence[Event], seq: int, prev_id: str | None) -> bool:
    """Are ``earlier`` a stream's events 1 .. seq - 1, the last one ``prev_id``?"""
    return (
        len(earlier) == seq - 1
        and earlier[-1].id == prev_id
        and all(e.seq == i and e.stream == earlier[0].stream for i, e in enumerate(earlier, 1))
    )


def _extend(log: list[Event], more: Sequence[Event], n: int) -> bool:
    """``log`` (held with ``n`` events when ``more``, the log from seq ``n`` on, was
    read) brought up to ``more`` in place; it may hold more than ``n`` events by now
    (this process appended meanwhile). False when the two disagree (erased and written
    again meanwhile): nothing changed."""
    have = len(log) - n + 1  # events of ``more`` the log holds already
    if have > len(more):
        return more[-1].id == log[n - 2 + len(more)].id
    if log[-1].id != more[have - 1].id:
        return False
    log.extend(more[have:])
    return True


def _newest(current: list[Event], read: list[Event]) -> list[Event]:
    """The newer of two views of a stream's log: the longer, when the shorter is a
    prefix of it; else (they disagree: erased and written again meanwhile) ``read``,
    the one just read."""
    short, long = (current, read) if len(current) <= len(read) else (read, current)
    if not short or long[len(short) - 1].id == short[-1].id:
        return long
    return read
