"""Rows of ``aaa_event`` in plain SQL: the statements' fragments, an event from a row,
and a batch numbered into rows; shared by the store (:mod:`aaa_django.store`) and its
one-statement appends (:mod:`aaa_django.store.appends`). Plain SQL because building ORM
queries cost more than the database work itself (``benchmarks/bench_eventlog.py``).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Collection, Iterator, Sequence
from datetime import UTC, datetime
from functools import cache
from typing import TYPE_CHECKING, Any

from pydantic_core import from_json

from aaa_django.events import ClosedStreamError, ConcurrencyError, Event, EventList
from aaa_django.events.event import decode_blobs, encode_blobs, stored_event
from aaa_django.events.store import closed_reason

if TYPE_CHECKING:
    from django.db.backends.base.base import BaseDatabaseWrapper

COLUMNS = "(id, stream, seq, type, data, causation, time, blobs, tenant)"
INSERT = f"INSERT INTO aaa_event {COLUMNS} VALUES "
ROW = "(%s, %s, %s, %s, %s, %s, %s, %s, %s)"
ROW_PG = "(%s, %s, %s, %s, %s, %s, %s, %s::jsonb, %s)"
INSERT_ROW = INSERT + ROW
# Rows per INSERT statement: one statement (one round trip) for a usual batch, and
# SQLite's cap on the variables of a statement (999 in old builds) never reached.
INSERT_CHUNK = 100


def event_columns(vendor: str, table: str = "") -> str:
    """An event's columns as the store's reads select them (``table``: its name or
    alias in the query), the time as naive UTC text on SQLite and PostgreSQL, which
    :func:`to_event` parses in C (``datetime.fromisoformat``). Selected as a column,
    it would go on SQLite through the converter Django registers with the sqlite3
    module for the declared type "datetime", and on PostgreSQL through Django's
    timestamptz loader (psycopg's Python parser): each, with its ``replace(tzinfo=)``,
    a fifth of the cost of a row."""
    p = f"{table}." if table else ""
    time = {
        "sqlite": f"CAST({p}time AS TEXT)",  # an expression has no declared type
        "postgresql": f"to_char({p}time AT TIME ZONE 'UTC', 'YYYY-MM-DD HH24:MI:SS.US')",
    }.get(vendor, f"{p}time")
    return ", ".join(
        [f"{p}id", f"{p}stream", f"{p}seq", f"{p}type", f"{p}data", f"{p}causation", time, f"{p}blobs", f"{p}tenant"]
    )


@cache
def select(vendor: str) -> str:
    """The start of a read's statement on ``vendor``: the events' columns (see
    :func:`event_columns`) from ``aaa_event``."""
    return f"SELECT {event_columns(vendor)} FROM aaa_event"


HEAD = "SELECT seq FROM aaa_event WHERE stream = %s ORDER BY seq DESC LIMIT 1"
# SQLite caps the variables of one statement; ids are checked in chunks of this many.
SQLITE_CHUNK = 500


def among(keys: Sequence[str], *, pg: bool) -> Iterator[tuple[str, list[object]]]:
    """``(test, params)`` for a column being one of ``keys`` (none for no keys): on
    PostgreSQL one ``= ANY(%s)`` (one array parameter, however many keys); on SQLite
    ``IN (%s, ...)`` chunk by chunk of ``SQLITE_CHUNK`` (one parameter a key, under its cap)."""
    if pg:
        if keys:
            yield "= ANY(%s)", [list(keys)]
        return
    for i in range(0, len(keys), SQLITE_CHUNK):
        chunk: list[object] = list(keys[i : i + SQLITE_CHUNK])
        yield f"IN ({', '.join(['%s'] * len(chunk))})", chunk


#: how the triggers' refusals of a closed stream begin (migration 0006): the store
#: raises ``ClosedStreamError`` for them, and no retry
CLOSED = "aaa_event stream closed"
#: ... and how the one of a run that has ended goes on
ENDED = CLOSED + ": nothing is appended after"


def closed_refusal(stream: str, exc: Exception) -> ClosedStreamError | None:
    """The :class:`ClosedStreamError` that the database's refusal ``exc`` stands for
    (the triggers of migration 0006: final, no retry), or None (another refusal, such
    as a lost race)."""
    text = str(exc)
    if CLOSED not in text:
        return None
    return ClosedStreamError(closed_reason(stream, ended=ENDED in text))


#: the columns of a run's index row (``aaa_run``) that the fold of its next events
#: reads (see ``aaa_django.store.runindex.row_update``); appends read them with the head
ROW_COLUMNS = (
    "run_id",
    "algorithm",
    "status",
    "outcome",
    "parent",
    "owner_id",
    "tokens_in",
    "tokens_out",
    "cost",
    "model_calls",
    "tool_calls",
    "last_seq",
    "due_at",
)


def prepares(raw: object) -> bool:
    """Whether the driver's connection ``raw`` prepares the statements it runs often:
    psycopg 3's with a ``prepare_threshold`` (Django turns it off unless the alias's
    ``OPTIONS`` name one; the store's own connections set theirs,
    :mod:`aaa_django.store.connections`). psycopg 2's never do."""
    try:
        from psycopg import BaseConnection
    except ImportError:  # psycopg 2
        return False
    return isinstance(raw, BaseConnection) and raw.prepare_threshold is not None


