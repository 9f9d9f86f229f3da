"""The log's invariants hold in the database itself: raw SQL that bypasses the ORM and
the store is refused. Run on SQLite and PostgreSQL."""

from __future__ import annotations

import pytest
from django.db import DatabaseError, connections, transaction

from aaa_django.events import Event, Snapshot
from aaa_django.store import DjangoEventStore

pytestmark = pytest.mark.django_db(databases="__all__")

INSERT = (
    "INSERT INTO aaa_event (id, stream, seq, type, data, causation, time, blobs, tenant) "
    "VALUES (%s, %s, %s, 'test.raw', '{}', NULL, '2026-01-01 00:00:00+00:00', '[]', NULL)"
)


def _refused(alias: str, sql: str, params=()) -> None:
    with pytest.raises(DatabaseError):
        with transaction.atomic(using=alias), connections[alias].cursor() as cur:
            cur.execute(sql, params)


@pytest.fixture
def stored(db_alias):
    store = DjangoEventStore(db_alias)
    store.append_sync([Event.new("s", "test.one", {"n": 1}, id="e1")])
    store.append_sync([Event.new("s", "test.two", {"n": 2}, id="e2")])
    return db_alias


def _count(alias: str, where: str = "", params=()) -> int:
    with connections[alias].cursor() as cur:
        cur.execute("SELECT COUNT(*) FROM aaa_event " + where, params)
        return cur.fetchone()[0]


def test_unique_stream_seq(stored):
    _refused(stored, INSERT, ["other-id", "s", 2])
    assert _count(stored, "WHERE stream = %s", ["s"]) == 2


def test_unique_event_id(stored):
    _refused(stored, INSERT, ["e1", "s", 3])
    _refused(stored, INSERT, ["e1", "another-stream", 1])
    assert _count(stored) == 2


def test_seq_is_dense(stored):
    _refused(stored, INSERT, ["e9", "s", 9])
    _refused(stored, INSERT, ["n1", "new-stream", 2])
    with transaction.atomic(using=stored), connections[stored].cursor() as cur:
        cur.execute(INSERT, ["e3", "s", 3])  # the next seq is accepted
    assert _count(stored, "WHERE stream = %s", ["s"]) == 3


def test_events_are_never_updated(stored):
    _refused(stored, "UPDATE aaa_event SET type = 'test.forged' WHERE id = 'e1'")
    _refused(stored, "UPDATE aaa_event SET seq = 5 WHERE id = 'e2'")
    events = DjangoEventStore(stored).read_sync("s")
    assert [(e.id, e.seq, e.type) for e in events] == [
        ("e1", 1, "test.one"),
        ("e2", 2, "test.two"),
    ]


def test_erase_may_delete(stored):
    assert DjangoEventStore(stored).erase_sync("s") == 2
    assert _count(stored) == 0


def test_snapshot_seq_never_goes_backwards(stored):
    store = DjangoEventStore(stored)
    assert store.save_snapshot_sync(Snapshot("s", "p", 1, 2, "e2", '{"n": 2}'))
    _refused(stored, "UPDATE aaa_snapshot SET seq = 1 WHERE stream = 's'")
    assert not store.save_snapshot_sync(Snapshot("s", "p", 1, 1, "e1", '{"n": 1}'))
    snap = store.load_snapshot_sync("s", "p", 1)
    assert (snap.seq, snap.state) == (2, '{"n": 2}')


def test_stream_reads_use_indexes(pg_alias):
    """On PostgreSQL, a stream's tail, its head and its latest snapshot are index scans
    even with many streams in the table."""
    store = DjangoEventStore(pg_alias)
    for s in range(200):
        store.append_sync([Event.new(f"s{s}", "test.e", {"i": i}) for i in range(20)])
    with connections[pg_alias].cursor() as cur:
        cur.execute("ANALYZE aaa_event")
        cur.execute("ANALYZE aaa_snapshot")
        plans = {}
        for label, sql in {
            "tail": "SELECT * FROM aaa_event WHERE stream = 's7' AND seq > 10 ORDER BY seq",
            "head": "SELECT seq, id FROM aaa_event WHERE stream = 's7' ORDER BY seq DESC LIMIT 1",
            "snapshot": "SELECT seq, event_id, state FROM aaa_snapshot "
            "WHERE stream = 's7' AND name = 'p' AND version = 1",
        }.items():
            cur.execute("SET enable_seqscan = off" if label == "snapshot" else "SET enable_seqscan = on")
            cur.execute("EXPLAIN " + sql)
            plans[label] = "\n".join(r[0] for r in cur.fetchall())
        cur.execute("SET enable_seqscan = on")
    assert "aaa_event_stream_seq" in plans["tail"], plans["tail"]
    assert "aaa_event_stream_seq" in plans["head"], plans["head"]
    assert "aaa_snapshot_stream_name_version" in plans["snapshot"], plans["snapshot"]
    assert "Seq Scan" not in plans["tail"] + plans["head"]


