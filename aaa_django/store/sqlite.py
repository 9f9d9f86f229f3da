"""The event store on SQLite whose calls hop no thread of asgiref's:
:class:`SqliteEventStore`, the Django store with its async methods on an ``sqlite3``
connection of its own.

The Django store (:class:`~aaa_django.store.DjangoEventStore`) runs each async call in
Django's thread-sensitive executor (``sync_to_async``): a hand-off to another thread
and back per call, which cost a ToolLoop turn about as much as its SQL did
(benchmarks/profile_turn_sqlite.py). Here the engine's calls (``append``, ``read``,
``head``, the snapshots) run on the store's own connection to the alias's database
file, opened as Django opens its own (``get_connection_params`` and
``get_new_connection`` of the alias's backend: the file, ``OPTIONS`` such as
``timeout`` and ``init_command`` with its PRAGMAs, the converters), one per alias
and process, in autocommit. Where they run (``own_thread``): on one plain thread the
connection owns (``loop.run_in_executor`` on a ``ThreadPoolExecutor(1)``; the default)
or on the calling thread, blocking its loop for each call (``own_thread=False``). See
benchmarks/profile_turn_sqlite.py --compare for what each costs (``docs/waiting.md`` says
why the default is what it is).

The statements are the sync store's: the one-transaction append of
:mod:`aaa_django.store.appends` (``BEGIN IMMEDIATE``, one query, the INSERT and the
run row's UPDATE, ``COMMIT``) on the driver's cursor, the reads and snapshots of
:mod:`aaa_django.store.database`, rows decoded by :mod:`aaa_django.store.rows`. What
is not the common case (an index row behind its log, a large batch, a lost race, a
read of a page or of one tenant) takes the sync store's path, in Django's executor,
as the Django store does. A run's first events make its index row by a plain
``INSERT`` in the same transaction (``runindex.row_insert``, as on PostgreSQL).

Group commit (on the store's thread): appends that arrive while the thread is busy
wait together and go as one transaction, one savepoint each and one ``COMMIT`` (one
fsync for them all); one refused fails alone (see :meth:`SqliteConnection.append`).

A caller alone (``caller_alone``: the engine, when the append is all it has going):
its append is made on the calling thread when the store's thread has none to make
and the write lock is free at once (:meth:`SqliteConnection.append_here`), with no
hand-off to the thread and back; the loop waits for its commit, having nothing else
to do. Otherwise, on the thread as above.

SQLite has one writer at a time: an append waits for the write lock (another
process's, or Django's connection in this one) up to the alias's busy timeout
(``OPTIONS["timeout"]``, 5 s by default), then leaves as a lost race that the sync
path tries again. On the calling thread (``own_thread=False``) that wait, and each
commit's fsync, block the event loop; on the store's thread they do not (a caller
alone's append never waits for the lock: it goes to the thread instead).

Transactions: as :class:`~aaa_django.store.postgres.PgEventStore`'s, these calls run
outside any transaction a caller opened, and their results are ``committed``; a
caller that wants events in its own transaction calls the ``*_sync`` methods inside
it. Faults leave as :class:`~aaa_django.events.StoreUnavailable`
(:mod:`aaa_django.store.faults`); a connection that failed for a reason other than a
busy lock is closed, the next call opens it again, and a read is tried once more.
"""

from __future__ import annotations

import asyncio
import enum
import os
import sqlite3
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Final, Literal, TypeVar, TypeVarTuple

from django.db import Error as DatabaseDriverError
from django.db import IntegrityError, InterfaceError, connections
from django.utils.timezone import now

from aaa_django.events import Event, Snapshot, StoreUnavailable
from aaa_django.events.store import caller_alone, prepare_batch

from .appends import _qmark, _sqlite_transaction
from .database import (
    _LOAD_SNAPSHOT,
    DjangoEventStore,
    from_snapshot_rows,
    read_from_snapshot_sql,
    snapshot_writes,
)
from .faults import contention, translate, translated
from .offload import Offload
from .rows import SQLITE_CHUNK, EventList, closed_refusal, select, to_events
from .runindex import running_queries

__all__ = ["SqliteConnection", "SqliteEventStore", "close_all", "is_sqlite"]

_READ = _qmark(f"{select('sqlite')} WHERE stream = %s AND seq > %s ORDER BY seq")
_HEAD = "SELECT seq, id FROM aaa_event WHERE stream = ? ORDER BY seq DESC LIMIT 1"

