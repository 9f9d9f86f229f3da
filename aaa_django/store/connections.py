"""The async PostgreSQL connections of the event store: psycopg 3's ``AsyncConnection``,
built from Django's ``DATABASES`` entry, so an await is a database call and no
thread hop.

The parameters are the ones Django itself connects with
(``DatabaseWrapper.get_connection_params()``: the name, user, host, ``OPTIONS``, and
Django's adapters, so rows load as they do through the ORM), read when a connection
is opened (a test database's name is the current one). Django is not patched and
its own connections are left alone: these are the store's, in autocommit, one per
concurrent call, at most ``size`` per event loop.

Prepared statements: Django turns psycopg's off (``prepare_threshold`` None) so that a
pooler in transaction mode keeps working (PgBouncer before 1.21 hands a statement
prepared on one server connection to whichever serves the next transaction: an error,
or another client's statement of the same name). These connections prepare theirs
(psycopg's default threshold, :data:`PREPARE_THRESHOLD`) when nothing pools them:
when the backend that answers ``pg_backend_pid()`` is the one whose key the server
sent at connect (a pooler sends a key of its own, for it must route cancels itself;
PgBouncer, pgcat, Supavisor and Odyssey do), and the alias does not say it is pooled
(``DISABLE_SERVER_SIDE_CURSORS``, which Django asks of sites behind a transaction
pooler). A ``prepare_threshold`` in the alias's ``OPTIONS`` decides instead (None: never).
Preparing saves the server the parse and plan of each statement: on this project's
machine a snapshot with the 50 events after it read in 0.70-0.76x the time, a ToolLoop
turn 0.89-0.93x, appends of 8 runs at once 0.61x (``benchmarks/ab_write_path.py --prepared``).

A connection whose call was interrupted (cancelled mid-statement: psycopg's view of
what the server holds, its prepared statements', may be off) or whose server no longer
holds a statement it prepared (:data:`PREPARED_LOST`) is never used again: the next
call connects anew. (Found with 200 runs on a Celery worker: a connection believing in
a statement its server never prepared failed every call it served.) Nor is one that
prepares and whose pipeline failed (``connection(pipelined=True)``, the group commit's:
psycopg may count a statement prepared whose Parse the server skipped there); the
group's BEGIN, COMMIT and ROLLBACK are never prepared.

Why not ``psycopg_pool``: its async pool belongs to the event loop that opened it
(its workers are tasks of that loop), while one store serves every loop of its
process (the web process's engine host, ``async_to_sync``'s loop of each call, the
tests' threads). A psycopg connection is used by one call at a time and waits on
whichever loop is running, so the idle connections here are shared by every loop;
only the bound on connections in use is per loop.
"""

from __future__ import annotations

import asyncio
import os
import threading
import weakref
from typing import TYPE_CHECKING

from django.db import connections

if TYPE_CHECKING:
    from psycopg import AsyncConnection
    from psycopg.rows import TupleRow

#: alias -> the process's connections to it (one set, whatever the number of stores)
_BY_ALIAS: dict[str, PgConnections] = {}
_BY_ALIAS_LOCK = threading.Lock()
#: connections in use at once per event loop, by default
SIZE = 10
#: how many times a statement runs before a connection nothing pools prepares it
#: (psycopg's own default; see the module)
PREPARE_THRESHOLD = 5
#: SQLSTATEs of a prepared statement the connection and its server disagree about
#: (does not exist, exists already): the connection is dropped
PREPARED_LOST = ("26000", "42P05")
#: libpq's TCP parameters of the store's connections (the alias's ``OPTIONS`` win): a
#: server that went silent (a partition, a machine lost) is found by keepalives after
#: 2 + 3 x 1 s, and a statement whose packets go unacknowledged for 5 s fails, instead
#: of waiting for the kernel's retransmissions (about 15 minutes)
TCP_OPTIONS = {
    "keepalives": 1,
    "keepalives_idle": 2,
    "keepalives_interval": 1,
    "keepalives_count": 3,
    "tcp_user_timeout": 5000,
}


