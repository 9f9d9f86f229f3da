"""The EventStore over the Django ORM (SQLite and PostgreSQL; any backend Django has).

The database enforces the invariants (see ``migrations/0002``); this module adds what
SQL alone does not say: absorbing an already stored event id, numbering a batch, and
serialising appenders of one stream.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
import zlib
from datetime import datetime, timezone
from functools import lru_cache, wraps
from typing import Any, Callable, Sequence

from asgiref.sync import sync_to_async
from django.db import IntegrityError, OperationalError, connections, transaction
from django.utils.timezone import now

from .events import ConcurrencyError, Event, Snapshot
from .events.event import decode_blobs, encode_blobs
from .events.store import prepare_batch
from .models import EventRecord, SnapshotRecord
from .runtime.types import RUN_STARTED

_COLUMNS = "(id, stream, seq, type, data, causation, time, blobs, tenant)"
_INSERT = f"INSERT INTO aaa_event {_COLUMNS} VALUES "
_ROW = "(%s, %s, %s, %s, %s, %s, %s, %s, %s)"
_ROW_PG = "(%s, %s, %s, %s, %s, %s, %s, %s::jsonb, %s)"
_INSERT_ROW = _INSERT + _ROW
# Rows per INSERT statement: one statement (one round trip) for a usual batch, and
# SQLite's cap on the variables of a statement (999 in old builds) never reached.
_INSERT_CHUNK = 100
_SELECT = "SELECT id, stream, seq, type, data, causation, time, blobs, tenant FROM aaa_event"
_HEAD = "SELECT seq FROM aaa_event WHERE stream = %s ORDER BY seq DESC LIMIT 1"
_LOAD_SNAPSHOT = (
    "SELECT seq, event_id, state FROM aaa_snapshot WHERE stream = %s AND name = %s AND version = %s"
)
_HEAD_AND_KNOWN_PG = (
    f"SELECT COALESCE(({_HEAD}), 0), ARRAY(SELECT id FROM aaa_event WHERE id = ANY(%s))"
)
# The events of a stream after a seq, each row with the run's index row (one row of
# NULL events when there are none).
_READ_AND_ROW_PG = (
    "SELECT e.id, e.stream, e.seq, e.type, e.data, e.causation, e.time, e.blobs, e.tenant, "
    "{columns} FROM (SELECT 1) AS one LEFT JOIN aaa_run AS r ON r.run_id = %s "
    "LEFT JOIN LATERAL (SELECT * FROM aaa_event WHERE stream = %s AND seq > %s) AS e ON true "
    "ORDER BY e.seq"
)
# ... and the run's index row (aaa_run; NULLs when there is none): the columns are
# runindex.ROW_COLUMNS
_HEAD_KNOWN_AND_ROW_PG = (
    f"SELECT COALESCE(({_HEAD}), 0), ARRAY(SELECT id FROM aaa_event WHERE id = ANY(%s)), "
    "{columns} FROM (SELECT 1) AS one LEFT JOIN aaa_run AS r ON r.run_id = %s"
)
_SNAPSHOT_UPDATE = (
    "UPDATE aaa_snapshot SET seq = %s, event_id = %s, state = %s, saved_at = %s "
    "WHERE stream = %s AND name = %s AND version = %s AND seq < %s"
)
_SNAPSHOT_INSERT = (
    "INSERT INTO aaa_snapshot (stream, name, version, seq, event_id, state, saved_at) "
    "VALUES (%s, %s, %s, %s, %s, %s, %s) ON CONFLICT (stream, name, version) DO NOTHING"
)
# SQLite caps the variables of one statement; ids are checked in chunks of this many.
_SQLITE_CHUNK = 500
# The head, which of the batch's ids are stored already (a JSON array: Django's
# JSONField needs SQLite's JSON functions, so they are there) and the run's index row
# (NULLs when there is none): the columns are runindex.ROW_COLUMNS.
_HEAD_KNOWN_AND_ROW_SQLITE = (
    f"SELECT COALESCE(({_HEAD}), 0), "
    "(SELECT json_group_array(id) FROM aaa_event WHERE id IN ({ids})), "
    "{columns} FROM (SELECT 1) AS one LEFT JOIN aaa_run AS r ON r.run_id = %s"
)
# Appenders that lose a race (SQLite's single writer, or a concurrent insert of the same
# id) re-read and try again; past this many tries the error is real.
_RETRIES = 20


def _to_event(row) -> Event:
    """An event from a row of ``_SELECT`` (plain SQL: no ORM converters ran on it)."""
    id_, stream, seq, type_, data, causation, time_, blobs, tenant = row
    if isinstance(time_, str):  # SQLite keeps datetimes as ISO text
        time_ = datetime.fromisoformat(time_)
    if time_.tzinfo is None:  # stored as naive UTC (SQLite; a site with USE_TZ = False)
        time_ = time_.replace(tzinfo=timezone.utc)
    if isinstance(blobs, str):  # JSON text (SQLite; Django loads jsonb as text)
        blobs = json.loads(blobs)
    return Event(
        id=id_,
        stream=stream,
        seq=seq,
        type=type_,
        data=json.loads(data),
        causation=causation,
        time=time_,
        blobs=decode_blobs(blobs) if blobs else (),
        tenant=tenant,
    )


def _outside_loop(fn: Callable[..., Any]) -> Callable[..., Any]:
    """``fn`` as a coroutine function that runs it on the calling thread, blocking the
    loop while it runs. Django refuses database work in a thread whose event loop is
    running (it cannot know the loop can afford to wait), and while a loop runs it
    keeps connections per task, not per thread: with the loop hidden for the call
    (it runs nothing else meanwhile), every call sees the thread's one connection."""

    @wraps(fn)
    async def call(*args: Any, **kwargs: Any) -> Any:
        loop = asyncio.events._get_running_loop()
        asyncio.events._set_running_loop(None)
        try:
            return fn(*args, **kwargs)
        finally:
            asyncio.events._set_running_loop(loop)

    return call


