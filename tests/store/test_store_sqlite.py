"""Appends on SQLite. Outside a caller's transaction an append is one short
transaction of its own: BEGIN IMMEDIATE, the INSERT and the run row's UPDATE, COMMIT;
on any error it is rolled back whole. The head and the run's row come from the store's
last append of the stream (a hint) or, without one or when the INSERT refuses it (the
log moved since), from one query (the head, the ids stored already, the run's index
row). Inside a caller's transaction it joins it. Either way the events and the run
index commit, or roll back, together."""

from __future__ import annotations

import contextlib
import sqlite3
from datetime import datetime, timedelta, timezone

import pytest
from django.db import DatabaseError, OperationalError, connections, transaction

from aaa_django.events import ConcurrencyError, Event, StoreUnavailable
from aaa_django.models import RunRecord
from aaa_django.store import DjangoEventStore
from aaa_django.store.rows import time_adapter
from tests.store.test_runindex_statement import assert_row_is_the_log_folded, log_of
from tests.store.test_runindex_statement import row as statement_row

# transaction=True: appends made outside any transaction, as a Celery task's or a
# management command's are (a test transaction would make every append join it).
pytestmark = pytest.mark.django_db(databases=["default"], transaction=True)

ALIAS = "default"


@contextlib.contextmanager
def statements(fail=None):
    """The SQL run on the connection, each as its first words ("BEGIN IMMEDIATE",
    "SELECT", "INSERT", "UPDATE aaa_run", ...). ``fail(kind)`` may return an exception
    to raise instead of running a statement."""
    seen: list[str] = []

    def record(execute, sql, params, many, context):
        words = sql.split()
        kind = " ".join(words[:2]) if words[0] in ("BEGIN", "UPDATE") else words[0]
        error = fail(kind) if fail else None
        if error is not None:
            raise error
        seen.append(kind)
        return execute(sql, params, many, context)

    with connections[ALIAS].execute_wrapper(record):
        yield seen


def no_transaction_open() -> bool:
    conn = connections[ALIAS]
    return conn.get_autocommit() and not conn.connection.in_transaction


def row(run_id: str) -> dict:
    return statement_row(run_id, ALIAS)


def test_an_append_outside_a_transaction_is_one_transaction_of_its_own():
    store = DjangoEventStore(ALIAS)
    store.append_sync([Event.new("plain", "test.happened", {"i": 0})])

    with statements() as sql:
        stored = store.append_sync([Event.new("plain", "test.happened", {"i": i}) for i in (1, 2, 3)])

    assert sql == ["BEGIN IMMEDIATE", "INSERT", "COMMIT"]  # its last append's head: no query
    assert [e.seq for e in stored] == [2, 3, 4] and no_transaction_open()
    assert [e.data for e in store.read_sync("plain")] == [{"i": i} for i in range(4)]

    with statements() as sql:  # a store that has not appended to the stream asks
        stored = DjangoEventStore(ALIAS).append_sync([Event.new("plain", "test.happened", {"i": 4})])
    assert sql == ["BEGIN IMMEDIATE", "SELECT", "INSERT", "COMMIT"] and stored[0].seq == 5


def test_a_hint_of_a_log_that_moved_since_is_refused_and_the_append_asks():
    """Another store (another process) appended after this store's hint: the INSERT on
    the hint is refused whole (the unique (stream, seq) index), in the same
    transaction the query finds the head and the INSERT numbers after it."""
    store, other, events = DjangoEventStore(ALIAS), DjangoEventStore(ALIAS), log_of("run-h")
    store.append_sync(events[:3])
    other.append_sync(events[3:5])

    with statements() as sql:
        stored = store.append_sync(events[5:7])

    assert sql == ["BEGIN IMMEDIATE", "INSERT", "SELECT", "INSERT", "UPDATE aaa_run", "COMMIT"]
    assert [e.seq for e in stored] == [6, 7]
    assert [e.id for e in store.read_sync("run-h")] == [e.id for e in events[:7]]
    assert row("run-h")["last_seq"] == 7 and row("run-h")["tool_calls"] == 1
    with statements() as sql:  # its hint now the query's
        store.append_sync(events[7:])
    assert sql == ["BEGIN IMMEDIATE", "INSERT", "UPDATE aaa_run", "COMMIT"]
    assert_row_is_the_log_folded(store, "run-h", ALIAS)


