"""Projections: state as a fold of the log, with snapshots and incremental reads."""

from __future__ import annotations

import copy as _copy
import logging
from collections.abc import AsyncIterator, Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Generic, TypeGuard, TypeVar

from pydantic import TypeAdapter

from .cache import CacheKey, FoldCache, Folded, Publication, folded
from .event import Event
from .store import EventList, EventReader, EventStore, ReadsFromSnapshot, Snapshot, SnapshotStore

log = logging.getLogger("aaa_django.events")

S = TypeVar("S")


@dataclass(frozen=True, slots=True)
class Loaded(Generic[S]):
    """A projection's state and where it came from."""

    state: S
    #: seq of the last event folded into the state (0 for an empty stream)
    seq: int
    #: "cache" (the warm holder), "snapshot" or "replay" (folded from the first event)
    source: str
    #: the seq the fold started after (holder cursor, snapshot seq, or 0)
    base_seq: int
    #: events folded by this read
    folded: int


#: :class:`Loaded`'s fields, in order
_Info = tuple[S, int, str, int, int]


@dataclass
class _Base(Generic[S]):
    """A usable snapshot: its state, the event at its seq, the events after it, and
    whether they are all committed."""

    state: S
    event: Event
    tail: list[Event]
    committed: bool
    #: the read's publications to make once its events are appended (``EventList.pending``)
    pending: list[Publication] | None = None