def application_name() -> str:
    """The ``application_name`` of this process's store connections (unless the alias's
    ``OPTIONS`` name one): the server's ``pg_stat_activity`` tells them from Django's,
    process by process."""
    return f"aaa_django store {os.getpid()}"


def reusable_after(exc: BaseException | None) -> bool:
    """May a connection whose call ended with ``exc`` (None: it returned) serve another?
    Not after an interruption (not an ``Exception``: cancelled, KeyboardInterrupt), nor
    after an error that shows its prepared statements out of step with its server
    (:data:`PREPARED_LOST`, the error or its direct cause)."""
    if exc is None:
        return True
    if not isinstance(exc, Exception):
        return False
    # psycopg's error, or the error raised from it (as faults.translate reads them)
    code = getattr(exc, "sqlstate", None) or getattr(exc.__cause__, "sqlstate", None)
    return code not in PREPARED_LOST


def prepare_threshold(settings_dict: dict, key_pid: int, backend_pid: int) -> int | None:
    """The ``prepare_threshold`` of a store connection to the alias of ``settings_dict``
    whose server sent ``key_pid`` at connect and whose statements run in backend
    ``backend_pid`` (see the module): the alias's ``OPTIONS`` if they name one, else
    None when the alias says it is pooled or a pooler answered the connect, else
    :data:`PREPARE_THRESHOLD`."""
    options = settings_dict.get("OPTIONS") or {}
    if "prepare_threshold" in options:
        return options["prepare_threshold"]
    if settings_dict.get("DISABLE_SERVER_SIDE_CURSORS") or key_pid != backend_pid:
        return None
    return PREPARE_THRESHOLD


def async_capable(using: str) -> bool:
    """Is ``using`` a PostgreSQL database that psycopg 3 reaches (its async
    connections then serve the store)?"""
    if connections.settings[using]["ENGINE"] != "django.db.backends.postgresql":
        return False
    try:
        from django.db.backends.postgresql.psycopg_any import is_psycopg3
    except ImportError:  # pragma: no cover - no driver at all
        return False
    return bool(is_psycopg3)


