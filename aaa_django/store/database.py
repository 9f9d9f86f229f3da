"""The EventStore over the Django ORM (SQLite and PostgreSQL; any backend Django has).

The database enforces the invariants (see ``migrations/0002``); this module adds what
SQL alone does not say: absorbing an already stored event id, numbering a batch, and
serialising appenders of one stream. The common append outside a caller's
transaction takes the fewest statements its backend allows (:mod:`aaa_django.store.appends`);
rows are built and read in plain SQL (:mod:`aaa_django.store.rows`).
"""

from __future__ import annotations

import time
import zlib
from collections.abc import Callable, Sequence
from functools import cache, wraps
from typing import TYPE_CHECKING, Any, Concatenate, ParamSpec, TypeVar

from django.db import Error as DatabaseDriverError
from django.db import IntegrityError, connections, transaction
from django.db.models import QuerySet
from django.utils.timezone import now

from aaa_django.events import ConcurrencyError, Event, Snapshot, StoreUnavailable
from aaa_django.events.store import RecentIds, prepare_batch
from aaa_django.models import EventRecord

from . import rows, wakeups
from .appends import StatementAppends
from .faults import contention, translate
from .offload import Offload, in_django_executor
from .rows import (
    HEAD,
    INSERT_CHUNK,
    ROW,
    ROW_PG,
    SQLITE_CHUNK,
    EventList,
    closed_refusal,
    event_columns,
    insert,
    number,
    prepares,
    to_events,
)
from .runindex import index_events

if TYPE_CHECKING:
    from django.db.backends.utils import CursorWrapper

__all__ = ["DjangoEventStore", "EventList"]

_LOAD_SNAPSHOT = "SELECT seq, event_id, state FROM aaa_snapshot WHERE stream = %s AND name = %s AND version = %s"
# A snapshot and its stream's events from its seq on, in one round trip: the state in
# the first row only (the others have NULL there), one row of NULL events when there
# are none; no row without a snapshot. The first row is the event at the snapshot's
# seq whenever the log holds a later one (seqs are dense: the trigger of migration
# 0002). ``{events}``: the events' columns (see ``rows.event_columns``); ``{log}``:
# the events from the snapshot's seq on. (A window function, ROW_NUMBER() = 1, doubled
# the time of the query on SQLite.)
_READ_FROM_SNAPSHOT = (
    "SELECT s.seq, s.event_id, CASE WHEN e.seq IS NULL OR e.seq = s.seq THEN s.state END, "
    "{events} FROM aaa_snapshot AS s LEFT JOIN {log} "
    "WHERE s.stream = %s AND s.name = %s AND s.version = %s ORDER BY e.seq"
)
_LOG_FROM_SNAPSHOT = "aaa_event AS e ON e.stream = s.stream AND e.seq >= s.seq"
# PostgreSQL planned that join as a scan of the whole stream filtered on seq (a hash
# join with statistics, a nested loop without): a subquery it may not flatten (OFFSET
# 0) is an index scan from the snapshot's seq.
_LOG_FROM_SNAPSHOT_PG = (
    "LATERAL (SELECT * FROM aaa_event WHERE stream = s.stream AND seq >= s.seq OFFSET 0) AS e ON true"
)
_HEAD_AND_KNOWN_PG = f"SELECT COALESCE(({HEAD}), 0), ARRAY(SELECT id FROM aaa_event WHERE id = ANY(%s))"
_SNAPSHOT_UPDATE = (
    "UPDATE aaa_snapshot SET seq = %s, event_id = %s, state = %s, saved_at = %s "
    "WHERE stream = %s AND name = %s AND version = %s AND seq < %s"
)
# Only when there is no row (SQLite's trigger against REPLACE refuses an insert below a
# stored seq, even one that ON CONFLICT would have ignored).
_SNAPSHOT_INSERT = (
    "INSERT INTO aaa_snapshot (stream, name, version, seq, event_id, state, saved_at) "
    "SELECT %s, %s, %s, %s, %s, %s, %s WHERE NOT EXISTS (SELECT 1 FROM aaa_snapshot "
    "WHERE stream = %s AND name = %s AND version = %s) ON CONFLICT (stream, name, version) DO NOTHING"
)


