"""The common append outside a caller's transaction, in the fewest statements each
backend allows (the mixin :class:`StatementAppends` of
:class:`~aaa_django.store.DjangoEventStore`):

- PostgreSQL: one statement that inserts the events and folds them into the run's
  index row (a statement is a transaction; one event of a run, on a connection that
  prepares nothing, the call of migration 0009's function that does the same with
  plans the session keeps), preceded by one query (the head, the ids
  stored already, the run's row) unless the store remembers them from its own last
  append or read of the stream, or from the events a delivery's message carried (a
  hint, refused by the unique ``(stream, seq)`` index when another process appended
  since), or the batch starts a run: then the
  statement inserts the events and the run's new row, on the guess that the stream
  is new (refused by the same index, or the event's unique id, when it is not);
- SQLite: ``BEGIN IMMEDIATE``, that one query, the ``INSERT`` (and the run row's
  ``UPDATE``), ``COMMIT``, rolled back on any error.

Anything else (a new run on SQLite, an index row behind its log, a large batch, a
caller's transaction) returns None having written nothing, and the store takes its
transactional path.
"""

from __future__ import annotations

import json
import re
import sqlite3
import threading
from collections.abc import Callable, Collection, Generator, Sequence
from functools import lru_cache
from typing import TYPE_CHECKING, Any

from django.db import IntegrityError

from aaa_django.events import ConcurrencyError, Event
from aaa_django.events.tail import MAX_STREAMS
from aaa_django.runtime.event_types import RUN_STARTED

from .rows import (
    HEAD,
    INSERT_CHUNK,
    INSERT_ROW,
    ROW,
    ROW_COLUMNS,
    ROW_PG,
    SQLITE_CHUNK,
    closed_refusal,
    event_columns,
    insert,
    number,
    prepares,
    to_events,
)
from .runindex import (
    append_event_call,
    index_events,
    initial_row,
    row_after,
    row_insert,
    row_update,
    starts_run,
)

if TYPE_CHECKING:
    from django.db.backends.base.base import BaseDatabaseWrapper
    from django.db.backends.utils import CursorWrapper

#: An append's statements as a generator: it yields ``(sql, params)`` and is sent
#: ``(rowcount, first row or None)`` back, or has the statement's ``IntegrityError``
#: thrown into it; it returns the stored events, or None (not the common case,
#: nothing written). It yields ``(CATCH_UP, stored)`` when the run's index row must be
#: caught up with ``stored`` (:func:`~aaa_django.store.runindex.index_events`) once they
#: are committed. A sync cursor runs it (:func:`run_steps`), or an async one.
Steps = Generator[tuple[Any, Any], Any, "list[Event] | None"]
CATCH_UP = object()
#: (SQLite) an append on a hint refused, having written nothing: it asks
_ASK: Any = object()

#: the run's index row in a query (``r``: ``aaa_run``, NULLs when there is none)
_ROW = ", ".join(f"r.{c}" for c in ROW_COLUMNS)
# The events of a stream after a seq, each row with the run's index row (one row of
# NULL events when there are none).
_READ_AND_ROW_PG = (
    f"SELECT {event_columns('postgresql', 'e')}, "
    f"{_ROW} FROM (SELECT 1) AS one LEFT JOIN aaa_run AS r ON r.run_id = %s "
    "LEFT JOIN LATERAL (SELECT * FROM aaa_event WHERE stream = %s AND seq > %s) AS e ON true "
    "ORDER BY e.seq"
)
# The head, which of the batch's ids are stored already, and the run's index row.
_HEAD_KNOWN_AND_ROW_PG = (
    f"SELECT COALESCE(({HEAD}), 0), ARRAY(SELECT id FROM aaa_event WHERE id = ANY(%s)), "
    f"{_ROW} FROM (SELECT 1) AS one LEFT JOIN aaa_run AS r ON r.run_id = %s"
)
#: the one statement of an append's :data:`Steps` that is not its last (the query of
#: an append without a hint: its insert follows)
QUERY = _HEAD_KNOWN_AND_ROW_PG
# The same on SQLite: the stored ids as a JSON array (Django's JSONField needs
# SQLite's JSON functions, so they are there).
_HEAD_KNOWN_AND_ROW_SQLITE = (
    f"SELECT COALESCE(({HEAD}), 0), "
    "(SELECT json_group_array(id) FROM aaa_event WHERE id IN ({ids})), "
    f"{_ROW} FROM (SELECT 1) AS one LEFT JOIN aaa_run AS r ON r.run_id = %s"
)
#: where a row's owner is in ``ROW_COLUMNS`` (a new run's statement returns it)
_OWNER = ROW_COLUMNS.index("owner_id")
#: streams whose head and run row a store remembers (the most recently used; a hint
#: of a stream not kept costs its next append one query, and its group commit a round
#: trip): as many as an engine keeps the logs of (``aaa_django.events.tail``), so that
#: every run an engine carries appends without asking. (Kept to 1,024 streams, 3,000
#: runs in flight made four of a run's seven appends ask: 12,000 queries, each planned
#: anew by the server, in ``bench_concurrency.py``'s 3,000-run row.) A run's hint goes
#: when its log does, once its end is delivered (:meth:`StatementAppends.forget_hint`).
HINTS_KEPT = MAX_STREAMS