class Projection(Generic[S]):
    """Initial state + deterministic fold (+ name, version and state type for snapshots).

    ``Projection(Translations, apply, name="acme.translations", version=1,
    state_type=Translations, every=64)``. ``initial`` is called for a fresh state;
    ``apply(state, event)`` returns the next state (mutating and returning ``state`` is
    fine: the state object is private to the fold). ``finalize(state)`` optionally
    runs once after folding, on a copy, and is not part of snapshots.

    States handed out by :meth:`load` may be shared with the in-process holder: treat
    them as read-only.
    """

    def __init__(
        self,
        initial: Callable[[], S] | S,
        apply: Callable[[S, Event], S],
        *,
        name: str | None = None,
        version: int = 1,
        state_type: type[S] | None = None,
        every: int = 64,
        finalize: Callable[[S], S] | None = None,
    ) -> None:
        if not callable(apply):
            raise TypeError("apply must be a function (state, event) -> state")
        if not isinstance(version, int):
            raise TypeError("version must be an int")
        if not isinstance(every, int) or every < 1:
            raise ValueError("every must be a positive int")
        if state_type is not None and not name:
            raise ValueError("a projection with a state_type needs a name (its snapshot key)")
        self.initial = initial
        self.apply = apply
        self.name = name
        self.version = version
        self.state_type = state_type
        self.every = every
        self.finalize = finalize
        self._adapter = TypeAdapter(state_type) if state_type is not None else None
        self.key = name or f"anonymous:{id(self)}"
        #: events folded by this projection in this process (tests count these)
        self.folds = 0

    def __repr__(self) -> str:
        return f"Projection({self.key!r}, version={self.version})"

    # -- pure parts ---------------------------------------------------------------

    @property
    def snapshots(self) -> bool:
        """Snapshots need a name and a state type to (de)serialise the state."""
        return self._adapter is not None

    def new_state(self) -> S:
        return self.initial() if callable(self.initial) else _copy.deepcopy(self.initial)

    def fold(self, events: Iterable[Event], state: S | None = None) -> S:
        """Fold ``events`` into ``state`` (a fresh initial state by default). Pure."""
        if state is None:
            state = self.new_state()
        apply = self.apply
        n = 0
        for e in events:
            state = apply(state, e)
            n += 1
        self.folds += n
        return state

    def result(self, state: S) -> S:
        """The state a reader sees: ``finalize`` applied to a copy, if there is one."""
        return self.finalize(self.copy(state)) if self.finalize else state

    def copy(self, state: S) -> S:
        # A state that copies itself (``__deepcopy__``: the built-in projections' states
        # copy only what their folds mutate) is asked directly: what copy.deepcopy
        # would call, without its memo and bookkeeping (once per read that folds).
        copier = getattr(state, "__deepcopy__", None)
        return copier({}) if copier is not None else _copy.deepcopy(state)

    def dump(self, state: S) -> str:
        assert self._adapter is not None
        return self._adapter.dump_json(state).decode()

    def parse(self, text: str) -> S:
        assert self._adapter is not None
        return self._adapter.validate_json(text)

    def same(self, a: S, b: S) -> bool:
        return self.dump(a) == self.dump(b) if self._adapter is not None else a == b

    # -- reading from a store -----------------------------------------------------

    async def load(
        self,
        store: EventReader,
        stream: str,
        *,
        cache: FoldCache | None = None,
        at: int | None = None,
    ) -> S:
        """The state of ``stream`` now (or as of event ``at``)."""
        return (await self._load(store, stream, cache, at))[0]

    async def load_info(
        self,
        store: EventReader,
        stream: str,
        *,
        cache: FoldCache | None = None,
        at: int | None = None,
    ) -> Loaded[S]:
        """Like :meth:`load`, and say where the state came from.

        1. the warm holder, if its entry is a prefix of this reader's view;
        2. else the latest snapshot, if its version matches and the event at its seq
           is in this log (so it is not ahead of the log, nor from another log);
        3. else a replay from the first event.
        Then fold the tail, and save a snapshot once ``every`` events were folded
        since the last one. Every failure of a snapshot degrades to a replay.

        A reader that only reads (not a :class:`SnapshotStore`) is replayed: no
        snapshot, and no holder (nothing names its log).
        """
        return Loaded(*await self._load(store, stream, cache, at))

    async def _load(self, store: EventReader, stream: str, cache: FoldCache | None, at: int | None) -> _Info[S]:
        """:meth:`load_info`'s fields, as a tuple (:meth:`load` wants only the state,
        once or twice per delivery)."""
        if not _keeps_snapshots(store):
            return await self._replay(store, stream, at)
        if at is not None:
            return await self._load_at(store, stream, at)
        key: CacheKey = (store.cache_key, stream, self.key, self.version)
        if cache is not None:
            prior = cache.get(key)
            if prior is not None:
                events = await store.read(stream, after=prior.cursor - 1)
                if events and _same_event(events[0], prior):
                    cache.hits += 1
                    return await self._advance(
                        store,
                        stream,
                        key,
                        cache,
                        prior,
                        events[1:],
                        _committed(events),
                        _pending(events),
                    )
                # The reader's view does not reach the prior's cursor (an older view),
                # or holds another event there (another log): never use it.
                cache.rejected += 1
            else:
                cache.misses += 1
        base = await self._from_snapshot(store, stream)
        base_event: Event | None
        tail: Sequence[Event]
        if base is None:
            tail = await store.read(stream)
            committed, pending = _committed(tail), _pending(tail)
            state, base_seq, base_event, source = self.new_state(), 0, None, "replay"
        else:
            state, base_event, tail, committed = base.state, base.event, base.tail, base.committed
            base_seq, source, pending = base_event.seq or 0, "snapshot", base.pending
        state = self.fold(tail, state)
        last = tail[-1] if tail else base_event
        unsaved = len(tail)
        if last is not None and tail and unsaved >= self.every and self.snapshots:
            await self._save(store, stream, last.seq or 0, last.id, state)
            unsaved = 0
        if cache is not None and last is not None:
            entry = folded(last.seq or 0, last.id, state, unsaved, last.time)
            if committed:
                cache.publish(key, entry)
            elif pending is not None:
                pending.append((cache, key, entry))
        return self.result(state), last.seq or 0 if last else 0, source, base_seq, len(tail)

    async def _advance(
        self,
        store: EventStore,
        stream: str,
        key: CacheKey,
        cache: FoldCache,
        prior: Folded,
        tail: Sequence[Event],
        committed: bool,
        pending: list[Publication] | None = None,
    ) -> _Info[S]:
        state = self.fold(tail, self.copy(prior.state)) if tail else prior.state
        if tail:
            unsaved = prior.unsaved + len(tail)
            last = tail[-1]
            if unsaved >= self.every and self.snapshots:
                await self._save(store, stream, last.seq or 0, last.id, state)
                unsaved = 0
            entry = folded(last.seq or 0, last.id, state, unsaved, last.time)
            if committed:
                cache.publish(key, entry)
            elif pending is not None:
                pending.append((cache, key, entry))
        else:
            entry = prior
        if cache.check_due():
            if cache.background:
                cache.schedule_check(key, lambda: self._self_check(store, stream, key, cache, entry))
            else:
                state = await self._self_check(store, stream, key, cache, entry)
        return self.result(state), entry.cursor, "cache", prior.cursor, len(tail)

    async def _self_check(self, store: EventStore, stream: str, key: CacheKey, cache: FoldCache, entry: Folded) -> S:
        """Compare the holder's state with a whole-log fold of the same view."""
        cache.checks += 1
        events = await store.read(stream, limit=entry.cursor)
        if not events or not _same_event(events[-1], entry):
            return entry.state  # the log moved under us (erased): nothing to compare
        reference = self.new_state()
        for e in events:  # not counted in self.folds: this is the check, not the read
            reference = self.apply(reference, e)
        if self.same(entry.state, reference):
            return entry.state
        log.warning(
            "projection %s on %s: the incremental state differs from the whole-log fold "
            "at seq %s; resetting the holder",
            self.key,
            stream,
            entry.cursor,
        )
        cache.resets += 1
        cache.reset(key)
        return reference

    async def _from_snapshot(self, store: EventStore, stream: str) -> _Base[S] | None:
        """The state at a usable snapshot, the event there and the tail after it, or
        None."""
        if not self.snapshots:
            return None
        events: Sequence[Event] | None = None
        try:
            if _reads_from_snapshot(store):  # the snapshot and the log after it at once
                snap, events = await store.read_from_snapshot(stream, self.key, self.version)
            else:
                snap = await store.load_snapshot(stream, self.key, self.version)
        except Exception:  # derived data: a broken snapshot read is a replay
            log.warning("projection %s: loading the snapshot of %s failed", self.key, stream, exc_info=True)
            return None
        if snap is None:
            return None
        if snap.version != self.version:
            log.info("projection %s: snapshot version %s != %s, replaying", self.key, snap.version, self.version)
            return None
        try:
            state = self.parse(snap.state)
        except Exception as exc:
            log.warning(
                "projection %s: snapshot of %s at seq %s is corrupt (%s), replaying",
                self.key,
                stream,
                snap.seq,
                str(exc).splitlines()[0],
            )
            return None
        if events is None:
            events = await store.read(stream, after=snap.seq - 1)
        if not events or events[0].seq != snap.seq or events[0].id != snap.event_id:
            log.info(
                "projection %s: snapshot of %s at seq %s is not in this view of the log, replaying",
                self.key,
                stream,
                snap.seq,
            )
            return None
        return _Base(state, events[0], list(events[1:]), _committed(events), _pending(events))

    async def _save(self, store: EventStore, stream: str, seq: int, event_id: str, state: S) -> None:
        try:
            await store.save_snapshot(Snapshot(stream, self.key, self.version, seq, event_id, self.dump(state)))
        except Exception:  # a failed save costs a longer fold later, nothing else
            log.warning("projection %s: saving a snapshot of %s failed", self.key, stream, exc_info=True)

    async def _replay(self, reader: EventReader, stream: str, at: int | None) -> _Info[S]:
        """The whole-log fold (up to event ``at``) of a reader that only reads."""
        if at is not None and at < 0:
            raise ValueError("at must be a seq >= 0")
        tail = await reader.read(stream, limit=at) if at != 0 else []
        state = self.fold(tail)
        return self.result(state), (tail[-1].seq or 0) if tail else 0, "replay", 0, len(tail)

    async def _load_at(self, store: EventStore, stream: str, at: int) -> _Info[S]:
        """Time travel: the state as of event ``at`` (from a snapshot at or before it)."""
        if at < 0:
            raise ValueError("at must be a seq >= 0")
        base = await self._from_snapshot(store, stream)
        if base is not None and (base.event.seq or 0) <= at:
            state, base_seq = base.state, base.event.seq or 0
            tail = [e for e in base.tail if (e.seq or 0) <= at]
            source = "snapshot"
        else:
            state, base_seq, source = self.new_state(), 0, "replay"
            tail = await store.read(stream, limit=at) if at else []
        state = self.fold(tail, state)
        last = tail[-1].seq or 0 if tail else base_seq
        return self.result(state), last, source, base_seq, len(tail)


