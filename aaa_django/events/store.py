"""The EventStore protocol, snapshots, and the in-memory store."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterable, Sequence
from contextvars import ContextVar
from dataclasses import dataclass, replace
from typing import Protocol, runtime_checkable

from .cache import Publication
from .errors import ClosedStreamError, ConcurrencyError, InvalidEventError
from .event import Event, check_event, stored_event

#: a run's first event, and its last
RUN_STARTED = "aaa.run.started"
RUN_COMPLETED = "aaa.run.completed"
#: the runtime's event types: a stream whose first event is one of them is a run's
RUN_TYPES = "aaa."

#: True while a caller whose event loop has nothing else to do awaits a store's call:
#: the engine sets it around an append made by the only work it has going (its one
#: delivery holding a turn, none queued, no wait on a model or tool open:
#: ``Turns.alone``). A store whose calls otherwise go to a thread of its own and back
#: may then make the call on the calling thread, blocking the loop for it: there is
#: nothing for the loop to do meanwhile, and the two hand-offs cost a SQLite turn more
#: than its statements did (``SqliteEventStore``; benchmarks/profile_turn_sqlite.py). A hint: no
#: store needs it, and a caller that sets it wrongly only makes its loop wait.
caller_alone: ContextVar[bool] = ContextVar("aaa_store_caller_alone", default=False)


@dataclass(frozen=True, slots=True)
class Snapshot:
    """A projection's folded state at ``seq``, serialised as JSON text.

    ``event_id`` is the id of the event at ``seq``: a reader uses the snapshot only if
    its own view of the log holds that same event there, so a snapshot from another
    log, or from the future of an older view, is never folded on.
    """

    stream: str
    name: str
    version: int
    seq: int
    event_id: str
    state: str


class EventList(list[Event]):
    """The events a read returned, and whether they are all committed. A store that
    may read a caller's uncommitted rows (a read inside the caller's transaction)
    returns one with ``committed = False``: a state folded from rows a rollback may
    take back is never shared with other readers (see ``FoldCache``)."""

    committed: bool = True
    #: a view of events not yet appended (``TailCachedStore.staging``): where a fold of
    #: it leaves ``(cache, key, entry)`` to publish once they are appended as read
    #: (the engine does, ``Engine.answer``); None for any other read
    pending: list[Publication] | None = None


@runtime_checkable
class EventStore(Protocol):
    """Where streams of events live. Every backend passes one contract suite.

    - ``append`` assigns dense ``seq`` numbers, absorbs an event whose id is already
      stored (returning only the newly stored events), and raises
      :class:`ConcurrencyError` for a write that would break ``seq``. A batch is
      atomic: all of it is stored or none.
    - ``append`` raises :class:`ClosedStreamError` for an event after a run's
      ``aaa.run.completed``, or for a run's stream whose first event would not be
      its ``aaa.run.started`` (see :func:`check_open`).
    - ``read`` returns events with ``seq > after`` in order, at most ``limit``.
    - snapshots are keyed by (stream, name, version); ``save_snapshot`` is monotonic:
      it stores nothing (and returns False) unless its seq is newer than the stored one.
    """

    #: Identifies the underlying log for in-process caches (two store objects over the
    #: same database share it).
    cache_key: str

    async def append(self, events: Sequence[Event], *, expected_seq: int | None = None) -> list[Event]: ...

    async def read(
        self,
        stream: str,
        *,
        after: int = 0,
        limit: int | None = None,
        tenant: str | None = None,
    ) -> list[Event]: ...

    async def head(self, stream: str) -> tuple[int, str] | None: ...

    async def load_snapshot(self, stream: str, name: str, version: int) -> Snapshot | None: ...

    async def save_snapshot(self, snapshot: Snapshot) -> bool: ...

    async def erase(self, stream: str) -> int: ...

    async def streams(self) -> list[str]: ...


# -- what a store may offer beyond the protocol, declared (detected once where the store
# is wired: by the engine's tail wrapping it) --------------------------------------------


@runtime_checkable
class ErasesMany(Protocol):
    """A store that erases many streams in one transaction (retention erases runs by
    the hundred: one commit per batch, not per run). Detected once, by the engine."""

    async def erase_many(self, streams: Sequence[str]) -> int:
        """Erase every stream of ``streams`` (events and snapshots), all or none;
        return the number of events erased."""
        ...


@runtime_checkable
class KnowsRunning(Protocol):
    """A store that says in one query which of many runs are still going: started, and
    their log's newest event not their end (the run index of ``DjangoEventStore``).
    Waits for runs' ends poll it for every run they look at within a moment, rather than
    read each run's log (``aaa_django.runtime.reads.Polls``). Detected once, by the
    engine."""

    async def running(self, streams: Sequence[str]) -> set[str]:
        """Those of ``streams`` whose run has started and not ended. A stream not
        named in the answer has ended, or was erased, or never was a run: the caller
        reads it to know which."""
        ...


@runtime_checkable
class EventReader(Protocol):
    """What a projection needs of a log at the least: its events (spec 002's
    store-agnostic reader). ``Projection.load`` folds from any reader; one that is
    also a :class:`SnapshotStore` gets snapshots and the in-process holder."""

    async def read(
        self,
        stream: str,
        *,
        after: int = 0,
        limit: int | None = None,
        tenant: str | None = None,
    ) -> list[Event]: ...


@runtime_checkable
class SnapshotStore(Protocol):
    """What a reader offers beyond ``read()`` for fast projection reads: snapshots,
    and a ``cache_key`` naming its log (so the holder's states are shared only between
    readers of the same log). Every :class:`EventStore` is one."""

    cache_key: str

    async def load_snapshot(self, stream: str, name: str, version: int) -> Snapshot | None: ...

    async def save_snapshot(self, snapshot: Snapshot) -> bool: ...


@runtime_checkable
class ReadsFromSnapshot(Protocol):
    """A store that reads a projection's snapshot and the events from its seq on in one
    round trip (``Projection.load`` otherwise asks twice: the snapshot, then the log).
    Detected once per class, by the projection."""

    async def read_from_snapshot(self, stream: str, name: str, version: int) -> tuple[Snapshot | None, list[Event]]:
        """The snapshot keyed ``(stream, name, version)``, if any, and the stream's
        events from the snapshot's seq on, the event at that seq first (when the log
        still holds it); ``(None, [])`` without a snapshot."""
        ...


@runtime_checkable
class RecentAppends(Protocol):
    """A store that remembers what it has just appended (``DjangoEventStore``): the
    Celery bus sends such an event along with its delivery."""

    def fresh(self, event_id: str) -> bool:
        """Did this store just append ``event_id`` (and nobody asked yet)?"""
        ...


@runtime_checkable
class LearnsAppends(Protocol):
    """A store that learns committed events it did not append (``DjangoEventStore``:
    from a delivery's message), so its next append needs no query."""

    def observe(self, events: Sequence[Event]) -> None:
        """``events`` of one stream, committed by someone else: learn them."""
        ...

    def forget_hint(self, stream: str) -> None:
        """The engine over this store keeps nothing of ``stream`` now (its run ended,
        or waits for a person): what the store remembers of it goes (the next append to
        it asks first)."""
        ...


def prepare_batch(events: Iterable[Event]) -> tuple[str, list[Event], list[str]]:
    """Validate a batch for ``append``: one stream, every event valid.

    Returns the stream, the events (duplicates within the batch dropped) and their
    data as JSON text. Raises before anything is written.
    """
    events = list(events)
    if not events:
        return "", [], []
    stream = events[0].stream
    texts: list[str] = []
    seen: set[str] = set()
    kept: list[Event] = []
    for e in events:
        text = check_event(e)
        if e.stream != stream:
            raise InvalidEventError("one append writes to one stream")
        if e.id in seen:
            continue
        seen.add(e.id)
        kept.append(e)
        texts.append(text)
    return stream, kept, texts


def check_open(stream: str, head_type: str | None, events: Sequence[Event]) -> None:
    """Refuse (``ClosedStreamError``) new ``events`` that would follow a run's
    completion, or begin a run's stream with anything but the run's start.
    ``head_type``: the type of the stream's last stored event (None: it is empty).
    The SQL stores keep the same rule in their triggers (migration 0006)."""
    last = head_type
    for e in events:
        if last == RUN_COMPLETED:
            raise ClosedStreamError(closed_reason(stream, ended=True))
        if last is None and e.type.startswith(RUN_TYPES) and e.type != RUN_STARTED:
            raise ClosedStreamError(closed_reason(stream, ended=False, type=e.type))
        last = e.type


def closed_reason(stream: str, *, ended: bool, type: str | None = None) -> str:
    """The words of a :class:`ClosedStreamError` (every store says the same)."""
    if ended:
        return f"{stream}: the run has completed; nothing is appended after {RUN_COMPLETED}"
    return (
        f"{stream}: a run's stream starts with {RUN_STARTED}"
        f"{f', not {type}' if type else ''} (the run was erased, or never started)"
    )


def assign_seqs(
    events: list[Event], head: int, expected_seq: int | None, datas: Sequence[dict] | None = None
) -> list[Event]:
    """Number new events after ``head``; refuse any write that would break ``seq``.
    ``datas``: the data each stored event holds instead of its own (a store's decoded
    copy)."""
    if expected_seq is not None and expected_seq != head:
        raise ConcurrencyError(f"stream head is {head}, expected {expected_seq}")
    out = []
    for i, e in enumerate(events, start=head + 1):
        if e.seq is not None and e.seq != i:
            raise ConcurrencyError(f"event {e.id} claims seq {e.seq} but the next seq is {i}")
        data = e.data if datas is None else datas[i - head - 1]
        if type(e) is Event:  # (``replace``, made in a third of the time)
            out.append(stored_event(e.id, e.stream, i, e.type, data, e.causation, e.time, e.blobs, e.tenant))
        else:
            out.append(replace(e, seq=i, data=data))
    return out


class RecentIds:
    """Ids of the events a store has just appended, each until it is asked about once
    (the newest ``size`` kept). A bus sends such an event along with its delivery; an
    event it re-drives (read, not just appended) is not here, and travels by id
    (see ``aaa_django.celery.bus.DistributedBus``). Thread-safe."""

    def __init__(self, size: int = 1024) -> None:
        self.size = size
        self._ids: dict[str, None] = {}
        self._lock = threading.Lock()

    def add(self, events: Iterable[Event]) -> None:
        with self._lock:
            ids = self._ids
            for e in events:
                ids[e.id] = None
            while len(ids) > self.size:  # oldest first
                del ids[next(iter(ids))]

    def pop(self, event_id: str) -> bool:
        """Was ``event_id`` just appended (and not asked about yet)?"""
        with self._lock:
            return self._ids.pop(event_id, False) is None


class InMemoryEventStore:
    """A complete EventStore in a dict: for tests and single-process, non-durable use.

    Stored events hold a decoded copy of their data, as a database would, so a caller
    that mutates its dict after appending changes nothing in the log.
    """

    def __init__(self) -> None:
        self._streams: dict[str, list[Event]] = {}
        self._ids: set[str] = set()
        self._snapshots: dict[tuple[str, str, int], Snapshot] = {}
        self._lock = threading.Lock()
        self.cache_key = f"memory:{id(self)}"

    async def append(self, events: Sequence[Event], *, expected_seq: int | None = None) -> list[Event]:
        stream, batch, texts = prepare_batch(events)
        if not batch:
            return []
        with self._lock:
            log = self._streams.get(stream, [])
            ids = self._ids
            fresh = [(e, t) for e, t in zip(batch, texts) if e.id not in ids]
            stored = assign_seqs([e for e, _ in fresh], len(log), expected_seq, [json.loads(t) for _, t in fresh])
            check_open(stream, log[-1].type if log else None, stored)
            if stored:
                log.extend(stored)
                self._streams[stream] = log
                self._ids.update(e.id for e in stored)
            return stored

    async def read(
        self,
        stream: str,
        *,
        after: int = 0,
        limit: int | None = None,
        tenant: str | None = None,
    ) -> list[Event]:
        log = self._streams.get(stream, [])
        out = log[max(after, 0) :]
        if tenant is not None:
            out = [e for e in out if e.tenant == tenant]
        return out[:limit] if limit is not None else list(out)

    async def head(self, stream: str) -> tuple[int, str] | None:
        log = self._streams.get(stream)
        return (log[-1].seq or 0, log[-1].id) if log else None

    async def load_snapshot(self, stream: str, name: str, version: int) -> Snapshot | None:
        return self._snapshots.get((stream, name, version))

    async def read_from_snapshot(self, stream: str, name: str, version: int) -> tuple[Snapshot | None, list[Event]]:
        snap = self._snapshots.get((stream, name, version))
        if snap is None:
            return None, []
        return snap, list(self._streams.get(stream, [])[max(snap.seq - 1, 0) :])

    async def save_snapshot(self, snapshot: Snapshot) -> bool:
        key = (snapshot.stream, snapshot.name, snapshot.version)
        with self._lock:
            old = self._snapshots.get(key)
            if old is not None and old.seq >= snapshot.seq:
                return False
            self._snapshots[key] = snapshot
            return True

    async def erase(self, stream: str) -> int:
        with self._lock:
            log = self._streams.pop(stream, [])
            self._ids.difference_update(e.id for e in log)
            for key in [k for k in self._snapshots if k[0] == stream]:
                del self._snapshots[key]
            return len(log)

    async def streams(self) -> list[str]:
        return sorted(self._streams)