class StatementAppends:
    """The one-statement (PostgreSQL) and one-transaction (SQLite) appends, and the
    hints they start from. Needs ``using`` (see ``DjangoEventStore``)."""

    using: str

    def _init_hints(self) -> None:
        #: stream -> (head seq, run index row) as this store's last append (or read, or
        #: the events it observed) left them: the next append to the
        #: stream starts from there instead of asking (a hint: if another process
        #: appended since, the unique (stream, seq) index refuses the statement and the
        #: append asks). Shared by the threads that use the store. Bound: ``HINTS_KEPT``.
        self._seen: dict[str, tuple[int, tuple | None]] = {}
        self._seen_lock = threading.Lock()

    def _append_pg_statement(
        self,
        conn: BaseDatabaseWrapper,
        stream: str,
        batch: list[Event],
        texts: list[str],
        expected_seq: int | None,
        seen: tuple[int, tuple | None] | None = None,
    ) -> list[Event] | None:
        """The common append on PostgreSQL outside a caller's transaction, in two round
        trips: one query (the head, the ids stored already, the run's index row), then
        one statement that inserts the events and folds them into the row (a
        statement is a transaction: both commit, or neither). None when the batch is
        not the common case (an index row behind its log, a batch too
        large for one statement): the caller takes the transactional path.

        ``seen``: the head and the row as this store last saw them (its hint):
        then the statement alone, one round trip. Had anything been appended since, the
        unique (stream, seq) index, or the unique id of an event stored already,
        refuses it, and the append starts again from the query. A batch that starts
        with a run's ``aaa.run.started`` and no hint is taken for a new run's: the
        statement alone (its events and the run's new row), refused the same way."""
        if len(batch) > INSERT_CHUNK:
            return None
        with conn.cursor() as cur:
            return run_steps(
                cur,
                self.using,
                self._pg_steps(conn, stream, batch, texts, expected_seq, seen, prepares=prepares(conn.connection)),
            )

    def _pg_steps(
        self,
        conn: BaseDatabaseWrapper,
        stream: str,
        batch: list[Event],
        texts: list[str],
        expected_seq: int | None,
        seen: tuple[int, tuple | None] | None,
        *,
        prepares: bool,
    ) -> Steps:
        """The statements of :meth:`_append_pg_statement`, as :data:`Steps` (the sync
        store and the async one, :mod:`aaa_django.store.postgres`, run the same ones). ``conn``
        is a Django connection of the store's alias: only its ``ops`` are used;
        ``prepares``: whether the connection the steps run on prepares its statements
        (:func:`~aaa_django.store.rows.prepares`)."""
        if seen is None and batch[0].type == RUN_STARTED and batch[0].seq in (None, 1):
            seen = (0, None)  # a new run (most likely): its events and its row at once
        if seen is not None:
            head, row = seen
            stored = yield from self._write_pg(
                conn, stream, batch, texts, expected_seq, head, (), row, prepares=prepares
            )
            if stored is not None:
                return stored
        _, found = yield _HEAD_KNOWN_AND_ROW_PG, [stream, [e.id for e in batch], stream]
        head, known, *row = found
        row = tuple(row) if row[0] is not None else None
        return (
            yield from self._write_pg(
                conn, stream, batch, texts, expected_seq, head, known, row, prepares=prepares, optimistic=False
            )
        )

    def _write_pg(
        self,
        conn: BaseDatabaseWrapper,
        stream: str,
        batch: list[Event],
        texts: list[str],
        expected_seq: int | None,
        head: int,
        known: Collection[str],
        row: tuple | None,
        *,
        prepares: bool,
        optimistic: bool = True,
    ) -> Steps:
        """The events after ``head`` and the run's row after ``row`` in one statement
        (one event of a run on a connection that does not prepare its statements
        (``prepares``): the call of migration 0009's function). None: not the common
        case, or (``optimistic``) the log moved since ``head``."""
        try:
            stored, rows = number(conn, batch, texts, head, known, expected_seq)
        except ConcurrencyError:
            if optimistic:
                return None  # perhaps only our view of the head is old: ask
            raise
        if not rows:  # all stored already: absorbed
            if not optimistic:
                self._remember(stream, head, row)  # as the query just saw them
            return stored
        call = row is not None and len(rows) == 1 and not prepares
        if call:
            # One event of a run's stream, on a connection that prepares nothing: the
            # append function's call (migration 0009), whose plans the session keeps.
            fold = append_event_call(conn, rows[0], row, stored)
            if fold is None:
                return None
            statement, params, after = fold
        else:
            sql, params = insert(ROW_PG, rows)
            if row is None and not starts_run(stored):
                # Not a run (a run's row is made by its first event): the events alone.
                statement, after = sql, None
            else:  # a new run's row made, or the run's row brought up to date, by the same statement
                fold = row_insert(conn, stored) if row is None else row_update(conn, row, stored)
                if fold is None:
                    return None
                statement, params, after = f"WITH stored AS ({sql}) {fold[0]}", params + fold[1], fold[2]
        try:
            rowcount, first = yield statement, params
            if call:
                (rowcount,) = first  # the rows the function updated
        except IntegrityError as exc:
            if optimistic:
                # The log moved, the run is not new, or the events are stored already (a
                # completion delivered again is absorbed, not refused): autocommit,
                # nothing to undo; ask.
                return None
            closed = closed_refusal(stream, exc)
            if closed is not None:  # the triggers: the run has ended, or was erased
                raise closed from exc
            raise
        if row is None and after is not None:  # the new row's owner: the user, if it exists
            after = (*after[:_OWNER], first[0], *after[_OWNER + 1 :])
        elif row is not None and rowcount != 1:  # the row moved meanwhile (no event did)
            yield CATCH_UP, stored
            return stored
        self._remember(stream, stored[-1].seq or 0, after)  # (numbered: seq is set)
        return stored

    def _append_sqlite_transaction(
        self, conn: BaseDatabaseWrapper, stream: str, batch: list[Event], texts: list[str], expected_seq: int | None
    ) -> list[Event] | None:
        """The common append on SQLite outside a caller's transaction, in four
        statements (five on a run's stream): ``BEGIN IMMEDIATE`` (the write lock
        first: nothing moves between the read and the write), one query (the head,
        the ids stored already, the run's index row), the INSERT (and the UPDATE that
        folds the events into the run's row), ``COMMIT``; rolled back on any error. ``transaction.atomic`` and a
        statement per lookup cost more than the insert (benchmarks/bench_eventlog.py).

        The statements go to the driver's own cursor, in its placeholder style, inside
        Django's error translation (``wrap_database_errors``: the same exceptions, and
        a broken connection noticed, as through Django's cursor): Django's cursor
        wrapper (a conversion of each statement, checks and wrappers per call) cost
        about as much as the statements' own work in SQLite, commit aside
        (benchmarks/profile_turn_sqlite.py). Django's cursor when the site logs queries
        (``DEBUG``) or has installed execute wrappers: they see these statements as any
        other.

        A run's first events make its index row in the same transaction (as
        :class:`~aaa_django.store.sqlite.SqliteEventStore`'s appends do: the same
        statements). None, with nothing written, when the batch is not the common case
        (an index row behind its log, more ids than one query takes, a transaction
        Django does not know of): the caller takes the transactional path."""
        if len(batch) > SQLITE_CHUNK:
            return None
        conn.ensure_connection()
        raw = conn.connection
        if raw.in_transaction:
            return None  # someone's BEGIN, by plain SQL: theirs to end
        if conn.queries_logged or conn.execute_wrappers:
            with conn.cursor() as cur:
                return _sqlite_transaction(self, conn, cur, raw, stream, batch, texts, expected_seq, _as_written)
        with conn.wrap_database_errors:
            cur = raw.cursor()
            try:
                return _sqlite_transaction(self, conn, cur, raw, stream, batch, texts, expected_seq, _qmark)
            finally:
                cur.close()

    def _write_sqlite(
        self,
        conn: BaseDatabaseWrapper,
        cur: CursorWrapper | sqlite3.Cursor,
        stream: str,
        batch: list[Event],
        texts: list[str],
        expected_seq: int | None,
        sql: Callable[[str], str],
    ) -> list[Event] | None:
        """The statements of :meth:`_append_sqlite_transaction` inside its transaction
        (``sql``: a statement in the placeholder style of ``cur``). With the head and
        the run's row this store's last append (or read) of the stream left (a hint,
        as on PostgreSQL), the INSERT and the UPDATE alone; had anything been appended
        since, the unique ``(stream, seq)`` index, the dense-seq trigger or an event's
        unique id refuses the INSERT (one statement: SQLite undoes all of it, the
        transaction goes on), and the append asks: one query (the head, the ids stored
        already, the run's row), then the INSERT and the UPDATE."""
        seen = self._forget(stream)
        if seen is not None:
            stored = self._write_sqlite_after(
                conn, cur, stream, batch, texts, expected_seq, sql, seen[0], (), seen[1], hint=True
            )
            if stored is not _ASK:
                return stored
            # perhaps only our view of the head is old (nothing written): ask
        ids = [e.id for e in batch]
        cur.execute(sql(_head_known_and_row_sqlite(len(ids))), [stream, *ids, stream])
        head, known, *row = cur.fetchone()
        return self._write_sqlite_after(
            conn,
            cur,
            stream,
            batch,
            texts,
            expected_seq,
            sql,
            head,
            json.loads(known) if known != "[]" else (),
            tuple(row) if row[0] is not None else None,
        )

    def _write_sqlite_after(
        self,
        conn: BaseDatabaseWrapper,
        cur: CursorWrapper | sqlite3.Cursor,
        stream: str,
        batch: list[Event],
        texts: list[str],
        expected_seq: int | None,
        sql: Callable[[str], str],
        head: int,
        known: Collection[str],
        row: tuple | None,
        *,
        hint: bool = False,
    ) -> list[Event] | None:
        """The INSERT of the events after ``head`` and the UPDATE (or, a run's start,
        the INSERT) of the run's row ``row``: the stored events, remembered for the
        next append; None when it is not the common case (the caller rolls back).
        ``hint``: ``head`` and ``row`` are the store's memory, not a query's: the
        events' INSERT is one statement, and its refusal (or the numbering's, before
        it) returns ``_ASK`` having written nothing."""
        try:
            stored, rows = number(conn, batch, texts, head, known, expected_seq)
        except ConcurrencyError:
            if hint:
                return _ASK
            raise
        if not rows:  # all stored already: absorbed
            self._remember(stream, head, row)  # as the query just saw them
            return stored
        update: tuple[str, list, tuple] | None = None
        after: tuple | None = None
        if row is not None:  # a run's stream: fold the events into its row
            update = row_update(conn, row, stored)
            if update is None:
                return None  # a row behind its log: runindex catches it up
            after = update[2]
        elif starts_run(stored):
            # A new run: its row made by a plain INSERT after its events (as on
            # PostgreSQL, ``row_insert``), in the same transaction.
            update = row_insert(conn, stored)
            if update is None:
                return None  # not foldable: runindex decides (and logs why)
            after = update[2]
        # In-process SQLite: executemany (one prepared statement, stepped per row) is
        # cheaper than parsing and binding one multi-row INSERT; on a hint, one
        # statement (refused whole, or not at all).
        try:
            if len(rows) == 1:
                cur.execute(sql(INSERT_ROW), rows[0])
            elif hint:
                cur.execute(*_sqlite_insert(sql, rows))
            else:
                cur.executemany(sql(INSERT_ROW), rows)
        except (IntegrityError, sqlite3.IntegrityError):
            if hint:
                return _ASK  # (the statement undone whole; the transaction goes on)
            raise
        if update is not None:
            cur.execute(sql(update[0]), update[1])
            if row is None:
                (owner,) = cur.fetchone()  # the INSERT's RETURNING: the owner it stored
                cur.fetchall()  # (the statement completes)
                made = update[2]
                after = (*made[:_OWNER], owner, *made[_OWNER + 1 :])
            elif cur.rowcount != 1:
                return None  # the row moved (it cannot, under the write lock): general path
        self._remember(stream, stored[-1].seq or 0, after)  # (numbered: seq is set)
        return stored

    def _remember(self, stream: str, head: int, row: tuple | None) -> None:
        with self._seen_lock:
            seen = self._seen
            seen.pop(stream, None)
            seen[stream] = (head, row)
            while len(seen) > HINTS_KEPT:  # oldest first
                del seen[next(iter(seen))]

    def _forget(self, stream: str) -> tuple[int, tuple | None] | None:
        with self._seen_lock:
            return self._seen.pop(stream, None)

    def hint(self, stream: str) -> tuple[int, tuple | None] | None:
        """The head and run row remembered for ``stream``, if any (diagnostics, tests)."""
        with self._seen_lock:
            return self._seen.get(stream)

    def forget_hint(self, stream: str) -> None:
        """The engine over this store keeps nothing of ``stream`` now (``Tail.forget``:
        its run ended, or waits for a person): its hint goes too, so the hints hold the
        runs in flight, not every run served."""
        self._forget(stream)

    def observe(self, events: Sequence[Event]) -> None:
        """Committed ``events`` of one stream, learnt without reading them (a worker
        gets them in its delivery message): a store that remembers the head just
        before them (or learns a stream's first events) moves its head, and its run's
        row, past them, so its next append needs no query. Anything else forgets the
        stream (the next append asks)."""
        if not events:
            return
        stream = events[0].stream
        seen = self._forget(stream)
        if seen is not None and (events[-1].seq or 0) <= seen[0]:
            self._remember(stream, *seen)  # known already (this store appended them)
            return
        if seen is None and events[0].seq == 1:
            # A stream's first events: its head, and (a run's start) its row, follow from them.
            row = initial_row(events)
            if row is not None or not starts_run(events):
                self._remember(stream, events[-1].seq or 0, row)
            return
        if seen is None or events[0].seq != seen[0] + 1:
            return
        row = seen[1]
        if row is not None:
            row = row_after(row, list(events))
            if row is None:
                return
        self._remember(stream, events[-1].seq or 0, row)

    def _read_rows(self, stream: str, rows: Sequence[tuple], *, committed: bool) -> list[Event]:
        """The events of rows of ``_READ_AND_ROW_PG``; the head and the run's row they
        show are remembered for the next append when they are committed."""
        events = to_events(rows, 0)
        events.committed = committed
        if events and committed:
            row = tuple(rows[0][9:])
            self._remember(stream, events[-1].seq or 0, row if row[0] is not None else None)
        else:
            self._forget(stream)
        return events