class PgConnections:
    """The store's async connections to one database alias (see the module)."""

    def __init__(self, using: str, size: int = SIZE) -> None:
        self.using = using
        self.size = size
        #: a Django connection of the alias that never connects: the store builds its
        #: statements' parameters with its ``ops``, as the sync store does
        self.django = connections.create_connection(using)
        self._idle: list[AsyncConnection[TupleRow]] = []
        self._lock = threading.Lock()
        self._slots: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, asyncio.Semaphore] = (
            weakref.WeakKeyDictionary()
        )
        self.opened = 0  # connections opened so far (tests, benchmarks)
        self._pid = os.getpid()

    @classmethod
    def of(cls, using: str) -> PgConnections:
        """The process's connections to ``using``."""
        with _BY_ALIAS_LOCK:
            found = _BY_ALIAS.get(using)
            if found is None:
                found = _BY_ALIAS[using] = cls(using)
            return found

    def connection(self, *, pipelined: bool = False) -> _Lease:
        """``async with``: a connection for one call (autocommit), back to the idle
        ones after it unless the call left it broken or inside a transaction.
        ``pipelined``: the call runs a pipeline, and a connection that prepares is not
        used again after it failed (psycopg counts a statement prepared once it has
        queued its Parse, and checks the Parse's result only for a statement it had
        not seen before, psycopg 3.3's ``PrepareManager``: a Parse the server skipped
        behind a refused statement of the pipeline leaves it believing in a statement
        the server never made; its clearing of them all on a ``ROLLBACK`` has the same
        blind spot)."""
        return _Lease(self, pipelined)

    def _slot(self) -> asyncio.Semaphore:
        loop = asyncio.get_running_loop()
        with self._lock:
            slots = self._slots.get(loop)
            if slots is None:
                slots = self._slots[loop] = asyncio.Semaphore(self.size)
            return slots

    def _take(self) -> AsyncConnection[TupleRow] | None:
        with self._lock:
            if self._pid != os.getpid():
                # A forked child (a prefork worker): the parent's connections are the
                # parent's; dropped here unclosed (psycopg closes a connection only in
                # the process that opened it).
                self._idle, self._pid = [], os.getpid()
            while self._idle:
                conn = self._idle.pop()
                if not conn.closed:
                    return conn
        return None

    def _give(self, conn: AsyncConnection[TupleRow], *, reusable: bool = True) -> None:
        from psycopg.pq import TransactionStatus

        if not reusable or conn.closed or conn.pgconn.transaction_status != TransactionStatus.IDLE:
            # Broken, interrupted mid-call, out of step, or left in a transaction:
            # never reused. (Closing it is a local call: libpq's PQfinish.)
            conn.pgconn.finish()
            return
        with self._lock:
            self._idle.append(conn)

    async def _open(self) -> AsyncConnection[TupleRow]:
        import psycopg
        from psycopg import sql

        params = dict(self.django.get_connection_params())
        params.pop("cursor_factory", None)  # Django's sync cursor classes
        for key, value in TCP_OPTIONS.items():
            params.setdefault(key, value)
        # Named in pg_stat_activity (the site's own name in OPTIONS wins): which
        # process holds which of the server's connections.
        params.setdefault("application_name", application_name())
        conn = await psycopg.AsyncConnection.connect(autocommit=True, **params)
        try:
            role = self.django.settings_dict["OPTIONS"].get("assume_role")
            if role:  # as Django's own connections do
                await conn.execute(sql.SQL("SET ROLE {}").format(sql.Identifier(role)))
            async with conn.cursor() as cur:
                await cur.execute("SELECT pg_backend_pid()")
                row = await cur.fetchone()
            backend_pid = int(row[0]) if row else 0
            conn.prepare_threshold = prepare_threshold(self.django.settings_dict, conn.info.backend_pid, backend_pid)
        except BaseException:
            await conn.close()
            raise
        self.opened += 1
        return conn

    def discard_idle(self) -> int:
        """Drop the idle connections (a call found the server gone: they were opened
        before, and would each fail a call); returns how many. Local calls only
        (libpq's PQfinish): the server end is gone already."""
        with self._lock:
            idle, self._idle = self._idle, []
            if self._pid != os.getpid():  # a forked child: the parent's, dropped unclosed (see _take)
                self._pid = os.getpid()
                return 0
        for conn in idle:
            conn.pgconn.finish()
        return len(idle)

    async def close(self) -> None:
        """Close the idle connections (those in use close when given back broken, or
        stay open: call this when nothing uses them)."""
        with self._lock:
            idle, self._idle = self._idle, []
        for conn in idle:
            await conn.close()


async def close_all() -> None:
    """Close the idle async connections of every alias (before a test database is
    dropped; at a process's orderly end)."""
    with _BY_ALIAS_LOCK:
        every = list(_BY_ALIAS.values())
    for conns in every:
        await conns.close()


class _Lease:
    """:meth:`PgConnections.connection`'s context manager (a class: every store call
    enters one, and a generator's context manager cost several times as much)."""

    __slots__ = ("conns", "slot", "conn", "pipelined")

    def __init__(self, conns: PgConnections, pipelined: bool = False) -> None:
        self.conns = conns
        self.pipelined = pipelined

    async def __aenter__(self) -> AsyncConnection[TupleRow]:
        conns = self.conns
        slot = self.slot = conns._slot()
        await slot.acquire()
        try:
            conn = conns._take()
            if conn is None:
                conn = await conns._open()
        except BaseException:
            slot.release()
            raise
        self.conn = conn
        return conn

    async def __aexit__(self, exc_type: object, exc: BaseException | None, tb: object) -> None:
        try:
            conn = self.conn
            reusable = reusable_after(exc) and not (
                exc is not None and self.pipelined and conn.prepare_threshold is not None
            )
            self.conns._give(conn, reusable=reusable)
        finally:
            self.slot.release()