def to_event(row: Sequence[Any], data: dict[str, Any] | None = None) -> Event:
    """An event from a row of :func:`select`'s statement; ``data``: its
    data decoded already (see :func:`to_events`)."""
    id_, stream, seq, type_, text, causation, time_, blobs, tenant = row
    if time_.__class__ is str:  # UTC text (see event_columns)
        time_ = utc_time(time_)
    elif time_.tzinfo is None:  # stored as naive UTC (a site with USE_TZ = False)
        time_ = time_.replace(tzinfo=UTC)
    if blobs.__class__ is str:  # JSON text (SQLite; Django loads jsonb as text)
        blobs = () if blobs == "[]" else decode_blobs(loads(blobs))
    else:
        blobs = decode_blobs(blobs) if blobs else ()
    if data is None:
        data = loads(text)
    return stored_event(id_, stream, seq, type_, data, causation, time_, blobs, tenant)


def to_events(rows: Sequence[Sequence[Any]], at: int | None = None) -> EventList:
    """The events in ``rows`` of :func:`select`'s statement; ``at``: rows that hold an
    event's columns from ``at`` on, among others (a row whose id there is NULL has
    none). The data of all of them is decoded at once: one call for an array of the
    texts costs about half as much as one per row."""
    if at is not None:
        rows = [r[at : at + 9] for r in rows if r[at] is not None]
    if not rows:
        return EventList()
    if len(rows) == 1:
        return EventList([to_event(rows[0])])
    datas = loads(f"[{','.join([r[4] for r in rows])}]")
    if len(datas) != len(rows):  # a text that is not one JSON value: say which
        return EventList(to_event(r) for r in rows)
    return EventList(map(to_event, rows, datas))


def loads(text: str) -> Any:
    """JSON text decoded as ``json.loads`` decodes it, by pydantic-core's parser
    (``pydantic_core.from_json``: 2-3x as fast on event data here, and the same
    values: big integers, floats, key order); what that one refuses (an escaped lone
    surrogate, nesting past its depth limit) by json itself, which also raises the
    usual ``JSONDecodeError`` for text that is not JSON."""
    try:
        return from_json(text)
    except ValueError:
        return json.loads(text)


def utc_time(text: str) -> datetime:
    """An aware datetime from a time's stored text (naive text is UTC: how Django's SQLite
    backend stores an aware time)."""
    if len(text) in _NAIVE_LENGTHS:  # "2026-12-01 10:00:00[.123456]": parse it aware
        return datetime.fromisoformat(text + "+00:00")  # (replace(tzinfo=) costs 4x)
    found = datetime.fromisoformat(text)
    return found if found.tzinfo is not None else found.replace(tzinfo=UTC)


_NAIVE_LENGTHS = frozenset({19, 26})


def read(
    conn: BaseDatabaseWrapper, stream: str, *, after: int = 0, limit: int | None = None, tenant: str | None = None
) -> EventList:
    """The stream's events after seq ``after`` (of one tenant; at most ``limit``), in
    order. Plain SQL: the ORM's query building cost more than the query."""
    sql, params = f"{select(conn.vendor)} WHERE stream = %s AND seq > %s", [stream, after]
    if tenant is not None:
        sql += " AND tenant = %s"
        params.append(tenant)
    sql += " ORDER BY seq"
    if limit is not None:
        sql += " LIMIT %s"
        params.append(max(int(limit), 0))
    with conn.cursor() as cur:
        cur.execute(sql, params)
        events = to_events(cur.fetchall())
    # Rows read inside a caller's transaction may still be rolled back: say so, and
    # the in-process holder will not share a state folded from them.
    events.committed = not conn.in_atomic_block
    return events


