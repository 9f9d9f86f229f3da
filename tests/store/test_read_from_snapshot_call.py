"""PostgreSQL: a snapshot read on a connection that prepares nothing is the call of
migration 0011's function (its plan the session's), on one that prepares it is the
statement; both return the same rows, whatever the log holds.

Django's own connection prepares nothing (Django turns psycopg's ``prepare_threshold``
off unless ``OPTIONS`` names one), so the Django store's reads take the call; the
store's own connections prepare when nothing pools them, and a pooled alias's do not.
The contract suite (``tests/store/test_eventstore_django.py``) reads snapshots through
both: the Django store (the call) and ``PgEventStore`` (the statement)."""

from __future__ import annotations

import pytest
from django.db import connections

from aaa_django.events import Snapshot
from aaa_django.store import DjangoEventStore, database, postgres
from aaa_django.store.database import READ_FROM_SNAPSHOT_CALL, read_from_snapshot_sql
from aaa_django.store.postgres import PgEventStore
from aaa_django.testing.eventstore import ev, run

from .test_pg_connections import conns_with

pytestmark = pytest.mark.django_db(databases=["postgres"], transaction=True)

STATEMENT = read_from_snapshot_sql("postgresql")


def test_the_call_is_for_postgresql_connections_that_prepare_nothing():
    assert read_from_snapshot_sql("postgresql", prepares=False) == READ_FROM_SNAPSHOT_CALL
    assert STATEMENT.startswith("SELECT s.seq, s.event_id")
    assert read_from_snapshot_sql("sqlite", prepares=False) == read_from_snapshot_sql("sqlite")


def log_with_snapshot(
    store: DjangoEventStore, stream: str, events: int, at: int | None, *, blobs: bool = False
) -> None:
    """``events`` events on ``stream`` (one of them with a blob ref and a tenant when
    ``blobs``), and a snapshot of ``test.tally`` v1 at seq ``at`` (None: none; past
    the log: a snapshot ahead of it, its event id made up)."""
    from aaa_django.data import BlobRef

    extra = {"blobs": (BlobRef(sha256="ab" * 32, size=3, media_type="text/plain"),), "tenant": "t1"} if blobs else {}
    stored = (
        store.append_sync(
            [
                ev(stream, data={"i": i}, causation="c0" if i else None, **(extra if i == 1 else {}))
                for i in range(events)
            ]
        )
        if events
        else []
    )
    if at is not None:
        event_id = stored[at - 1].id if at <= len(stored) else "not-in-the-log"
        store.save_snapshot_sync(Snapshot(stream, "test.tally", 1, at, event_id, f'{{"n":{at}}}'))


@pytest.mark.parametrize(
    ("events", "at", "asked"),
    [
        (12, 7, ("test.tally", 1)),  # the snapshot, its event and the five after it
        (12, 12, ("test.tally", 1)),  # at the head: its event alone
        (5, 9, ("test.tally", 1)),  # ahead of the log: the snapshot, a row of NULL events
        (0, 3, ("test.tally", 1)),  # a log erased since: the snapshot alone
        (12, 7, ("test.tally", 2)),  # another version: no row
        (12, None, ("test.tally", 1)),  # no snapshot: no row
    ],
    ids=["mid-log", "at-head", "ahead", "no-log", "other-version", "none"],
)
def test_the_call_returns_the_statements_rows(pg_alias, events, at, asked):
    store = DjangoEventStore(pg_alias)
    stream = f"run-snapcall-{events}-{at}-{asked[1]}"
    log_with_snapshot(store, stream, events, at, blobs=True)
    with connections[pg_alias].cursor() as cur:
        cur.execute(STATEMENT, [stream, *asked])
        statement = cur.fetchall()
        cur.execute(READ_FROM_SNAPSHOT_CALL, [stream, *asked])
        call = cur.fetchall()
    assert call == statement
    if at is not None and asked[1] == 1:
        assert call[0][2] == f'{{"n":{at}}}'  # the state, in the first row
        assert [row[5] for row in call] == ([None] if events < at else list(range(at, events + 1)))


def test_the_django_store_reads_by_the_call_and_gets_the_snapshot_and_its_tail(pg_alias):
    store = DjangoEventStore(pg_alias)
    log_with_snapshot(store, "run-snapcall-django", 10, 4)
    sent: list[str] = []

    def record(execute, sql, params, many, context):
        sent.append(sql)
        return execute(sql, params, many, context)

    with connections[pg_alias].execute_wrapper(record):
        snapshot, events = store.read_from_snapshot_sync("run-snapcall-django", "test.tally", 1)
    assert sent == [READ_FROM_SNAPSHOT_CALL]
    assert (snapshot.seq, snapshot.state) == (4, '{"n":4}')
    assert [e.seq for e in events] == list(range(4, 11))
    assert events == store.read_sync("run-snapcall-django", after=3)


@pytest.mark.parametrize(
    ("changes", "expected"),
    [
        ({}, STATEMENT),
        ({"OPTIONS": {"prepare_threshold": None}}, READ_FROM_SNAPSHOT_CALL),
        ({"DISABLE_SERVER_SIDE_CURSORS": True}, READ_FROM_SNAPSHOT_CALL),
    ],
    ids=["prepares", "options-none", "pooled-alias"],
)
def test_the_async_store_sends_the_statement_only_where_its_connection_prepares(
    pg_alias, monkeypatch, changes, expected
):
    log_with_snapshot(DjangoEventStore(pg_alias), "run-snapcall-async", 10, 6)
    chosen: list[str] = []

    def recorded(vendor, *, prepares=True):
        chosen.append(sql := read_from_snapshot_sql(vendor, prepares=prepares))
        return sql

    monkeypatch.setattr(postgres, "read_from_snapshot_sql", recorded)
    store = PgEventStore(pg_alias)
    store.pg = conns_with(pg_alias, **changes)

    async def main():
        try:
            return await store.read_from_snapshot("run-snapcall-async", "test.tally", 1)
        finally:
            await store.pg.close()

    snapshot, events = run(main())
    assert chosen == [expected]
    assert (snapshot.seq, [e.seq for e in events]) == (6, list(range(6, 11)))
    assert (snapshot, events) == database.DjangoEventStore(pg_alias).read_from_snapshot_sync(
        "run-snapcall-async", "test.tally", 1
    )