#: a call's result and its arguments after the connection (:meth:`SqliteConnection.run`)
T = TypeVar("T")
Ts = TypeVarTuple("Ts")

#: alias -> the process's connection to it (one, whatever the number of stores)
_BY_ALIAS: dict[str, SqliteConnection] = {}
_BY_ALIAS_LOCK = threading.Lock()


def is_sqlite(using: str) -> bool:
    """Is ``using`` an SQLite database (Django's backend)?"""
    return connections.settings[using]["ENGINE"] == "django.db.backends.sqlite3"


class SqliteConnection:
    """The stores' own ``sqlite3`` connection to one alias in this process, its lock
    (one call at a time), and the thread that runs the calls of stores with
    ``own_thread``."""

    def __init__(self, using: str) -> None:
        self.using = using
        #: a Django connection of the alias that never connects: the parameters the
        #: store connects with, its ``ops`` for the statements' values, and its
        #: translation of the driver's errors (``wrap_database_errors``)
        self.django = connections.create_connection(using)
        self.raw: sqlite3.Connection | None = None
        self.opened = 0  # connections opened so far (tests)
        self._lock = threading.Lock()
        self._executor: ThreadPoolExecutor | None = None
        #: appends waiting for the thread (see :meth:`append`), and whether a drain
        #: of them is queued on it
        self._pending: list[_Append] = []
        self._draining = False
        self._pending_lock = threading.Lock()
        self.groups = 0  # transactions of more than one append so far (tests, benchmarks)
        #: the connection's busy timeout (ms: ``OPTIONS["timeout"]``), and the appends
        #: made on the calling thread so far (see :meth:`append_here`; tests, benchmarks)
        self.busy_ms = 0
        self.here = 0
        #: the busy timeout the connection has now (ms; see :meth:`_busy`)
        self._busy_now = 0

    @classmethod
    def of(cls, using: str) -> SqliteConnection:
        """The process's connection to ``using``."""
        with _BY_ALIAS_LOCK:
            found = _BY_ALIAS.get(using)
            if found is None:
                found = _BY_ALIAS[using] = cls(using)
            return found

    def executor(self) -> ThreadPoolExecutor:
        """The one thread that runs the calls of stores with ``own_thread``."""
        executor = self._executor
        if executor is None:
            with self._lock:
                if self._executor is None:
                    self._executor = ThreadPoolExecutor(1, thread_name_prefix=f"aaa-sqlite-{self.using}")
                executor = self._executor
        return executor

    def open(self) -> sqlite3.Connection:
        """The connection, opened as Django opens the alias's (on a thread without a
        running event loop: Django's ``get_new_connection`` refuses one that has)."""
        with self._lock:
            if self.raw is None:
                django = self.django
                raw = django.get_new_connection(django.get_connection_params())
                raw.isolation_level = None  # autocommit: the statements say BEGIN
                self.busy_ms = self._busy_now = int(raw.execute("PRAGMA busy_timeout").fetchone()[0])
                self.raw, self.opened = raw, self.opened + 1
            return self.raw

    def _busy(self, raw: sqlite3.Connection, ms: int) -> None:
        """(Holding the lock.) The connection's busy timeout made ``ms``, unless it is
        already: :meth:`append_here` takes the write lock with a timeout of 0 and
        leaves it so, and every other call sets the alias's back first. (Set and
        restored around each ``BEGIN IMMEDIATE``, two PRAGMAs cost a run alone 0.028 ms
        an append, a tenth of it; benchmarks/ab_turn.py --db sqlite.)"""
        if self._busy_now != ms:
            raw.execute(f"PRAGMA busy_timeout = {ms}")
            self._busy_now = ms

    def run(self, fn: Callable[[sqlite3.Connection, *Ts], T], *args: *Ts) -> T:
        """``fn(connection, *args)``, one call at a time, the driver's errors as
        Django's (the same classes as the sync store's, the driver's as the cause),
        with the alias's busy timeout."""
        with self._lock, self.django.wrap_database_errors:
            raw = self.raw
            if raw is None:
                raise InterfaceError("the store's SQLite connection is not open")
            self._busy(raw, self.busy_ms)
            return fn(raw, *args)

    def append(
        self, store: SqliteEventStore, stream: str, batch: list[Event], texts: list[str], expected_seq: int | None
    ) -> asyncio.Future[list[Event] | None]:
        """The one-transaction append of ``batch`` on the thread, as a future of the
        calling loop. Appends that arrive while the thread is busy wait together and
        go as one group: one ``BEGIN IMMEDIATE``, each append's statements inside a
        savepoint of its own, one ``COMMIT`` (one fsync for them all). An append
        refused by its own checks, or by the database, is rolled back to its
        savepoint and fails alone; when the group's transaction itself fails (the
        lock not taken, the commit refused) each of its appends is made again by the
        Django store's path (None: ids are idempotent)."""
        loop = asyncio.get_running_loop()
        future = loop.create_future()
        with self._pending_lock:
            self._pending.append(_Append(loop, future, store, stream, batch, texts, expected_seq))
            if self._draining:
                return future
            self._draining = True
        self.executor().submit(self._drain)
        return future

    def append_here(
        self, store: SqliteEventStore, stream: str, batch: list[Event], texts: list[str], expected_seq: int | None
    ) -> list[Event] | None | Literal[_NotNow.NOT_NOW]:
        """The one-transaction append of ``batch`` made on the calling thread, which
        waits for it (its commit's fsync included), if nothing else wants the
        connection or the database now: the store's thread has no append to make,
        the connection is free, and the write lock is taken at once (the busy timeout
        is 0 for the ``BEGIN IMMEDIATE``: another writer holding the lock never makes
        the caller wait). :data:`NOT_NOW` otherwise, having done nothing: the thread
        makes it. For a caller whose loop has nothing else to do (``caller_alone``)."""
        raw = self.raw
        if raw is None or self._draining or not self._lock.acquire(blocking=False):
            return NOT_NOW
        errors = self.django.wrap_database_errors
        try:
            try:
                with errors:
                    self._busy(raw, 0)  # (left so for the next: see _busy)
                    raw.execute("BEGIN IMMEDIATE")
            except DatabaseDriverError as exc:
                if not contention(exc):
                    raise
                return NOT_NOW  # another writer has the lock: the thread waits for it
            self.here += 1
            with errors:
                cur = raw.cursor()
                try:
                    return _sqlite_transaction(
                        store, self.django, cur, raw, stream, batch, texts, expected_seq, _qmark, begun=True
                    )
                finally:
                    cur.close()
        finally:
            self._lock.release()

    def _drain(self) -> None:
        """(On the thread.) The appends waiting now, as one group (at most
        :data:`GROUP`; the rest after the thread's other calls queued meanwhile)."""
        with self._pending_lock:
            group, self._pending = self._pending[:GROUP], self._pending[GROUP:]
        try:
            if self.raw is None:
                self.open()
            if len(group) == 1:
                item = group[0]
                try:
                    item.settle(
                        self.run(_append_now, item.store, item.stream, item.batch, item.texts, item.expected_seq)
                    )
                except Exception as exc:
                    item.settle(None, exc)
            else:
                with self._lock:
                    self._append_group(group)
        except Exception as exc:  # not opened: every one of them fails with it
            for item in group:
                item.settle(None, exc)
        finally:
            with self._pending_lock:
                if self._pending:
                    self.executor().submit(self._drain)
                else:
                    self._draining = False
            # Told after the thread is free again: a caller whose append is done finds
            # the connection idle (its next append alone may be made on its own thread).
            for item in group:
                item.deliver()

    def _append_group(self, group: list[_Append]) -> None:
        raw, errors = self.raw, self.django.wrap_database_errors
        assert raw is not None  # (opened by the drain)
        try:
            with errors:
                self._busy(raw, self.busy_ms)
                raw.execute("BEGIN IMMEDIATE")
        except Exception as exc:  # the lock not taken: a lost race each
            for item in group:
                item.settle(None, exc)
            return
        results: list[tuple[_Append, list[Event] | None, BaseException | None]] = []
        for item in group:
            try:
                with errors:
                    raw.execute("SAVEPOINT aaa_append")
                    try:
                        cur = raw.cursor()
                        stored = item.store._write_sqlite(
                            self.django, cur, item.stream, item.batch, item.texts, item.expected_seq, _qmark
                        )
                        cur.close()
                    except BaseException:
                        item.store._forget(item.stream)  # (the hint its statements left)
                        if raw.in_transaction:
                            raw.execute("ROLLBACK TO aaa_append")
                            raw.execute("RELEASE aaa_append")
                        raise
                    if stored is None:  # not the common case: nothing of it stays
                        item.store._forget(item.stream)
                        raw.execute("ROLLBACK TO aaa_append")
                    raw.execute("RELEASE aaa_append")
                results.append((item, stored, None))
            except Exception as exc:
                results.append((item, None, exc))
                if not raw.in_transaction:  # SQLite ended the group's transaction itself
                    break
        try:
            if not raw.in_transaction:
                raise InterfaceError("the group's transaction ended before its COMMIT")
            with errors:
                raw.execute("COMMIT")
        except Exception:
            if raw.in_transaction:
                raw.execute("ROLLBACK")
            for item in group:  # (the hints their statements left)
                item.store._forget(item.stream)
            # Nothing of the group stays: each append not refused alone is made again
            # by the Django store's path (None).
            results = [(item, None, err if err is not None and _refused(err) else None) for item, _, err in results]
        done = {id(item) for item, _, _ in results}
        self.groups += 1
        for item, stored, err in results:
            item.settle(stored, err)
        for item in group:  # after a transaction SQLite ended: made again elsewhere
            if id(item) not in done:
                item.settle(None)

    def discard(self) -> None:
        """Close the connection (it failed): the next call opens a new one."""
        with self._lock:
            raw, self.raw = self.raw, None
        if raw is not None:
            try:
                raw.close()
            except Exception:  # closing a broken connection: nothing to do
                pass

    def close(self) -> None:
        """Close the connection and end the thread (when nothing uses them)."""
        self.discard()
        executor, self._executor = self._executor, None
        if executor is not None:
            executor.shutdown(wait=True)

    def _forked(self) -> None:
        # In a forked child: the parent's connection and thread are the parent's
        # (dropped unclosed: SQLite's locks are per process), its lock may be held.
        self.raw, self._executor, self._lock = None, None, threading.Lock()
        self._pending, self._draining, self._pending_lock = [], False, threading.Lock()