#: the snapshot read on PostgreSQL as the call of migration 0011's function, whose plan
#: the session keeps (the same rows as ``_READ_FROM_SNAPSHOT``)
READ_FROM_SNAPSHOT_CALL = "SELECT * FROM aaa_read_from_snapshot(%s, %s, %s)"


@cache
def read_from_snapshot_sql(vendor: str, *, prepares: bool = True) -> str:
    """``_READ_FROM_SNAPSHOT`` on ``vendor``; on PostgreSQL, for a connection that does
    not prepare its statements (``prepares`` False: Django's own, or one behind a
    pooler), the call of migration 0011's function: the server plans the statement
    at every read (its lateral join, 0.11 ms of 0.32), the function once a session."""
    if vendor == "postgresql" and not prepares:
        return READ_FROM_SNAPSHOT_CALL
    log = _LOG_FROM_SNAPSHOT_PG if vendor == "postgresql" else _LOG_FROM_SNAPSHOT
    return _READ_FROM_SNAPSHOT.format(events=event_columns(vendor, "e"), log=log)


def snapshot_writes(snapshot: Snapshot, saved_at: object) -> tuple[tuple[str, list], tuple[str, list]]:
    """The conditional UPDATE and the INSERT of a snapshot's save, with their
    parameters (the sync store and the async one, ``aaa_django.store.postgres``, run these)."""
    key = [snapshot.stream, snapshot.name, snapshot.version]
    values = [snapshot.seq, snapshot.event_id, snapshot.state, saved_at]
    return (_SNAPSHOT_UPDATE, [*values, *key, snapshot.seq]), (_SNAPSHOT_INSERT, [*key, *values, *key])


# Appenders that lose a race (SQLite's single writer, or a concurrent insert of the same
# id) re-read and try again; past this many tries the error is real.
_RETRIES = 20


#: a store method's class, parameters and result (:func:`_translated`)
DS = TypeVar("DS", bound="DjangoEventStore")
P = ParamSpec("P")
T = TypeVar("T")


def _translated(*, reads: bool) -> Callable[[Callable[Concatenate[DS, P], T]], Callable[Concatenate[DS, P], T]]:
    """Method decorator: the database's errors leave as the core's
    :class:`~aaa_django.events.StoreUnavailable` (transient or not, see
    :mod:`aaa_django.store.faults`; the driver's error is its cause). A connection found
    broken is closed, so the next call connects again (a long-lived thread's, such as
    the engine host's, outlives a database restart); ``reads``, which change nothing,
    are tried once more on the new connection."""

    def wrap(fn: Callable[Concatenate[DS, P], T]) -> Callable[Concatenate[DS, P], T]:
        @wraps(fn)
        def call(self: DS, *args: P.args, **kwargs: P.kwargs) -> T:
            try:
                return fn(self, *args, **kwargs)
            except DatabaseDriverError as exc:
                fault, reconnects = self._fault(exc)
                if not (reads and fault.transient and reconnects):
                    raise fault from exc
            try:
                return fn(self, *args, **kwargs)
            except DatabaseDriverError as exc:
                raise self._fault(exc)[0] from exc

        return call

    return wrap


