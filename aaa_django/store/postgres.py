"""The event store whose calls are awaits: :class:`PgEventStore`, the Django store
with its async methods on psycopg 3's async connections (PostgreSQL).

The Django store (:class:`~aaa_django.store.DjangoEventStore`) runs each async call
in Django's thread-sensitive executor: one thread per process, so concurrent runs
queue behind it. Here the engine's calls (``append``, ``read``, ``head``, the
snapshots) await the database on the store's own connections
(:mod:`aaa_django.store.connections`), many at once. The statements are the sync
store's (the same tables, triggers and run index; the one-statement append of
:mod:`aaa_django.store.appends`, run by an async cursor); what is not the common case (a
lost race, an index row behind its log, a large batch) takes the sync store's
transactional path, in Django's executor, as the Django store does.

Faults: psycopg's errors leave the async methods as the core's
:class:`~aaa_django.events.StoreUnavailable` (transient or not, see
:mod:`aaa_django.store.faults`), as the sync store's do; a lost connection drops the idle
ones too (opened before the outage, they are gone with it), so the next call connects
anew, and a read is tried once more on a new connection.

Transactions: the async methods run outside any transaction a caller opened (Django's
``atomic`` is sync-only; these are the store's own connections), and say so: their
results are ``committed``. A caller that wants events in its own transaction calls
the ``*_sync`` methods inside it, which join it as the Django store's do.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Coroutine, Sequence
from functools import wraps
from typing import TYPE_CHECKING, Any, Concatenate, ParamSpec, TypeVar

from django.db import IntegrityError
from django.utils.timezone import now

from aaa_django.events import Event, Snapshot, StoreUnavailable
from aaa_django.events.store import prepare_batch

from . import wakeups
from .appends import _READ_AND_ROW_PG, CATCH_UP, Steps
from .connections import PgConnections, async_capable
from .database import (
    _LOAD_SNAPSHOT,
    DjangoEventStore,
    from_snapshot_rows,
    read_from_snapshot_sql,
)
from .faults import connection_lost, translate, translated
from .groupcommit import GroupCommit
from .offload import Offload
from .rows import INSERT_CHUNK, EventList, prepares, select, to_events
from .runindex import index_events, running_queries

if TYPE_CHECKING:
    from psycopg import AsyncConnection
    from psycopg.rows import TupleRow

__all__ = ["PgEventStore", "site_store"]

_HEAD = "SELECT seq, id FROM aaa_event WHERE stream = %s ORDER BY seq DESC LIMIT 1"
# A snapshot's save: the row, or (a row of the key stored) its update where the stored
# one is older. ``rowcount`` 1: saved; 0: one at the same or a later seq is stored (the
# update's WHERE keeps it, so migration 0002's trigger never sees a seq go back).
_SNAPSHOT_UPSERT = (
    "INSERT INTO aaa_snapshot (stream, name, version, seq, event_id, state, saved_at) "
    "VALUES (%s, %s, %s, %s, %s, %s, %s) ON CONFLICT (stream, name, version) DO UPDATE "
    "SET seq = EXCLUDED.seq, event_id = EXCLUDED.event_id, state = EXCLUDED.state, "
    "saved_at = EXCLUDED.saved_at WHERE aaa_snapshot.seq < EXCLUDED.seq"
)


#: a store method's class, parameters and result (:func:`_translated`)
PS = TypeVar("PS", bound="PgEventStore")
P = ParamSpec("P")
T = TypeVar("T")


def _translated(
    *, reads: bool
) -> Callable[[Callable[Concatenate[PS, P], Awaitable[T]]], Callable[Concatenate[PS, P], Coroutine[Any, Any, T]]]:
    """Method decorator of the async methods: psycopg's errors leave as
    :class:`StoreUnavailable` (see the module); ``reads``, which change nothing, are
    tried once more when the connection was lost."""

    def wrap(fn: Callable[Concatenate[PS, P], Awaitable[T]]) -> Callable[Concatenate[PS, P], Coroutine[Any, Any, T]]:
        @wraps(fn)
        async def call(self: PS, *args: P.args, **kwargs: P.kwargs) -> T:
            return await translated(self._fault_of, reads, fn, self, *args, **kwargs)

        return call

    return wrap


def site_store(using: str = "default") -> DjangoEventStore:
    """The store a site's engines use on ``using``: :class:`PgEventStore` on
    PostgreSQL with psycopg 3, :class:`~aaa_django.store.sqlite.SqliteEventStore` on
    SQLite, else the Django store."""
    if async_capable(using):
        return PgEventStore(using)
    from .sqlite import SqliteEventStore, is_sqlite  # (it imports this module)

    return SqliteEventStore(using) if is_sqlite(using) else DjangoEventStore(using)


class PgEventStore(DjangoEventStore):
    """A :class:`~aaa_django.store.DjangoEventStore` whose engine calls (``append``,
    ``read``, ``head``, the snapshots) await PostgreSQL on the store's own psycopg
    connections (see the module); the others, and what these leave to the Django store
    (an append that is not the common case, a run's index row to catch up), run the
    sync methods by ``offload`` (default: Django's thread-sensitive executor; a Celery
    worker's db threads, :func:`aaa_django.celery.engines.build_worker_engine`).
    Where psycopg 3 does not reach the alias, every call is the Django store's.
    """

    def __init__(self, using: str = "default", *, offload: Offload | None = None, group_commit: bool = True) -> None:
        super().__init__(using, offload=offload)
        self.pg: PgConnections | None = None
        self.group: GroupCommit | None = None
        if not async_capable(using):
            return
        self.pg = PgConnections.of(using)
        if group_commit:
            self.group = GroupCommit(self)

    def __repr__(self) -> str:
        return f"PgEventStore(using={self.using!r})"

    @property
    def awaits(self) -> bool:
        """Do the engine's calls await the database on the store's own connections
        (psycopg 3 reaches the alias)?"""
        return self.pg is not None

    @property
    def conns(self) -> PgConnections:
        """The store's own connections (its calls are awaits on them)."""
        if self.pg is None:
            raise RuntimeError(f"{self!r}: psycopg 3 does not reach the alias; no connections of its own")
        return self.pg

    def _fault_of(self, exc: BaseException) -> tuple[StoreUnavailable | None, bool]:
        """The core's error for a psycopg error of the async connections (None: not
        one; Django's errors of the sync path come translated already, and a refused
        row is the caller's), and whether the connection was lost (then the idle ones
        are dropped: the next call connects anew)."""
        import psycopg

        if not isinstance(exc, psycopg.Error):
            return None, False
        lost = connection_lost(exc)
        if lost and self.pg is not None:
            self.pg.discard_idle()
        return translate(exc, StoreUnavailable), lost

    # -- events -------------------------------------------------------------------

    async def append(self, events: Sequence[Event], *, expected_seq: int | None = None) -> list[Event]:
        if self.pg is None:
            return await super().append(events, expected_seq=expected_seq)
        return await self._append(events, expected_seq=expected_seq)

    @_translated(reads=False)
    async def _append(self, events: Sequence[Event], *, expected_seq: int | None = None) -> list[Event]:
        stream, batch, texts = prepare_batch(events)  # raises before any write
        if not batch:
            return []
        stored = None
        if len(batch) <= INSERT_CHUNK:
            if self.group is not None:
                stored = await self.group.append(stream, batch, texts, expected_seq)
            else:
                stored = await self._append_statement(stream, batch, texts, expected_seq)
        if stored is None:
            # Not the common case: the Django store's transactional path decides.
            return await self._append_elsewhere(events, expected_seq=expected_seq)
        stored = EventList(stored)
        self._recent.add(stored)  # committed: a bus may send them along
        wakeups.notify_committed(
            self.using,
            [stream],  # (the general path notifies too)
            ended=wakeups.ended(stored),
        )
        return stored

    async def _append_elsewhere(self, events: Sequence[Event], *, expected_seq: int | None) -> list[Event]:
        """The Django store's transactional append (by :attr:`offload`)."""
        return await self.offload(self.append_sync, events, expected_seq=expected_seq)

    async def _append_statement(
        self, stream: str, batch: list[Event], texts: list[str], expected_seq: int | None
    ) -> list[Event] | None:
        """The common append alone: its statements in autocommit. None when it is not
        the common case, or lost a race (nothing written)."""
        try:
            async with self.conns.connection() as conn:
                return await self._run(conn, self._steps(stream, batch, texts, expected_seq, prepares=prepares(conn)))
        except IntegrityError:
            return None

    def _steps(
        self, stream: str, batch: list[Event], texts: list[str], expected_seq: int | None, *, prepares: bool
    ) -> Steps:
        """An append's statements, for a connection that prepares its statements or not."""
        return self._pg_steps(
            self.conns.django, stream, batch, texts, expected_seq, self._forget(stream), prepares=prepares
        )

    async def _run(
        self, conn: AsyncConnection[TupleRow], steps: Steps, *, in_group: list | None = None
    ) -> list[Event] | None:
        """Run an append's statements (see ``appends.Steps``) on ``conn``. Alone, a
        refused statement is the steps' to handle (autocommit: nothing to undo); in a
        group (``in_group``: where the rows to catch up go, after the commit) it raises
        (the group rolls the append back to its savepoint)."""
        import psycopg

        async with conn.cursor() as cur:
            try:
                step = next(steps)
                while True:
                    sql, params = step
                    if sql is CATCH_UP:  # rare: the run's row moved meanwhile
                        if in_group is not None:
                            in_group.append(params)
                        else:
                            await self._catch_up(params)
                        step = steps.send(None)
                        continue
                    try:
                        await cur.execute(sql, params)
                    except psycopg.IntegrityError as exc:
                        if in_group is not None:
                            raise IntegrityError(str(exc)) from exc
                        step = steps.throw(IntegrityError(str(exc)))
                        continue
                    first = await cur.fetchone() if cur.description else None
                    step = steps.send((cur.rowcount, first))
            except StopIteration as done:
                return done.value

    async def _catch_up(self, stored: list[Event]) -> None:
        """The run's index row caught up with committed ``stored`` (the sync run index)."""

        await self.offload(index_events, self.using, stored)

    async def read(
        self, stream: str, *, after: int = 0, limit: int | None = None, tenant: str | None = None
    ) -> list[Event]:
        if self.pg is None:
            return await super().read(stream, after=after, limit=limit, tenant=tenant)
        return await self._read(stream, after=after, limit=limit, tenant=tenant)

    @_translated(reads=True)
    async def _read(
        self, stream: str, *, after: int = 0, limit: int | None = None, tenant: str | None = None
    ) -> list[Event]:
        if limit is None and tenant is None:
            # To the head: with the run's index row, what the next append starts from.
            rows = await self._fetch(_READ_AND_ROW_PG, [stream, stream, after])
            return self._read_rows(stream, rows, committed=True)
        sql, params = f"{select('postgresql')} WHERE stream = %s AND seq > %s", [stream, after]
        if tenant is not None:
            sql += " AND tenant = %s"
            params.append(tenant)
        sql += " ORDER BY seq"
        if limit is not None:
            sql += " LIMIT %s"
            params.append(max(int(limit), 0))
        return to_events(await self._fetch(sql, params))

    async def head(self, stream: str) -> tuple[int, str] | None:
        if self.pg is None:
            return await super().head(stream)
        return await self._head(stream)

    @_translated(reads=True)
    async def _head(self, stream: str) -> tuple[int, str] | None:
        rows = await self._fetch(_HEAD, [stream])
        return (rows[0][0], rows[0][1]) if rows else None

    async def running(self, streams: Sequence[str]) -> set[str]:
        if self.pg is None:
            return await super().running(streams)
        return await self._running(streams)

    @_translated(reads=True)
    async def _running(self, streams: Sequence[str]) -> set[str]:
        out: set[str] = set()
        for sql, params in running_queries(streams, pg=True):
            out.update(row[0] for row in await self._fetch(sql, params))
        return out

    async def _fetch(self, sql: str, params: Sequence[object]) -> list[tuple]:
        async with self.conns.connection() as conn, conn.cursor() as cur:
            await cur.execute(sql, params)
            return await cur.fetchall()

    # -- snapshots ----------------------------------------------------------------

    async def load_snapshot(self, stream: str, name: str, version: int) -> Snapshot | None:
        if self.pg is None:
            return await super().load_snapshot(stream, name, version)
        return await self._load_snapshot(stream, name, version)

    @_translated(reads=True)
    async def _load_snapshot(self, stream: str, name: str, version: int) -> Snapshot | None:
        rows = await self._fetch(_LOAD_SNAPSHOT, [stream, name, version])
        return Snapshot(stream, name, version, *rows[0]) if rows else None

    async def read_from_snapshot(self, stream: str, name: str, version: int) -> tuple[Snapshot | None, list[Event]]:
        if self.pg is None:
            return await super().read_from_snapshot(stream, name, version)
        return await self._read_from_snapshot(stream, name, version)

    @_translated(reads=True)
    async def _read_from_snapshot(self, stream: str, name: str, version: int) -> tuple[Snapshot | None, list[Event]]:
        async with self.conns.connection() as conn, conn.cursor() as cur:
            await cur.execute(read_from_snapshot_sql("postgresql", prepares=prepares(conn)), [stream, name, version])
            found = await cur.fetchall()
        return from_snapshot_rows(stream, name, version, found, committed=True)

    async def save_snapshot(self, snapshot: Snapshot) -> bool:
        if self.pg is None:
            return await super().save_snapshot(snapshot)
        return await self._save_snapshot(snapshot)

    @_translated(reads=False)
    async def _save_snapshot(self, snapshot: Snapshot) -> bool:
        """As :meth:`DjangoEventStore.save_snapshot_sync` (stored unless one at the same
        or a later seq is), in one statement in autocommit: an INSERT whose conflict
        with the stored row updates it only where it is older (one round trip, where
        the sync store's transaction of a conditional UPDATE and an INSERT takes three
        or four; racing savers meet at the unique key, and the seq never goes back)."""
        async with self.conns.connection() as conn, conn.cursor() as cur:
            await cur.execute(
                _SNAPSHOT_UPSERT,
                [
                    snapshot.stream,
                    snapshot.name,
                    snapshot.version,
                    snapshot.seq,
                    snapshot.event_id,
                    snapshot.state,
                    self.conns.django.ops.adapt_datetimefield_value(now()),
                ],
            )
            return cur.rowcount == 1