#: appends in one group commit at the most
GROUP = 100


class _NotNow(enum.Enum):
    NOT_NOW = "not now"


#: :meth:`SqliteConnection.append_here` did nothing: the thread makes the append
NOT_NOW: Final = _NotNow.NOT_NOW


class _Append:
    """An append waiting for the thread, and the future its caller awaits."""

    __slots__ = ("loop", "future", "store", "stream", "batch", "texts", "expected_seq", "outcome")

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        future: asyncio.Future,
        store: SqliteEventStore,
        stream: str,
        batch: list[Event],
        texts: list[str],
        expected_seq: int | None,
    ) -> None:
        self.loop, self.future, self.store = loop, future, store
        self.stream, self.batch, self.texts, self.expected_seq = stream, batch, texts, expected_seq
        #: what the caller is told (:meth:`deliver`): the first :meth:`settle`'s
        self.outcome: tuple[list[Event] | None, BaseException | None] | None = None

    def settle(self, stored: list[Event] | None, exc: BaseException | None = None) -> None:
        """(On the thread.) What the caller will be told, if nothing was decided yet."""
        if self.outcome is None:
            self.outcome = (stored, exc)

    def deliver(self) -> None:
        """(On the thread, after the drain.) The caller's future done, on its loop."""
        outcome = self.outcome
        if outcome is None:  # (never the case: every path settles its appends)
            outcome = (None, InterfaceError("the append was not made"))
        try:
            self.loop.call_soon_threadsafe(_settle, self.future, *outcome)
        except RuntimeError:  # its loop is closed: nobody waits
            pass