# SQLite's INSERT OR REPLACE / REPLACE INTO delete the conflicting row without firing
# DELETE or UPDATE triggers: BEFORE INSERT triggers keep the rules for them too.
REPLACE = [
    "INSERT OR REPLACE INTO aaa_event (id, stream, seq, type, data, causation, time, blobs, tenant) "
    "VALUES (%s, %s, %s, 'test.forged', '{\"n\": 99}', NULL, '2026-01-01 00:00:00', '[]', NULL)",
    "REPLACE INTO aaa_event (id, stream, seq, type, data, causation, time, blobs, tenant) "
    "VALUES (%s, %s, %s, 'test.forged', '{\"n\": 99}', NULL, '2026-01-01 00:00:00', '[]', NULL)",
]


@pytest.fixture
def sqlite_stored():
    store = DjangoEventStore("default")
    store.append_sync([Event.new("s", "test.one", {"n": 1}, id="e1")])
    store.append_sync([Event.new("s", "test.two", {"n": 2}, id="e2")])
    return store


@pytest.mark.parametrize("sql", REPLACE, ids=["insert-or-replace", "replace-into"])
def test_sqlite_replace_cannot_move_an_event(sqlite_stored, sql):
    _refused("default", sql, ["e1", "s", 3])  # e1 from seq 1 to the next seq, new data
    _refused("default", sql, ["other", "s", 1])  # another event at seq 1
    assert [(e.id, e.seq, e.data) for e in sqlite_stored.read_sync("s")] == [
        ("e1", 1, {"n": 1}),
        ("e2", 2, {"n": 2}),
    ]


@pytest.mark.parametrize("verb", ["INSERT OR REPLACE", "REPLACE"])
def test_sqlite_replace_cannot_move_a_snapshot_back(sqlite_stored, verb):
    store = sqlite_stored
    assert store.save_snapshot_sync(Snapshot("s", "p", 1, 2, "e2", '{"n": 2}'))
    _refused(
        "default",
        f"{verb} INTO aaa_snapshot (stream, name, version, seq, event_id, state, saved_at) "
        "VALUES ('s', 'p', 1, 1, 'e1', '{\"n\": 1}', '2026-01-01 00:00:00')",
    )
    snap = store.load_snapshot_sync("s", "p", 1)
    assert (snap.seq, snap.state) == (2, '{"n": 2}')
    # Forward is allowed, as an UPDATE is; an older save is still refused quietly.
    assert store.save_snapshot_sync(Snapshot("s", "p", 1, 2, "e2", '{"n": 2}')) is False
    assert store.save_snapshot_sync(Snapshot("s", "p", 1, 1, "e1", '{"n": 1}')) is False


TYPED = (
    "INSERT INTO aaa_event (id, stream, seq, type, data, causation, time, blobs, tenant) "
    "VALUES (%s, %s, %s, %s, '{}', NULL, '2026-01-01 00:00:00+00:00', '[]', NULL)"
)


def test_nothing_follows_a_run_completion_even_in_raw_sql(db_alias):
    DjangoEventStore(db_alias).append_sync(
        [Event.new("r", "aaa.run.started", {}, id="r1"), Event.new("r", "aaa.run.completed", {}, id="r2")]
    )
    _refused(db_alias, TYPED, ["r3", "r", 3, "aaa.tool.completed"])
    _refused(db_alias, TYPED, ["r3", "r", 3, "acme.late.note"])
    assert _count(db_alias, "WHERE stream = %s", ["r"]) == 2


def test_a_run_stream_starts_with_its_start_even_in_raw_sql(db_alias):
    _refused(db_alias, TYPED, ["o1", "orphan", 1, "aaa.tool.completed"])
    assert _count(db_alias, "WHERE stream = %s", ["orphan"]) == 0
    with transaction.atomic(using=db_alias), connections[db_alias].cursor() as cur:
        cur.execute(TYPED, ["o1", "other", 1, "acme.thing.happened"])  # not a run's stream
        cur.execute(TYPED, ["o2", "run", 1, "aaa.run.started"])
    assert _count(db_alias) == 2