def _sqlite_insert(sql: Callable[[str], str], rows: list[tuple]) -> tuple[str, list]:
    """One multi-row INSERT of ``rows`` in ``sql``'s placeholder style."""
    statement, params = insert(ROW, rows)
    return sql(statement), params


@lru_cache(maxsize=64)
def _head_known_and_row_sqlite(n: int) -> str:
    return _HEAD_KNOWN_AND_ROW_SQLITE.format(ids=", ".join(["%s"] * n))


def _sqlite_transaction(
    store: StatementAppends,
    conn: BaseDatabaseWrapper,
    cur: CursorWrapper | sqlite3.Cursor,
    raw: sqlite3.Connection,
    stream: str,
    batch: list[Event],
    texts: list[str],
    expected_seq: int | None,
    sql: Callable[[str], str],
    *,
    begun: bool = False,
) -> list[Event] | None:
    """``BEGIN IMMEDIATE`` (unless ``begun``: the caller's, just now), the statements
    of ``_write_sqlite`` and ``COMMIT`` on ``cur``; rolled back on any error, or when
    they return None (and the store's hint of the stream, which their statements
    left, forgotten)."""
    if not begun:
        cur.execute("BEGIN IMMEDIATE")
    try:
        stored = store._write_sqlite(conn, cur, stream, batch, texts, expected_seq, sql)
        if stored is not None:
            cur.execute("COMMIT")
    finally:
        if raw.in_transaction:  # an error, or not the common case
            store._forget(stream)
            cur.execute("ROLLBACK")
    return stored


def _as_written(sql: str) -> str:
    return sql


@lru_cache(maxsize=256)
def _qmark(sql: str) -> str:
    """``sql``'s ``%s`` placeholders as the sqlite3 driver's ``?`` (Django's SQLite
    cursor converts every statement so; these are converted once)."""
    return _FORMAT.sub("?", sql).replace("%%", "%")


_FORMAT = re.compile(r"(?<!%)%s")


def run_steps(cur: CursorWrapper, using: str, steps: Steps) -> list[Event] | None:
    """Run an append's :data:`Steps` on the sync cursor ``cur`` of alias ``using``."""
    try:
        step = next(steps)
        while True:
            sql, params = step
            if sql is CATCH_UP:
                index_events(using, params)
                step = steps.send(None)
                continue
            try:
                cur.execute(sql, params)
            except IntegrityError as exc:
                step = steps.throw(exc)
                continue
            step = steps.send((cur.rowcount, cur.fetchone() if cur.description else None))
    except StopIteration as done:
        return done.value