#: (reader class, capability) -> whether its instances have it (asked once per class: a
#: Protocol check costs more than a warm read)
_CAPABLE: dict[tuple[type, type], bool] = {}


def _capable(reader: object, capability: type) -> bool:
    key = (type(reader), capability)
    found = _CAPABLE.get(key)
    if found is None:
        found = _CAPABLE[key] = isinstance(reader, capability)
    return found


def _reads_from_snapshot(store: EventStore) -> TypeGuard[ReadsFromSnapshot]:
    """Does ``store`` read a snapshot and the log after it at once?"""
    return _capable(store, ReadsFromSnapshot)


def _keeps_snapshots(reader: EventReader) -> TypeGuard[EventStore]:
    """Is ``reader`` a store that keeps snapshots?"""
    return _capable(reader, SnapshotStore)


def _same_event(event: Event, entry: Folded) -> bool:
    """Is ``event`` the one the holder's entry was folded up to?"""
    return (
        event.seq == entry.cursor
        and event.id == entry.event_id
        and (entry.event_time is None or event.time == entry.event_time)
    )


def _committed(events: Sequence[Event]) -> bool:
    # A store that may have read a caller's uncommitted rows (a read inside the caller's
    # transaction) marks the list it returned: a state built on those rows must not be
    # published to other readers, since a rollback would take the rows back.
    return not isinstance(events, EventList) or events.committed


