"""Rows of ``aaa_event`` in plain SQL: the statements' fragments, an event from a row,
and a batch numbered into rows; shared by the store (:mod:`aaa_django.store`) and its
one-statement appends (:mod:`aaa_django.store.appends`). Plain SQL because building ORM
queries cost more than the database work itself (``benchmarks/bench_eventlog.py``).
"""

from __future__ import annotations

import json
from datetime import datetime, timezone
from typing import Any, Callable

from aaa_django.events import ClosedStreamError, ConcurrencyError, Event, EventList
from aaa_django.events.event import decode_blobs, encode_blobs
from aaa_django.events.store import closed_reason

COLUMNS = "(id, stream, seq, type, data, causation, time, blobs, tenant)"
INSERT = f"INSERT INTO aaa_event {COLUMNS} VALUES "
ROW = "(%s, %s, %s, %s, %s, %s, %s, %s, %s)"
ROW_PG = "(%s, %s, %s, %s, %s, %s, %s, %s::jsonb, %s)"
INSERT_ROW = INSERT + ROW
# Rows per INSERT statement: one statement (one round trip) for a usual batch, and
# SQLite's cap on the variables of a statement (999 in old builds) never reached.
INSERT_CHUNK = 100
SELECT = "SELECT id, stream, seq, type, data, causation, time, blobs, tenant FROM aaa_event"
HEAD = "SELECT seq FROM aaa_event WHERE stream = %s ORDER BY seq DESC LIMIT 1"
# SQLite caps the variables of one statement; ids are checked in chunks of this many.
SQLITE_CHUNK = 500
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
ROW_COLUMNS = ("run_id", "algorithm", "status", "outcome", "parent", "owner_id", "tokens_in",
               "tokens_out", "cost", "model_calls", "tool_calls", "last_seq", "due_at")


def cursor(conn):
    """A cursor of Django's ``conn`` for the store's plain statements. On PostgreSQL
    with psycopg 3: one that binds parameters on the server (Django's own cursor for
    ``OPTIONS["server_side_binding"]``, unnamed statements, so connection poolers are
    unaffected) whatever the site's option: the server then parses the statement
    without the values in it, and an append costs about 0.09 ms less than with the
    values quoted into its text (an event's JSON is most of the statement).
    Elsewhere (and on psycopg 2): ``conn.cursor()``. Django's execute wrappers and
    error translation apply either way."""
    if conn.vendor != "postgresql":
        return conn.cursor()
    binding = _server_binding_cursor()
    if binding is None:
        return conn.cursor()
    conn.ensure_connection()
    conn.validate_thread_sharing()
    raw = binding(conn.connection)
    return conn.make_debug_cursor(raw) if conn.queries_logged else conn.make_cursor(raw)


def _server_binding_cursor():
    try:
        from django.db.backends.postgresql.base import ServerBindingCursor
    except ImportError:  # psycopg 2
        return None
    return ServerBindingCursor


def to_event(row) -> Event:
    """An event from a row of ``SELECT`` (plain SQL: no ORM converters ran on it)."""
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


def read(conn, stream: str, *, after: int = 0, limit: int | None = None,
         tenant: str | None = None) -> EventList:
    """The stream's events after seq ``after`` (of one tenant; at most ``limit``), in
    order. Plain SQL: the ORM's query building cost more than the query."""
    sql, params = f"{SELECT} WHERE stream = %s AND seq > %s", [stream, after]
    if tenant is not None:
        sql += " AND tenant = %s"
        params.append(tenant)
    sql += " ORDER BY seq"
    if limit is not None:
        sql += " LIMIT %s"
        params.append(max(int(limit), 0))
    with cursor(conn) as cur:
        cur.execute(sql, params)
        events = EventList(to_event(row) for row in cur.fetchall())
    # Rows read inside a caller's transaction may still be rolled back: say so, and
    # the in-process holder will not share a state folded from them.
    events.committed = not conn.in_atomic_block
    return events


def streams(conn) -> list[str]:
    """The names of the streams in the log, in order."""
    with conn.cursor() as cur:
        cur.execute("SELECT DISTINCT stream FROM aaa_event ORDER BY stream")
        return [row[0] for row in cur.fetchall()]


def number(conn, batch: list[Event], texts: list[str], head: int, known, expected_seq):
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
    adapt = time_adapter(conn)
    for seq, (e, text, data) in enumerate(zip(batch, texts, datas), start=head + 1):
        stored.append(Event(id=e.id, stream=e.stream, type=e.type, data=data, seq=seq,
                            causation=e.causation, time=e.time, blobs=e.blobs, tenant=e.tenant))
        blobs = json.dumps(encode_blobs(e.blobs)) if e.blobs else "[]"
        rows.append((e.id, e.stream, seq, e.type, text, e.causation, adapt(e.time), blobs, e.tenant))
    return stored, rows


def time_adapter(conn) -> Callable[[datetime], Any]:
    """``conn.ops.adapt_datetimefield_value`` for event times. Where it keeps a UTC
    time as naive UTC text (SQLite with ``USE_TZ`` and no database ``TIME_ZONE``),
    that text directly: the same, without Django's checks, which were a third of the
    cost of numbering an event."""
    adapt = conn.ops.adapt_datetimefield_value
    if conn.vendor != "sqlite" or conn.timezone is not timezone.utc:
        return adapt
    utc = timezone.utc
    return lambda t: t.isoformat(" ")[:-6] if t.tzinfo is utc else adapt(t)  # "+00:00"


def insert(row: str, rows: list[tuple]) -> tuple[str, list]:
    """One multi-row INSERT (a round trip, where executemany adds a pipeline sync)."""
    return INSERT + ", ".join([row] * len(rows)), [v for r in rows for v in r]