class DjangoEventStore(StatementAppends):
    """An :class:`~aaa_django.events.EventStore` on the database alias ``using``.

    The ``*_sync`` methods are for sync callers (Celery tasks, the admin, the API);
    the async methods (the protocol the engine awaits) run them off the event loop
    by ``offload`` (:mod:`aaa_django.store.offload`; default: Django's
    thread-sensitive executor, a hop to another thread a call: async code on
    PostgreSQL or SQLite is better served by :func:`~aaa_django.store.site_store`'s
    store, whose calls make none). Appends join the caller's transaction when there is
    one, so events commit (or roll back) with the caller's own writes.
    """

    def __init__(self, using: str = "default", *, offload: Offload | None = None) -> None:
        self.using = using
        #: how the async methods run the sync ones (see :mod:`aaa_django.store.offload`)
        self.offload: Offload = offload if offload is not None else in_django_executor
        self.cache_key = f"django:{using}"
        self._init_hints()
        #: events this store just appended (see :meth:`fresh`)
        self._recent = RecentIds()

    def __repr__(self) -> str:
        return f"DjangoEventStore(using={self.using!r})"

    def fresh(self, event_id: str) -> bool:
        """Did this store just append ``event_id`` (and nobody asked yet)? The Celery
        bus then sends the event along with its delivery (a run's start from the web
        process: its first worker needs no read)."""
        return self._recent.pop(event_id)

    @property
    def _events(self) -> QuerySet:
        return EventRecord.objects.using(self.using)

    # -- the async protocol: the sync methods, offloaded ------------------------------

    async def append(self, events: Sequence[Event], *, expected_seq: int | None = None) -> list[Event]:
        return await self.offload(self.append_sync, events, expected_seq=expected_seq)

    async def read(
        self, stream: str, *, after: int = 0, limit: int | None = None, tenant: str | None = None
    ) -> list[Event]:
        return await self.offload(self.read_sync, stream, after=after, limit=limit, tenant=tenant)

    async def head(self, stream: str) -> tuple[int, str] | None:
        return await self.offload(self.head_sync, stream)

    async def load_snapshot(self, stream: str, name: str, version: int) -> Snapshot | None:
        return await self.offload(self.load_snapshot_sync, stream, name, version)

    async def read_from_snapshot(self, stream: str, name: str, version: int) -> tuple[Snapshot | None, list[Event]]:
        return await self.offload(self.read_from_snapshot_sync, stream, name, version)

    async def save_snapshot(self, snapshot: Snapshot) -> bool:
        return await self.offload(self.save_snapshot_sync, snapshot)

    async def erase(self, stream: str) -> int:
        return await self.offload(self.erase_sync, stream)

    async def erase_many(self, streams: Sequence[str]) -> int:
        return await self.offload(self.erase_many_sync, streams)

    async def streams(self) -> list[str]:
        return await self.offload(self.streams_sync)

    async def unfinished(self) -> dict[str, float]:
        return await self.offload(self.unfinished_sync)

    async def due(self, now: float, limit: int = 500) -> list[tuple[str, int]]:
        return await self.offload(self.due_sync, now, limit)

    async def running(self, streams: Sequence[str]) -> set[str]:
        return await self.offload(self.running_sync, streams)

    async def settle_due(self, run_id: str, seq: int, due: float | None) -> bool:
        return await self.offload(self.settle_due_sync, run_id, seq, due)

    # -- events -------------------------------------------------------------------

    def append_sync(self, events: Sequence[Event], *, expected_seq: int | None = None) -> list[Event]:
        stream, batch, texts = prepare_batch(events)  # raises before any write
        if not batch:
            return []
        for attempt in range(_RETRIES):
            try:
                stored = EventList(self._append_once(stream, batch, texts, expected_seq, attempt > 0))
                self._recent.add(stored)  # a bus may send them along (after their commit)
                # Appended inside a caller's transaction: they may still roll back (a
                # cache of the log must not take them as facts yet).
                stored.committed = not connections[self.using].in_atomic_block
                # waiting event streams (and waits for its end, if it ended): at commit
                wakeups.notify(self.using, [stream], ended=wakeups.ended(stored))
                return stored
            except DatabaseDriverError as exc:
                closed = closed_refusal(stream, exc) if isinstance(exc, IntegrityError) else None
                if closed is not None:  # a run that has ended, or was erased: final
                    raise closed from exc
                if not isinstance(exc, IntegrityError) and not contention(exc):
                    # An outage or a refusal, not a race: nothing to decide again. (Not
                    # tried again on a new connection: whether a lost connection
                    # committed is unknown, and the caller's retry finds out.)
                    raise self._fault(exc)[0] from exc
                # Lost a race with another appender (SQLite: "database is locked";
                # both: the same seq or id inserted first by someone else). Re-read
                # and decide again; inside a caller's transaction our atomic block was
                # a savepoint, rolled back, so the caller's transaction is still usable
                # (outside one, our own transaction was rolled back whole).
                if attempt == _RETRIES - 1:
                    raise ConcurrencyError(f"append to {stream} lost a race: {exc}") from exc
                time.sleep(0.001 * (attempt + 1))
        raise AssertionError("unreachable")

    def _fault(self, exc: BaseException) -> tuple[StoreUnavailable, bool]:
        """The core's error for a database error, and whether the next call gets a new
        connection: a broken one is closed on the way (outside a caller's
        transaction, which is the caller's to end)."""
        conn = connections[self.using]
        reconnects = False
        if not conn.in_atomic_block:
            conn.close_if_unusable_or_obsolete()
            reconnects = conn.connection is None
        fault = translate(exc, StoreUnavailable) or StoreUnavailable(f"{type(exc).__name__}: {exc}", transient=False)
        return fault, reconnects

    def _append_once(
        self, stream: str, batch: list[Event], texts: list[str], expected_seq: int | None, contended: bool = False
    ) -> list[Event]:
        # Plain SQL on Django's connection: building ORM queries cost more than the
        # database work itself (benchmarks/bench_eventlog.py). Optimistic first: the
        # unique (stream, seq) index and the dense-seq trigger refuse a lost race, and
        # only a retry takes the stream's advisory lock on PostgreSQL.
        conn = connections[self.using]
        pg = conn.vendor == "postgresql"
        if pg and not contended and conn.get_autocommit():
            seen = self._forget(stream)
            stored = self._append_pg_statement(conn, stream, batch, texts, expected_seq, seen)
            if stored is not None:
                return stored
        elif conn.vendor == "sqlite" and conn.get_autocommit():
            stored = self._append_sqlite_transaction(conn, stream, batch, texts, expected_seq)
            if stored is not None:
                return stored
        with transaction.atomic(using=self.using), conn.cursor() as cur:
            if pg and contended:
                cur.execute("SELECT pg_advisory_xact_lock(%s)", [_lock_key(stream)])
            head, known = _head_and_known(cur, pg, stream, [e.id for e in batch])
            stored, rows = number(conn, batch, texts, head, known, expected_seq)
            if rows:
                row = ROW_PG if pg else ROW
                for i in range(0, len(rows), INSERT_CHUNK):
                    chunk = rows[i : i + INSERT_CHUNK]
                    cur.execute(*insert(row, chunk))
                # The run index (aaa_run) is derived from the log: updated in the same
                # transaction, so it commits, or rolls back, with the events.
                index_events(self.using, stored)
        return stored

    @_translated(reads=True)
    def read_sync(
        self,
        stream: str,
        *,
        after: int = 0,
        limit: int | None = None,
        tenant: str | None = None,
    ) -> list[Event]:
        return rows.read(connections[self.using], stream, after=after, limit=limit, tenant=tenant)

    @_translated(reads=True)
    def head_sync(self, stream: str) -> tuple[int, str] | None:
        row = self._events.filter(stream=stream).order_by("-seq").values_list("seq", "id")[:1]
        return (row[0][0], row[0][1]) if row else None

    def erase_sync(self, stream: str) -> int:
        return self.erase_many_sync([stream])

    @_translated(reads=False)
    def erase_many_sync(self, streams: Sequence[str]) -> int:
        """Erase ``streams`` (events, snapshots, index rows) in one transaction; return
        the number of events erased. Plain DELETEs by the stream index, in chunks."""
        streams = list(dict.fromkeys(streams))
        for stream in streams:
            self._forget(stream)
        conn = connections[self.using]
        pg = conn.vendor == "postgresql"
        deleted = 0
        with transaction.atomic(using=self.using), conn.cursor() as cur:
            for where, params in rows.among(streams, pg=pg):
                cur.execute(f"DELETE FROM aaa_snapshot WHERE stream {where}", params)
                cur.execute(f"DELETE FROM aaa_event WHERE stream {where}", params)
                deleted += cur.rowcount
                # the run index is derived from the log: its rows go with it
                cur.execute(f"DELETE FROM aaa_run WHERE run_id {where}", params)
        wakeups.notify(self.using, streams, ended=True)  # their event streams end, and waits
        return deleted

    @_translated(reads=True)
    def streams_sync(self) -> list[str]:
        return rows.streams(connections[self.using])

    @_translated(reads=True)
    def unfinished_sync(self) -> dict[str, float]:
        """Run id -> the time (epoch seconds) of its newest event, for every run that
        has started and not completed (the sweeper's question, in one query of the run
        index: :func:`~aaa_django.store.runindex.unfinished`)."""
        from .runindex import unfinished

        return unfinished(self.using)

    @_translated(reads=True)
    def running_sync(self, streams: Sequence[str]) -> set[str]:
        """Those of ``streams`` whose run has started and not ended, in one query of the
        run index (:class:`~aaa_django.events.KnowsRunning`;
        :func:`~aaa_django.store.runindex.running`)."""
        from .runindex import running

        return running(self.using, streams)

    @_translated(reads=True)
    def due_sync(self, now: float, limit: int = 500) -> list[tuple[str, int]]:
        """``(run id, seq)`` of the runs with a timer due by ``now`` (the run index's
        ``due_at``; the :class:`~aaa_django.celery.sweeper.DueIndex` protocol)."""
        from .runindex import due_runs

        return due_runs(self.using, now, limit)

    @_translated(reads=False)
    def settle_due_sync(self, run_id: str, seq: int, due: float | None) -> bool:
        """Set the run's next due time, as of its log at ``seq``."""
        from .runindex import settle_due

        return settle_due(self.using, run_id, seq, due)

    # -- snapshots ----------------------------------------------------------------

    @_translated(reads=True)
    def load_snapshot_sync(self, stream: str, name: str, version: int) -> Snapshot | None:
        with connections[self.using].cursor() as cur:  # plain SQL: a read on every adoption
            cur.execute(_LOAD_SNAPSHOT, [stream, name, version])
            row = cur.fetchone()
        return Snapshot(stream, name, version, row[0], row[1], row[2]) if row else None

    @_translated(reads=True)
    def read_from_snapshot_sync(self, stream: str, name: str, version: int) -> tuple[Snapshot | None, list[Event]]:
        """The snapshot ``(stream, name, version)`` and the stream's events from its seq
        on, in one query (see ``ReadsFromSnapshot``)."""
        conn = connections[self.using]
        with conn.cursor() as cur:
            sql = read_from_snapshot_sql(conn.vendor, prepares=prepares(conn.connection))
            cur.execute(sql, [stream, name, version])
            found = cur.fetchall()
        return from_snapshot_rows(stream, name, version, found, committed=not conn.in_atomic_block)

    @_translated(reads=False)
    def save_snapshot_sync(self, snapshot: Snapshot) -> bool:
        """Store ``snapshot`` unless one at the same or a later seq is stored already.

        A conditional UPDATE (only an older row is replaced), else an INSERT that yields
        to a row someone else inserted meanwhile; then the UPDATE again, which now tells
        whether that row is older. Racing savers cannot move the seq backwards (the
        WHERE clause, and the database trigger, refuse it). First save: 2 statements;
        a newer save: 1.
        """
        conn = connections[self.using]
        update, insert_ = snapshot_writes(snapshot, conn.ops.adapt_datetimefield_value(now()))
        with transaction.atomic(using=self.using), conn.cursor() as cur:
            for _ in range(2):
                cur.execute(*update)
                if cur.rowcount:
                    return True
                cur.execute(*insert_)
                if cur.rowcount:
                    return True
        return False  # a row at the same or a later seq is there