def _settle(future: asyncio.Future[list[Event] | None], stored: list[Event] | None, exc: BaseException | None) -> None:
    if future.done():  # cancelled meanwhile
        return
    if exc is not None:
        future.set_exception(exc)
    else:
        future.set_result(stored)


def _refused(exc: BaseException) -> bool:
    """Was ``exc`` an append's own refusal (its checks, a closed stream), not the
    group's?"""
    return not isinstance(exc, DatabaseDriverError) or isinstance(exc, IntegrityError)


def close_all() -> None:
    """Close the stores' SQLite connections (before a test database is removed; at a
    process's orderly end)."""
    with _BY_ALIAS_LOCK:
        every = list(_BY_ALIAS.values())
    for conn in every:
        conn.close()


def _after_fork() -> None:
    for conn in list(_BY_ALIAS.values()):
        conn._forked()


os.register_at_fork(after_in_child=_after_fork)


class SqliteEventStore(DjangoEventStore):
    """A :class:`~aaa_django.store.DjangoEventStore` whose async methods run on the
    store's own SQLite connection, with no hop to Django's executor (see the module).

    ``own_thread``: the calls run on the connection's one thread (the default; the
    loop awaits them) or, False, on the calling thread (the loop waits for each:
    for its commit's fsync, and for the write lock up to the busy timeout).
    ``here_when_alone`` (with ``own_thread``): an append whose caller has nothing else
    for its loop to do (``caller_alone``) is made on the calling thread when the
    thread and the write lock are free at once (:meth:`SqliteConnection.append_here`;
    False: every append on the thread).
    What is not the common case, and the calls other than the engine's, run the sync
    methods by ``offload`` (default: Django's thread-sensitive executor). On an alias
    that is not SQLite, every call is the Django store's.
    """

    def __init__(
        self,
        using: str = "default",
        *,
        offload: Offload | None = None,
        own_thread: bool = True,
        here_when_alone: bool = True,
    ) -> None:
        super().__init__(using, offload=offload)
        self.db: SqliteConnection | None = None
        self.own_thread = own_thread
        self.here_when_alone = here_when_alone
        if is_sqlite(using):
            self.db = SqliteConnection.of(using)

    def __repr__(self) -> str:
        return f"SqliteEventStore(using={self.using!r})"

    async def _call(self, fn: Callable[[sqlite3.Connection, *Ts], T], *args: *Ts, reads: bool) -> T:
        """``fn(connection, *args)`` on the store's connection, where ``own_thread``
        says; its database errors as :class:`StoreUnavailable` (a refused row's as
        they are), and ``reads``, which change nothing, tried once more on a new
        connection when the one they ran on was closed for a fault."""
        return await translated(self._fault_of, reads, lambda: self._on_connection(fn, *args))

    async def _on_connection(self, fn: Callable[[sqlite3.Connection, *Ts], T], *args: *Ts) -> T:
        db = self.db
        assert db is not None
        if self.own_thread:
            return await asyncio.get_running_loop().run_in_executor(db.executor(), _opened_run, db, fn, args)
        if db.raw is None:
            await asyncio.to_thread(db.open)
        return db.run(fn, *args)

    def _fault_of(self, exc: BaseException) -> tuple[StoreUnavailable | None, bool]:
        """The core's error for a database error of the store's connection (None: not
        one, or a refused row, the caller's), and whether the connection was closed
        for it (anything but a busy lock: the next call opens it anew)."""
        if not isinstance(exc, DatabaseDriverError):
            return None, False
        lost = not isinstance(exc, IntegrityError) and not contention(exc)
        if lost and self.db is not None:
            self.db.discard()
        return translate(exc, StoreUnavailable), lost

    # -- events -------------------------------------------------------------------

    async def append(self, events: Sequence[Event], *, expected_seq: int | None = None) -> list[Event]:
        if self.db is None:
            return await super().append(events, expected_seq=expected_seq)
        stream, batch, texts = prepare_batch(events)  # raises before any write
        if not batch:
            return []
        stored: list[Event] | None = None
        if len(batch) <= SQLITE_CHUNK:
            try:
                if self.own_thread:
                    assert self.db is not None
                    # The caller's loop has nothing else to do: made here, without the
                    # hand-off to the thread and back (unless the thread or the lock is busy).
                    here = (
                        self.db.append_here(self, stream, batch, texts, expected_seq)
                        if self.here_when_alone and caller_alone.get()
                        else NOT_NOW
                    )
                    stored = await self.db.append(self, stream, batch, texts, expected_seq) if here is NOT_NOW else here
                else:
                    stored = await self._on_connection(_append_now, self, stream, batch, texts, expected_seq)
            except DatabaseDriverError as exc:
                closed = closed_refusal(stream, exc) if isinstance(exc, IntegrityError) else None
                if closed is not None:  # a run that has ended, or was erased: final
                    raise closed from exc
                if not (isinstance(exc, IntegrityError) or contention(exc)):
                    # an outage or a refusal, not a race (not tried again: whether a
                    # failed commit committed is the caller's retry to find out)
                    fault = self._fault_of(exc)[0]
                    if fault is None:
                        raise
                    raise fault from exc
                # a lost race: the sync path decides again (and waits its turn)
        if stored is None:
            return await self._append_elsewhere(events, expected_seq=expected_seq)
        stored = EventList(stored)
        self._recent.add(stored)  # committed: a bus may send them along
        # (No database notice: ``wakeups.notify`` has listeners on PostgreSQL only, and
        # asking it costs an append a lookup of Django's connection, a thread-local.)
        return stored

    async def _append_elsewhere(self, events: Sequence[Event], *, expected_seq: int | None) -> list[Event]:
        """The Django store's transactional append (by :attr:`offload`)."""
        return await self.offload(self.append_sync, events, expected_seq=expected_seq)

    async def read(
        self, stream: str, *, after: int = 0, limit: int | None = None, tenant: str | None = None
    ) -> list[Event]:
        if self.db is None or limit is not None or tenant is not None:  # (a page: not the engine's)
            return await super().read(stream, after=after, limit=limit, tenant=tenant)
        return to_events(await self._call(_fetch, _READ, [stream, after], reads=True))

    async def head(self, stream: str) -> tuple[int, str] | None:
        if self.db is None:
            return await super().head(stream)
        rows = await self._call(_fetch, _HEAD, [stream], reads=True)
        return (rows[0][0], rows[0][1]) if rows else None

    async def running(self, streams: Sequence[str]) -> set[str]:
        if self.db is None:
            return await super().running(streams)
        out: set[str] = set()
        for sql, params in running_queries(streams, pg=False):
            out.update(row[0] for row in await self._call(_fetch, _qmark(sql), params, reads=True))
        return out

    # -- snapshots ----------------------------------------------------------------

    async def load_snapshot(self, stream: str, name: str, version: int) -> Snapshot | None:
        if self.db is None:
            return await super().load_snapshot(stream, name, version)
        rows = await self._call(_fetch, _qmark(_LOAD_SNAPSHOT), [stream, name, version], reads=True)
        return Snapshot(stream, name, version, *rows[0]) if rows else None

    async def read_from_snapshot(self, stream: str, name: str, version: int) -> tuple[Snapshot | None, list[Event]]:
        if self.db is None:
            return await super().read_from_snapshot(stream, name, version)
        found = await self._call(_fetch, _qmark(read_from_snapshot_sql("sqlite")), [stream, name, version], reads=True)
        return from_snapshot_rows(stream, name, version, found, committed=True)

    async def save_snapshot(self, snapshot: Snapshot) -> bool:
        """As :meth:`DjangoEventStore.save_snapshot_sync`, under the write lock: the
        conditional UPDATE, else the INSERT (nobody can insert in between)."""
        if self.db is None:
            return await super().save_snapshot(snapshot)
        writes = snapshot_writes(snapshot, self.db.django.ops.adapt_datetimefield_value(now()))
        return await self._call(_save, writes, reads=False)