def test_an_append_of_stored_ids_only_reads():
    store = DjangoEventStore(ALIAS)
    events = [Event.new("plain", "test.happened", {"i": i}) for i in range(3)]
    store.append_sync(events[:2])

    with statements() as sql:
        stored = store.append_sync(events)  # two absorbed, one new

    assert [(e.id, e.seq) for e in stored] == [(events[2].id, 3)]
    # the hint's INSERT of all three refused (two ids stored), the query, the new one
    assert sql == ["BEGIN IMMEDIATE", "INSERT", "SELECT", "INSERT", "COMMIT"]
    with statements() as sql:
        assert store.append_sync(events) == []
    assert sql == ["BEGIN IMMEDIATE", "INSERT", "SELECT", "COMMIT"]  # nothing to write
    assert no_transaction_open()


@pytest.mark.parametrize("batches", [[10], [1] * 10, [3, 4, 3], [1, 9], [8, 2]])
def test_a_runs_row_is_updated_in_the_same_transaction_as_its_events(batches):
    store, events, i = DjangoEventStore(ALIAS), log_of("run-a"), 0
    for n in batches:
        with statements() as sql:
            assert len(store.append_sync(events[i : i + n])) == n
        if i == 0:
            # The run's first events make its row, in the same transaction.
            assert sql == ["BEGIN IMMEDIATE", "SELECT", "INSERT", "INSERT", "COMMIT"]
        else:
            assert sql == ["BEGIN IMMEDIATE", "INSERT", "UPDATE aaa_run", "COMMIT"]
        store.append_sync(events[i : i + n])  # again: absorbed, the row unchanged
        i += n

    assert_row_is_the_log_folded(store, "run-a", ALIAS)


def test_a_runs_start_behind_an_id_stored_elsewhere_still_makes_its_row():
    store, events = DjangoEventStore(ALIAS), log_of("run-e")
    other = Event.new("elsewhere", "test.happened", {})
    store.append_sync([other])
    again = Event(id=other.id, stream="run-e", type="test.happened", data={})

    stored = store.append_sync([again, *events[:3]])  # the first one is absorbed

    assert [(e.type, e.seq) for e in stored][0] == ("aaa.run.started", 1)
    assert row("run-e")["last_seq"] == 3 and row("run-e")["status"] == "running"


def test_a_row_behind_its_log_is_caught_up_by_the_transactional_path():
    store, events = DjangoEventStore(ALIAS), log_of("run-b")
    store.append_sync(events[:4])
    RunRecord.objects.filter(pk="run-b").update(last_seq=2, tokens_in=0)  # behind

    with statements() as sql:
        store.append_sync(events[4:6])

    # the row's guard (its last_seq) refuses the hint's UPDATE: not the common case
    assert sql[:4] == ["BEGIN IMMEDIATE", "INSERT", "UPDATE aaa_run", "ROLLBACK"]
    assert row("run-b")["last_seq"] == 6 and row("run-b")["tokens_in"] == 7
    assert [e.seq for e in store.read_sync("run-b")] == [1, 2, 3, 4, 5, 6]


def test_a_refused_append_rolls_back_and_writes_nothing():
    store = DjangoEventStore(ALIAS)
    store.append_sync([Event.new("plain", "test.happened", {})])

    with statements() as sql, pytest.raises(ConcurrencyError):
        store.append_sync([Event.new("plain", "test.happened", {})], expected_seq=0)

    assert sql == ["BEGIN IMMEDIATE", "SELECT", "ROLLBACK"]
    assert len(store.read_sync("plain")) == 1 and no_transaction_open()
    assert store.append_sync([Event.new("plain", "test.happened", {})])[0].seq == 2