class EventList(list):
    """The events a read returned, and whether they were read outside any transaction."""

    committed = True


class DjangoEventStore:
    """An :class:`~aaa_django.events.EventStore` on the database alias ``using``.

    Async methods (the protocol the engine uses) run the ORM in Django's
    thread-sensitive executor; the ``*_sync`` methods are for sync callers (Celery
    tasks, the admin, the API). Appends join the caller's transaction when there is
    one, so events commit (or roll back) with the caller's own writes.

    ``inline=True``: the async methods run the queries on the calling thread instead,
    blocking its event loop for each (sub-millisecond) query; no hop to another
    thread per call. For a loop that owns its thread and that thread's database
    connection, and runs one delivery at a time: a Celery worker's
    (:mod:`aaa_django.worker`).
    """

    def __init__(self, using: str = "default", *, inline: bool = False) -> None:
        self.using = using
        self.inline = inline
        self.cache_key = f"django:{using}"
        #: stream -> (head seq, run index row) as this store's last append (an inline
        #: store's: also its last read) left them: on PostgreSQL the next append to the
        #: stream starts from there instead of asking (a hint: if another process
        #: appended since, the unique (stream, seq) index refuses the statement and the
        #: append asks). Shared by the threads that use the store.
        self._seen: dict[str, tuple[int, tuple | None]] = {}
        self._seen_lock = threading.Lock()
        wrap = _outside_loop if inline else (lambda fn: sync_to_async(fn, thread_sensitive=True))
        self.append = wrap(self.append_sync)
        self.read = wrap(self.read_sync)
        self.head = wrap(self.head_sync)
        self.load_snapshot = wrap(self.load_snapshot_sync)
        self.save_snapshot = wrap(self.save_snapshot_sync)
        self.erase = wrap(self.erase_sync)
        self.streams = wrap(self.streams_sync)

    def __repr__(self) -> str:
        return f"DjangoEventStore(using={self.using!r})"

    @property
    def _events(self):
        return EventRecord.objects.using(self.using)

    # -- events -------------------------------------------------------------------

    def append_sync(
        self, events: Sequence[Event], *, expected_seq: int | None = None
    ) -> list[Event]:
        stream, batch, texts = prepare_batch(events)  # raises before any write
        if not batch:
            return []
        for attempt in range(_RETRIES):
            try:
                return self._append_once(stream, batch, texts, expected_seq, attempt > 0)
            except (IntegrityError, OperationalError) as exc:
                # Lost a race with another appender (SQLite: "database is locked";
                # both: the same seq or id inserted first by someone else). Re-read
                # and decide again; inside a caller's transaction our atomic block was
                # a savepoint, rolled back, so the caller's transaction is still usable
                # (outside one, our own transaction was rolled back whole).
                if attempt == _RETRIES - 1:
                    raise ConcurrencyError(f"append to {stream} lost a race: {exc}") from exc
                time.sleep(0.001 * (attempt + 1))
        raise AssertionError("unreachable")

    def _append_once(self, stream: str, batch: list[Event], texts: list[str], expected_seq,
                     contended: bool = False):
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
            stored, rows = _number(conn, batch, texts, head, known, expected_seq)
            if rows:
                row = _ROW_PG if pg else _ROW
                for i in range(0, len(rows), _INSERT_CHUNK):
                    chunk = rows[i : i + _INSERT_CHUNK]
                    cur.execute(*_insert(row, chunk))
                # The run index (aaa_run) is derived from the log: updated in the same
                # transaction, so it commits, or rolls back, with the events.
                from .runindex import index_events  # runindex imports this module

                index_events(self.using, stored)
        return stored

    def _append_pg_statement(self, conn, stream: str, batch: list[Event], texts: list[str],
                             expected_seq, seen: tuple[int, tuple | None] | None = None
                             ) -> list[Event] | None:
        """The common append on PostgreSQL outside a caller's transaction, in two round
        trips: one query (the head, the ids stored already, the run's index row), then
        one statement that inserts the events and folds them into the row (a
        statement is a transaction: both commit, or neither). None when the batch is
        not the common case (a new run, an index row behind its log, a batch too
        large for one statement): the caller takes the transactional path.

        ``seen``: the head and the row as the last read saw them (an inline store's):
        then the statement alone, one round trip. Had anything been appended since, the
        unique (stream, seq) index, or the unique id of an event stored already,
        refuses it, and the append starts again from the query."""
        from .runindex import ROW_COLUMNS  # runindex imports this module

        if len(batch) > _INSERT_CHUNK:
            return None
        with conn.cursor() as cur:
            if seen is not None:
                head, row = seen
                stored = self._write_pg(conn, cur, stream, batch, texts, expected_seq, head, (), row)
                if stored is not None:
                    return stored
            query = _HEAD_KNOWN_AND_ROW_PG.format(columns=", ".join(f"r.{c}" for c in ROW_COLUMNS))
            cur.execute(query, [stream, [e.id for e in batch], stream])
            head, known, *row = cur.fetchone()
            row = tuple(row) if row[0] is not None else None
            return self._write_pg(conn, cur, stream, batch, texts, expected_seq, head, known, row,
                                  optimistic=False)

    def _write_pg(self, conn, cur, stream, batch, texts, expected_seq, head: int, known,
                  row: tuple | None, *, optimistic: bool = True) -> list[Event] | None:
        """The events after ``head`` and the run's row after ``row`` in one statement.
        None: not the common case, or (``optimistic``) the log moved since ``head``."""
        from .runindex import index_events, row_update, starts_run  # runindex imports this module

        try:
            stored, rows = _number(conn, batch, texts, head, known, expected_seq)
        except ConcurrencyError:
            if optimistic:
                return None  # perhaps only our view of the head is old: ask
            raise
        if not rows:  # all stored already: absorbed
            if not optimistic:
                self._remember(stream, head, row)  # as the query just saw them
            return stored
        if row is None and not starts_run(stored):
            # Not a run (a run's row is made by its first event): the events alone.
            insert, params = _insert(_ROW_PG, rows)
            if optimistic:
                try:
                    cur.execute(insert, params)
                except IntegrityError:
                    return None  # autocommit: nothing to roll back
            else:
                cur.execute(insert, params)
            self._remember(stream, stored[-1].seq, None)
            return stored
        update = row_update(conn, row, stored)
        if update is None:
            return None
        insert, params = _insert(_ROW_PG, rows)
        statement = f"WITH stored AS ({insert}) {update[0]}"
        if optimistic:
            try:
                cur.execute(statement, params + update[1])
            except IntegrityError:
                return None  # autocommit: nothing to roll back
        else:
            cur.execute(statement, params + update[1])
        if cur.rowcount != 1:  # the row moved meanwhile (no event did): catch up
            index_events(self.using, stored)
        else:
            self._remember(stream, stored[-1].seq, update[2])
        return stored

    def _append_sqlite_transaction(self, conn, stream: str, batch: list[Event], texts: list[str],
                                   expected_seq) -> list[Event] | None:
        """The common append on SQLite outside a caller's transaction, in four
        statements (five on a run's stream): ``BEGIN IMMEDIATE`` (the write lock
        first: nothing moves between the read and the write), one query (the head,
        the ids stored already, the run's index row), the INSERT (and the UPDATE that
        folds the events into the run's row), ``COMMIT``; rolled back on any error. ``transaction.atomic`` and a
        statement per lookup cost more than the insert (benchmarks/bench_eventlog.py).

        None, with nothing written, when the batch is not the common case (a run's
        first events, an index row behind its log, more ids than one query takes, a
        transaction Django does not know of): the caller takes the transactional
        path."""
        if len(batch) > _SQLITE_CHUNK or batch[0].type == RUN_STARTED:
            return None  # a new run's row is made by runindex (in an atomic block)
        conn.ensure_connection()
        if conn.connection.in_transaction:
            return None  # someone's BEGIN, by plain SQL: theirs to end
        with conn.cursor() as cur:
            cur.execute("BEGIN IMMEDIATE")
            try:
                stored = self._write_sqlite(conn, cur, stream, batch, texts, expected_seq)
                if stored is not None:
                    cur.execute("COMMIT")
            finally:
                if conn.connection.in_transaction:  # an error, or not the common case
                    cur.execute("ROLLBACK")
        return stored

    def _write_sqlite(self, conn, cur, stream: str, batch: list[Event], texts: list[str],
                      expected_seq) -> list[Event] | None:
        """The statements of :meth:`_append_sqlite_transaction` inside its transaction."""
        from .runindex import ROW_COLUMNS, row_update, starts_run  # runindex imports this module

        ids = [e.id for e in batch]
        cur.execute(_head_known_and_row_sqlite(len(ids), ROW_COLUMNS), [stream, *ids, stream])
        head, known, *row = cur.fetchone()
        stored, rows = _number(conn, batch, texts, head, json.loads(known) if known != "[]" else (),
                               expected_seq)
        if not rows:
            return stored
        update = None
        if row[0] is not None:  # a run's stream: fold the events into its row
            update = row_update(conn, row, stored)
            if update is None:
                return None  # a row behind its log: runindex catches it up
        elif starts_run(stored):
            return None  # a new run (its start after an id stored elsewhere): runindex
        # In-process SQLite: executemany (one prepared statement, stepped per row) is
        # cheaper than parsing and binding one multi-row INSERT.
        if len(rows) == 1:
            cur.execute(_INSERT_ROW, rows[0])
        else:
            cur.executemany(_INSERT_ROW, rows)
        if update is not None:
            cur.execute(update[0], update[1])
            if cur.rowcount != 1:
                return None  # the row moved (it cannot, under the write lock): general path
        return stored

    def _remember(self, stream: str, head: int, row: tuple | None) -> None:
        with self._seen_lock:
            seen = self._seen
            seen.pop(stream, None)
            seen[stream] = (head, row)
            while len(seen) > 1024:  # oldest first
                del seen[next(iter(seen))]

    def _forget(self, stream: str) -> tuple[int, tuple | None] | None:
        with self._seen_lock:
            return self._seen.pop(stream, None)

    def observe(self, events: Sequence[Event]) -> None:
        """Committed ``events`` of one stream, learnt without reading them (a worker
        gets them in its delivery message): an inline store that remembers the head
        just before them moves its head, and its run's row, past them, so its next
        append needs no query. Anything else forgets the stream (the next append asks)."""
        if not self.inline or not events:
            return
        from .runindex import row_update  # runindex imports this module

        stream = events[0].stream
        seen = self._forget(stream)
        if seen is None or events[0].seq != seen[0] + 1:
            return
        row = seen[1]
        if row is not None:
            update = row_update(connections[self.using], row, list(events))
            if update is None:
                return
            row = update[2]
        self._remember(stream, events[-1].seq, row)

    def read_sync(
        self,
        stream: str,
        *,
        after: int = 0,
        limit: int | None = None,
        tenant: str | None = None,
    ) -> list[Event]:
        # Plain SQL, as the append: the ORM's query building cost more than the query.
        sql, params = f"{_SELECT} WHERE stream = %s AND seq > %s", [stream, after]
        if tenant is not None:
            sql += " AND tenant = %s"
            params.append(tenant)
        sql += " ORDER BY seq"
        if limit is not None:
            sql += " LIMIT %s"
            params.append(max(int(limit), 0))
        conn = connections[self.using]
        if self.inline and limit is None and tenant is None and conn.vendor == "postgresql":
            return self._read_to_head_pg(conn, stream, after)
        with conn.cursor() as cur:
            cur.execute(sql, params)
            events = EventList(_to_event(row) for row in cur.fetchall())
        # Rows read inside a caller's transaction may still be rolled back: say so, and
        # the in-process holder will not share a state folded from them.
        events.committed = not conn.in_atomic_block
        return events

    def _read_to_head_pg(self, conn, stream: str, after: int) -> list[Event]:
        """A read to the end of the stream, with the run's index row in the same round
        trip: what the next append would otherwise ask for (see ``_write_pg``)."""
        from .runindex import ROW_COLUMNS  # runindex imports this module

        query = _READ_AND_ROW_PG.format(columns=", ".join(f"r.{c}" for c in ROW_COLUMNS))
        with conn.cursor() as cur:
            cur.execute(query, [stream, stream, after])
            rows = cur.fetchall()
        events = EventList(_to_event(r[:9]) for r in rows if r[0] is not None)
        events.committed = not conn.in_atomic_block
        if events and events.committed:
            row = tuple(rows[0][9:])
            self._remember(stream, events[-1].seq, row if row[0] is not None else None)
        else:
            self._forget(stream)
        return events

    def head_sync(self, stream: str) -> tuple[int, str] | None:
        row = self._events.filter(stream=stream).order_by("-seq").values_list("seq", "id")[:1]
        return (row[0][0], row[0][1]) if row else None

    def erase_sync(self, stream: str) -> int:
        from .runindex import forget

        self._forget(stream)

        with transaction.atomic(using=self.using):
            SnapshotRecord.objects.using(self.using).filter(stream=stream).delete()
            deleted, _ = self._events.filter(stream=stream).delete()
            forget(self.using, stream)
        return deleted

    def streams_sync(self) -> list[str]:
        return list(self._events.order_by("stream").values_list("stream", flat=True).distinct())

    # -- snapshots ----------------------------------------------------------------

    def load_snapshot_sync(self, stream: str, name: str, version: int) -> Snapshot | None:
        with connections[self.using].cursor() as cur:  # plain SQL: a read on every adoption
            cur.execute(_LOAD_SNAPSHOT, [stream, name, version])
            row = cur.fetchone()
        return Snapshot(stream, name, version, row[0], row[1], row[2]) if row else None

    def save_snapshot_sync(self, snapshot: Snapshot) -> bool:
        """Store ``snapshot`` unless one at the same or a later seq is stored already.

        A conditional UPDATE (only an older row is replaced), else an INSERT that yields
        to a row someone else inserted meanwhile; then the UPDATE again, which now tells
        whether that row is older. Racing savers cannot move the seq backwards (the
        WHERE clause, and the database trigger, refuse it). First save: 2 statements;
        a newer save: 1.
        """
        conn = connections[self.using]
        key = [snapshot.stream, snapshot.name, snapshot.version]
        values = [snapshot.seq, snapshot.event_id, snapshot.state,
                  conn.ops.adapt_datetimefield_value(now())]
        with transaction.atomic(using=self.using), conn.cursor() as cur:
            for _ in range(2):
                cur.execute(_SNAPSHOT_UPDATE, [*values, *key, snapshot.seq])
                if cur.rowcount:
                    return True
                cur.execute(_SNAPSHOT_INSERT, [*key, *values])
                if cur.rowcount:
                    return True
        return False  # a row at the same or a later seq is there