def streams(conn: BaseDatabaseWrapper) -> list[str]:
    """The names of the streams in the log, in order."""
    return distinct(conn, "stream")


#: (table, column) of the log and the run index whose column leads an index (events:
#: ``(stream, seq)``, ``type``; runs: ``status``, ``(outcome, ended_at)``, ``algorithm``):
#: :func:`distinct`'s
_LEADING = frozenset(
    {
        ("aaa_event", "stream"),
        ("aaa_event", "type"),
        ("aaa_run", "status"),
        ("aaa_run", "outcome"),
        ("aaa_run", "algorithm"),
    }
)


def distinct(conn: BaseDatabaseWrapper, column: str, table: str = "aaa_event") -> list[str]:
    """The distinct values of ``column`` in ``table`` (one that leads an index, see
    ``_LEADING``; NULL is not a value), in order, found one index probe a value (the
    next value above the last, a recursive query: a "loose index scan", which neither
    PostgreSQL before 18 nor SQLite plans for ``SELECT DISTINCT``): what the values
    cost, not the table's length. (At 2 million events ``SELECT DISTINCT type`` read
    the whole index, 77-86 ms, and this 0.5 ms; the streams of 20,000 runs 241 ms and
    134 ms; at a million runs their outcomes 77 ms; on ``benchmarks/bench_scale.py``'s
    tables.)"""
    if (table, column) not in _LEADING:
        raise ValueError(f"not a leading column of an index: {table}.{column}")
    sql = (
        f"WITH RECURSIVE t(v) AS (SELECT min({column}) FROM {table} UNION ALL "
        f"SELECT (SELECT min({column}) FROM {table} WHERE {column} > t.v) FROM t "
        "WHERE t.v IS NOT NULL) SELECT v FROM t WHERE v IS NOT NULL"
    )
    with conn.cursor() as cur:
        cur.execute(sql)
        return [row[0] for row in cur.fetchall()]


def number(
    conn: BaseDatabaseWrapper,
    batch: list[Event],
    texts: list[str],
    head: int,
    known: Collection[str],
    expected_seq: int | None,
) -> tuple[list[Event], list[tuple]]:
    """The events of ``batch`` not stored yet, numbered after ``head``, and their rows."""
    if expected_seq is not None and expected_seq != head:
        raise ConcurrencyError(f"stream head is {head}, expected {expected_seq}")
    if known:
        known = set(known)
        batch, texts = [e for e in batch if e.id not in known], [t for e, t in zip(batch, texts) if e.id not in known]
    for seq, e in enumerate(batch, start=head + 1):
        if e.seq is not None and e.seq != seq:
            raise ConcurrencyError(f"event {e.id} claims seq {e.seq} but the next seq is {seq}")
    if not batch:
        return [], []
    # What the caller gets back is what a reader will get: the decoded text (one
    # decode for the batch: a JSON array of the texts), by the readers' decoder.
    datas = loads(f"[{','.join(texts)}]") if len(texts) > 1 else [loads(texts[0])]
    stored, rows = [], []
    adapt = time_adapter(conn)
    for seq, (e, text, data) in enumerate(zip(batch, texts, datas), start=head + 1):
        stored.append(
            stored_event(e.id, e.stream, seq, e.type, data, e.causation, e.time, e.blobs, e.tenant)
        )  # (checked: ``prepare_batch``)
        blobs = json.dumps(encode_blobs(e.blobs)) if e.blobs else "[]"
        rows.append((e.id, e.stream, seq, e.type, text, e.causation, adapt(e.time), blobs, e.tenant))
    return stored, rows


def time_adapter(conn: BaseDatabaseWrapper) -> Callable[[datetime], Any]:
    """``conn.ops.adapt_datetimefield_value`` for event times. Where it keeps a UTC
    time as naive UTC text (SQLite with ``USE_TZ`` and no database ``TIME_ZONE``),
    that text directly: the same, without Django's checks, which were a third of the
    cost of numbering an event."""
    adapt = conn.ops.adapt_datetimefield_value
    if conn.vendor != "sqlite" or conn.timezone is not UTC:
        return adapt
    utc = UTC
    return lambda t: t.isoformat(" ")[:-6] if t.tzinfo is utc else adapt(t)  # "+00:00"


def insert(row: str, rows: list[tuple]) -> tuple[str, list]:
    """One multi-row INSERT (a round trip, where executemany adds a pipeline sync)."""
    return INSERT + ", ".join([row] * len(rows)), [v for r in rows for v in r]