def _opened_run(db: SqliteConnection, fn: Callable[[sqlite3.Connection, *Ts], T], args: tuple[*Ts]) -> T:
    if db.raw is None:
        db.open()
    return db.run(fn, *args)


def _fetch(raw: sqlite3.Connection, sql: str, params: Sequence[object]) -> list[tuple]:
    return raw.execute(sql, params).fetchall()


def _append_now(
    raw: sqlite3.Connection,
    store: SqliteEventStore,
    stream: str,
    batch: list[Event],
    texts: list[str],
    expected_seq: int | None,
) -> list[Event] | None:
    """The one-transaction append of :mod:`aaa_django.store.appends` on ``raw``."""
    assert store.db is not None
    cur = raw.cursor()
    try:
        return _sqlite_transaction(store, store.db.django, cur, raw, stream, batch, texts, expected_seq, _qmark)
    finally:
        cur.close()


def _save(raw: sqlite3.Connection, writes: tuple[tuple[str, list], tuple[str, list]]) -> bool:
    raw.execute("BEGIN IMMEDIATE")
    try:
        saved = any(raw.execute(_qmark(sql), params).rowcount for sql, params in writes)
    except BaseException:
        if raw.in_transaction:
            raw.execute("ROLLBACK")
        raise
    raw.execute("COMMIT")
    return saved