def from_snapshot_rows(
    stream: str, name: str, version: int, found: Sequence[Sequence[Any]], *, committed: bool
) -> tuple[Snapshot | None, list[Event]]:
    """The snapshot and the events in the rows of ``_READ_FROM_SNAPSHOT``."""
    if not found:
        return None, []
    seq, event_id, state = found[0][:3]
    if state is None:  # not the event at its seq first: a log whose seqs are not dense
        return None, []  # (the projection replays)
    events = to_events(found, 3)
    events.committed = committed
    return Snapshot(stream, name, version, seq, event_id, state), events


def _head_and_known(cur: CursorWrapper, pg: bool, stream: str, ids: list[str]) -> tuple[int, set[str]]:
    """The stream's head seq and which of ``ids`` are stored already (one round trip
    on PostgreSQL; SQLite is in-process, so two statements cost little)."""
    if pg:
        cur.execute(_HEAD_AND_KNOWN_PG, [stream, ids])
        head, stored = cur.fetchone()
        return head, set(stored)
    cur.execute(HEAD, [stream])
    row = cur.fetchone()
    known: set[str] = set()
    for i in range(0, len(ids), SQLITE_CHUNK):
        chunk = ids[i : i + SQLITE_CHUNK]
        cur.execute(f"SELECT id FROM aaa_event WHERE id IN ({', '.join(['%s'] * len(chunk))})", chunk)
        known.update(r[0] for r in cur.fetchall())
    return (row[0] if row else 0), known


def _lock_key(stream: str) -> int:
    # pg_advisory_xact_lock takes a signed 64-bit key; crc32 spreads streams well enough
    # (a collision only makes two streams' appenders wait for each other).
    return zlib.crc32(stream.encode()) - 2**31
