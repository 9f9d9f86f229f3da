"""The tests' flush of the PostgreSQL database (tests/flush.py) cannot deadlock with a
session that reads its tables meanwhile, as the Celery workers do after a test.

A reader holds the table Django's ``TRUNCATE`` takes last, and then reads the one it
takes first. Django's flush as it is deadlocks with it (PostgreSQL ends one of the two);
with :class:`~tests.flush.LockFirst` the flush waits, holding nothing, until the reader
is done, and then empties every table.
"""

from __future__ import annotations

import threading
import time
from typing import Any

import psycopg
import pytest
from django.contrib.auth.models import User
from django.core.management import call_command
from django.core.management.color import no_style
from django.core.management.sql import sql_flush
from django.db import connections

from tests.flush import _TRUNCATE, LockFirst

pytestmark = pytest.mark.django_db(databases=["default", "postgres"], transaction=True)

#: seconds a wait on the other session may take before the test fails
PATIENCE = 60


def until(condition: Any, what: str) -> None:
    end = time.monotonic() + PATIENCE
    while not condition():
        if time.monotonic() > end:
            raise AssertionError(f"not in {PATIENCE} s: {what}")
        time.sleep(0.01)


def flush_in_thread(alias: str, wrapper: LockFirst | None) -> tuple[threading.Thread, dict[str, Any]]:
    result: dict[str, Any] = {}

    def flush() -> None:
        try:
            if wrapper is None:
                call_command("flush", database=alias, interactive=False, verbosity=0)
            else:
                with connections[alias].execute_wrapper(wrapper):
                    call_command("flush", database=alias, interactive=False, verbosity=0)
            result["done"] = True
        except Exception as exc:  # the test reads it
            result["error"] = exc
        finally:
            connections.close_all()

    thread = threading.Thread(target=flush, daemon=True)
    thread.start()
    return thread, result


def deadlocked(exc: BaseException | None) -> bool:
    while exc is not None:
        if isinstance(exc, psycopg.errors.DeadlockDetected):
            return True
        exc = exc.__cause__ or exc.__context__
    return False


def reader(alias: str) -> tuple[psycopg.Connection, str, str]:
    """A session of its own (a transaction open) and the tables the flush takes first
    and last."""
    connection = connections[alias]
    match = _TRUNCATE.fullmatch(sql_flush(no_style(), connection)[0])
    assert match is not None
    tables = [t.strip() for t in match["tables"].split(",")]
    assert len(tables) > 2
    return connection.get_new_connection(connection.get_connection_params()), tables[0], tables[-1]


def awaited(session: psycopg.Connection, table: str) -> bool:
    """Does a session wait for the table's exclusive lock? (pg_locks is read afresh in
    a transaction; pg_stat_activity would be its snapshot.)"""
    return (
        session.execute(
            "SELECT count(*) FROM pg_locks WHERE NOT granted AND mode = "
            f"'AccessExclusiveLock' AND relation = '{table}'::regclass"
        ).fetchone()[0]
        > 0
    )


def test_the_flush_waits_for_a_reader_of_two_tables_holding_nothing(pg_alias):
    User.objects.using(pg_alias).create(username="kept-until-the-flush")
    session, first, last = reader(pg_alias)
    try:
        session.execute(f"SELECT 1 FROM {last} LIMIT 1")  # holds the last table
        lock_first = LockFirst()
        thread, result = flush_in_thread(pg_alias, lock_first)
        until(lambda: lock_first.attempts >= 2, "the flush tried to lock its tables, and again")
        session.execute(f"SELECT 1 FROM {first} LIMIT 1")  # the table a TRUNCATE takes first
        assert "done" not in result  # it waits for the reader
        session.commit()
    finally:
        session.close()
    thread.join(PATIENCE)
    assert result == {"done": True}
    assert not User.objects.using(pg_alias).exists()


def test_djangos_own_flush_deadlocks_with_that_reader(pg_alias):
    # The control: without LockFirst the same reader and flush close a cycle.
    session, first, last = reader(pg_alias)
    error: BaseException | None = None
    try:
        session.execute(f"SELECT 1 FROM {last} LIMIT 1")
        thread, result = flush_in_thread(pg_alias, None)
        until(lambda: awaited(session, last), "the flush waits for the last table, holding the first")
        try:
            session.execute(f"SELECT 1 FROM {first} LIMIT 1")
            session.commit()
        except psycopg.errors.DeadlockDetected as exc:
            error = exc
            session.rollback()
    finally:
        session.close()
    thread.join(PATIENCE)
    assert deadlocked(error) or deadlocked(result.get("error")), result