@pytest.mark.parametrize("at", ["UPDATE aaa_run", "COMMIT"])
def test_an_error_after_the_insert_rolls_back_the_events_and_the_row(at):
    store, events = DjangoEventStore(ALIAS), log_of("run-c")
    store.append_sync(events[:3])
    before = row("run-c")

    with statements(lambda kind: RuntimeError("boom") if kind == at else None) as sql:
        with pytest.raises(RuntimeError):
            store.append_sync(events[3:6])

    assert sql[-1] == "ROLLBACK" and "INSERT" in sql
    assert [e.seq for e in store.read_sync("run-c")] == [1, 2, 3] and row("run-c") == before
    assert no_transaction_open()
    store.append_sync(events[3:6])  # the connection is fine
    assert row("run-c")["last_seq"] == 6


def test_a_lost_race_is_retried_from_scratch():
    # "database is locked" (another writer) at any statement: the attempt is rolled
    # back and the append starts again.
    store = DjangoEventStore(ALIAS)
    store.append_sync([Event.new("plain", "test.happened", {})])
    failures = iter([OperationalError("database is locked")])

    def fail(kind):
        return next(failures, None) if kind == "COMMIT" else None

    with statements(fail) as sql:
        stored = store.append_sync([Event.new("plain", "test.happened", {"n": n}) for n in range(2)])

    # (the hint the rolled-back attempt left is forgotten: the retry asks)
    assert sql == ["BEGIN IMMEDIATE", "INSERT", "ROLLBACK", "BEGIN IMMEDIATE", "SELECT", "INSERT", "COMMIT"]
    assert [e.seq for e in stored] == [2, 3]
    assert [e.seq for e in store.read_sync("plain")] == [1, 2, 3]


class Rollback(Exception):
    pass


@pytest.mark.parametrize("outcome", ["commit", "rollback"])
def test_inside_a_callers_transaction_an_append_joins_it(outcome):
    store, events = DjangoEventStore(ALIAS), log_of("run-d")
    store.append_sync(events[:3])
    before = row("run-d")

    with contextlib.suppress(Rollback), statements() as sql:
        with transaction.atomic(using=ALIAS):
            store.append_sync(events[3:6])
            assert [e.seq for e in store.read_sync("run-d")] == [1, 2, 3, 4, 5, 6]
            if outcome == "rollback":
                raise Rollback

    # One transaction, the caller's (its BEGIN); the append is a savepoint in it.
    assert sql.count("BEGIN IMMEDIATE") == 1 and "SAVEPOINT" in sql and "COMMIT" not in sql
    if outcome == "commit":
        assert len(store.read_sync("run-d")) == 6 and row("run-d")["last_seq"] == 6
    else:
        assert len(store.read_sync("run-d")) == 3 and row("run-d") == before


@pytest.mark.parametrize(
    "when",
    [
        datetime(2026, 3, 4, 5, 6, 7, 123456, tzinfo=timezone.utc),
        datetime(2026, 3, 4, 5, 6, 7, tzinfo=timezone.utc),  # no microseconds: none written
        datetime(9, 1, 2, 3, 4, 5, 6, tzinfo=timezone.utc),
        datetime(2026, 3, 4, 5, 6, 7, 890, tzinfo=timezone(timedelta(hours=2))),
    ],
)
def test_event_times_are_stored_as_django_stores_them(when):
    conn = connections[ALIAS]
    assert time_adapter(conn)(when) == conn.ops.adapt_datetimefield_value(when)


# -- the driver's own cursor ---------------------------------------------------------------
# Without execute wrappers and query logging (the common case: the tests above install a
# wrapper, so they see Django's cursor), the one-transaction append runs its statements
# on the sqlite3 driver's cursor, inside Django's error translation. The driver's trace
# callback shows them; its authorizer makes one fail.