def _number(conn, batch: list[Event], texts: list[str], head: int, known, expected_seq):
    """The events of ``batch`` not stored yet, numbered after ``head``, and their rows."""
    if expected_seq is not None and expected_seq != head:
        raise ConcurrencyError(f"stream head is {head}, expected {expected_seq}")
    if known:
        known = set(known)
        batch, texts = [e for e in batch if e.id not in known], [
            t for e, t in zip(batch, texts) if e.id not in known]
    for seq, e in enumerate(batch, start=head + 1):
        if e.seq is not None and e.seq != seq:
            raise ConcurrencyError(f"event {e.id} claims seq {e.seq} but the next seq is {seq}")
    if not batch:
        return [], []
    # What the caller gets back is what a reader will get: the decoded text (one
    # decode for the batch: a JSON array of the texts).
    datas = json.loads(f"[{','.join(texts)}]") if len(texts) > 1 else [json.loads(texts[0])]
    stored, rows = [], []
    adapt = _time_adapter(conn)
    for seq, (e, text, data) in enumerate(zip(batch, texts, datas), start=head + 1):
        stored.append(Event(id=e.id, stream=e.stream, type=e.type, data=data, seq=seq,
                            causation=e.causation, time=e.time, blobs=e.blobs, tenant=e.tenant))
        blobs = json.dumps(encode_blobs(e.blobs)) if e.blobs else "[]"
        rows.append((e.id, e.stream, seq, e.type, text, e.causation, adapt(e.time), blobs, e.tenant))
    return stored, rows