def _pending(events: Sequence[Event]) -> list[Publication] | None:
    """Where a fold of a view of events not yet appended leaves what to publish once
    they are (``EventList.pending``), or None."""
    return events.pending if isinstance(events, EventList) else None


async def pages(
    store: EventReader,
    stream: str,
    *,
    after: int = 0,
    tenant: str | None = None,
    page_size: int = 1000,
) -> AsyncIterator[list[Event]]:
    """The events of ``stream`` after seq ``after`` (of one tenant), a page (a read of
    at most ``page_size``) at a time."""
    while True:
        page = await store.read(stream, after=after, limit=page_size, tenant=tenant)
        if page:
            yield page
        if len(page) < page_size:
            return
        after = page[-1].seq or after


async def iterate(
    store: EventStore,
    stream: str,
    *,
    after: int = 0,
    tenant: str | None = None,
    page_size: int = 1000,
) -> AsyncIterator[Event]:
    """The events of ``stream`` after seq ``after`` (of one tenant), page by page."""
    async for page in pages(store, stream, after=after, tenant=tenant, page_size=page_size):
        for e in page:
            yield e


#: events per read of a whole-log fold: few round trips, and a bounded list in memory
FOLD_PAGE = 5000


async def fold(
    projection: Projection[S],
    store: EventStore,
    stream: str,
    *,
    after: int = 0,
    tenant: str | None = None,
) -> S:
    """Fold ``projection`` over the stream from ``after`` (of one tenant): no snapshot,
    no cache. This whole-log fold is the reference every faster path is tested against."""
    state = projection.new_state()
    async for page in pages(store, stream, after=after, tenant=tenant, page_size=FOLD_PAGE):
        state = projection.fold(page, state)
    return projection.result(state)