@contextlib.contextmanager
def driver_statements():
    """The statements the sqlite3 driver runs, each as its first words (the inserts of
    an executemany, and the statements of the triggers they fire, as one "INSERT")."""
    conn = connections[ALIAS]
    conn.ensure_connection()
    seen: list[str] = []

    def trace(sql: str) -> None:
        words = sql.split()
        kind = " ".join(words[:2]) if words[0] in ("BEGIN", "UPDATE") else words[0]
        # (a statement that fires a trigger is traced again for each step of it: the
        # run row's change position, migration 0012)
        if not (kind in ("INSERT", "UPDATE aaa_run") and seen and seen[-1] == kind):
            seen.append(kind)

    raw = conn.connection
    raw.set_trace_callback(trace)
    try:
        yield seen
    finally:
        with contextlib.suppress(sqlite3.ProgrammingError):  # closed after a fault
            raw.set_trace_callback(None)


def test_an_append_runs_its_statements_on_the_drivers_cursor():
    store, events = DjangoEventStore(ALIAS), log_of("run-f")
    store.append_sync(events[:3])
    conn = connections[ALIAS]
    assert not conn.execute_wrappers and not conn.queries_logged

    with driver_statements() as sql:
        stored = store.append_sync(events[3:6])

    assert sql == ["BEGIN IMMEDIATE", "INSERT", "UPDATE aaa_run", "COMMIT"]
    assert [e.seq for e in stored] == [4, 5, 6] and no_transaction_open()
    assert row("run-f")["last_seq"] == 6


def test_with_queries_logged_an_append_goes_through_djangos_cursor():
    store = DjangoEventStore(ALIAS)
    conn = connections[ALIAS]
    store.append_sync([Event.new("plain", "test.happened", {})])
    conn.force_debug_cursor = True
    try:
        conn.queries_log.clear()
        store.append_sync([Event.new("plain", "test.happened", {})])
        logged = [q["sql"].split()[0] for q in conn.queries]
    finally:
        conn.force_debug_cursor = False
    assert logged == ["BEGIN", "INSERT", "COMMIT"]


def test_on_the_drivers_cursor_an_error_rolls_back_the_events_and_the_row():

    store, events = DjangoEventStore(ALIAS), log_of("run-g")
    store.append_sync(events[:3])
    before = row("run-g")
    raw = connections[ALIAS].connection

    def deny_run_updates(action, table, *_):
        return sqlite3.SQLITE_DENY if action == sqlite3.SQLITE_UPDATE and table == "aaa_run" else sqlite3.SQLITE_OK

    raw.set_authorizer(deny_run_updates)
    with driver_statements() as sql, pytest.raises(StoreUnavailable) as caught:
        store.append_sync(events[3:6])
    # (a fault closes the connection, CONN_MAX_AGE being 0: the next call connects anew)
    with contextlib.suppress(sqlite3.ProgrammingError):
        raw.set_authorizer(None)

    # Django's translation of the driver's error, and nothing of the append kept
    assert isinstance(caught.value.__cause__, DatabaseError)
    assert isinstance(caught.value.__cause__.__cause__, sqlite3.DatabaseError)
    assert sql[:2] == ["BEGIN IMMEDIATE", "INSERT"] and sql[-1] == "ROLLBACK"
    assert [e.seq for e in store.read_sync("run-g")] == [1, 2, 3] and row("run-g") == before
    assert no_transaction_open()
    store.append_sync(events[3:6])  # the connection is fine
    assert row("run-g")["last_seq"] == 6


def test_on_the_drivers_cursor_a_locked_database_is_a_race_retried():
    store = DjangoEventStore(ALIAS)
    store.append_sync([Event.new("plain", "test.happened", {})])
    conn = connections[ALIAS]
    other = sqlite3.connect(conn.settings_dict["NAME"], isolation_level=None)
    other.execute("BEGIN IMMEDIATE")  # another writer holds the lock throughout
    conn.connection.execute("PRAGMA busy_timeout = 0")
    try:
        with driver_statements() as sql, pytest.raises(ConcurrencyError, match="lost a race"):
            store.append_sync([Event.new("plain", "test.happened", {})])
    finally:
        other.execute("ROLLBACK")
        other.close()
        conn.connection.execute("PRAGMA busy_timeout = 20000")

    assert sql.count("BEGIN IMMEDIATE") == 20 and "INSERT" not in sql  # tried each time
    assert no_transaction_open()
    assert store.append_sync([Event.new("plain", "test.happened", {})])[0].seq == 2
