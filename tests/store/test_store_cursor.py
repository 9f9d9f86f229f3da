"""The store's cursor on PostgreSQL (``rows.cursor``): Django's error translation without
its cursor wrapper's other layers, unless the site logs queries or wraps them."""

from __future__ import annotations

import psycopg
import pytest
from django.db import DataError, ProgrammingError, connections, transaction
from django.db.backends.utils import CursorDebugWrapper, CursorWrapper
from django.db.transaction import TransactionManagementError

from aaa_django.events import Event
from aaa_django.runtime.event_types import RUN_STARTED
from aaa_django.store import DjangoEventStore, rows
from aaa_django.store.rows import StoreCursor

pytestmark = [pytest.mark.django_db(databases=["postgres"], transaction=True), pytest.mark.postgres]


def _run(stream: str) -> list[Event]:
    return [Event.new(stream, RUN_STARTED, {"algorithm": "x", "input": {}}),
            *(Event.new(stream, "aaa.llm.requested", {"i": i}) for i in range(3))]


def test_without_logging_or_wrappers_the_store_cursor_runs_an_append(pg_alias, monkeypatch):
    conn = connections[pg_alias]
    assert not conn.queries_logged and not conn.execute_wrappers
    ran: list[str] = []
    execute = StoreCursor.execute
    monkeypatch.setattr(StoreCursor, "execute",
                        lambda self, sql, params=None: (ran.append(sql), execute(self, sql, params))[1])
    store, events = DjangoEventStore(pg_alias), _run("run-cursor")
    store.append_sync(events[:2])
    store.append_sync(events[2:3])
    assert ran and ran[-1].startswith("SELECT aaa_append_event(")  # one event of a run: the call
    assert [e.seq for e in store.read_sync("run-cursor")] == [1, 2, 3]
    with rows.cursor(conn) as cur:
        assert type(cur) is StoreCursor


def test_with_queries_logged_or_wrapped_djangos_cursor_sees_the_statements(pg_alias):
    conn = connections[pg_alias]
    store, events = DjangoEventStore(pg_alias), _run("run-seen")
    store.append_sync(events[:2])
    seen: list[str] = []

    def record(execute, sql, params, many, context):
        seen.append(sql)
        return execute(sql, params, many, context)

    with conn.execute_wrapper(record):
        with rows.cursor(conn) as cur:
            assert type(cur) is CursorWrapper
        store.append_sync(events[2:3])
    assert [s.split("(")[0] for s in seen] == ["SELECT aaa_append_event"]

    conn.force_debug_cursor = True
    try:
        conn.queries_log.clear()
        with rows.cursor(conn) as cur:
            assert isinstance(cur, CursorDebugWrapper)
        store.append_sync(events[3:4])
        logged = [q["sql"] for q in conn.queries]
    finally:
        conn.force_debug_cursor = False
    assert len(logged) == 1 and logged[0].startswith("SELECT aaa_append_event(")


def test_the_store_cursor_translates_the_drivers_errors_as_django_does(pg_alias):
    conn = connections[pg_alias]
    with rows.cursor(conn) as cur:
        with pytest.raises(DataError) as refused:
            cur.execute("SELECT 1 / 0", [])
        assert isinstance(refused.value.__cause__, psycopg.errors.DivisionByZero)
        cur.execute("SET application_name = 'aaa test'", [])  # no result to fetch
        with pytest.raises(ProgrammingError) as fetched:
            cur.fetchone()
        assert isinstance(fetched.value.__cause__, psycopg.ProgrammingError)
        cur.execute("SELECT 2", [])
        assert cur.fetchall() == [(2,)] and cur.rowcount == 1 and cur.description[0].name == "?column?"


def test_the_store_cursor_refuses_a_statement_in_a_broken_transaction(pg_alias):
    conn = connections[pg_alias]
    with transaction.atomic(using=pg_alias):
        transaction.set_rollback(True, using=pg_alias)
        with rows.cursor(conn) as cur, pytest.raises(TransactionManagementError):
            cur.execute("SELECT 1", [])