def _time_adapter(conn) -> Callable[[datetime], Any]:
    """``conn.ops.adapt_datetimefield_value`` for event times. Where it keeps a UTC
    time as naive UTC text (SQLite with ``USE_TZ`` and no database ``TIME_ZONE``),
    that text directly: the same, without Django's checks, which were a third of the
    cost of numbering an event."""
    adapt = conn.ops.adapt_datetimefield_value
    if conn.vendor != "sqlite" or conn.timezone is not timezone.utc:
        return adapt
    utc = timezone.utc
    return lambda t: t.isoformat(" ")[:-6] if t.tzinfo is utc else adapt(t)  # "+00:00"


def _insert(row: str, rows: list[tuple]) -> tuple[str, list]:
    """One multi-row INSERT (a round trip, where executemany adds a pipeline sync)."""
    return _INSERT + ", ".join([row] * len(rows)), [v for r in rows for v in r]


def _head_and_known(cur, pg: bool, stream: str, ids: list[str]) -> tuple[int, set[str]]:
    """The stream's head seq and which of ``ids`` are stored already (one round trip
    on PostgreSQL; SQLite is in-process, so two statements cost little)."""
    if pg:
        cur.execute(_HEAD_AND_KNOWN_PG, [stream, ids])
        head, known = cur.fetchone()
        return head, set(known)
    cur.execute(_HEAD, [stream])
    row = cur.fetchone()
    known: set[str] = set()
    for i in range(0, len(ids), _SQLITE_CHUNK):
        chunk = ids[i : i + _SQLITE_CHUNK]
        cur.execute(
            f"SELECT id FROM aaa_event WHERE id IN ({', '.join(['%s'] * len(chunk))})", chunk
        )
        known.update(r[0] for r in cur.fetchall())
    return (row[0] if row else 0), known


@lru_cache(maxsize=64)
def _head_known_and_row_sqlite(n: int, columns: tuple[str, ...]) -> str:
    return _HEAD_KNOWN_AND_ROW_SQLITE.format(ids=", ".join(["%s"] * n),
                                             columns=", ".join(f"r.{c}" for c in columns))


def _lock_key(stream: str) -> int:
    # pg_advisory_xact_lock takes a signed 64-bit key; crc32 spreads streams well enough
    # (a collision only makes two streams' appenders wait for each other).
    return zlib.crc32(stream.encode()) - 2**31
