"""An append costs the same number of queries at event 10 and at event 1,000, on a run
stream (indexed) and on any other stream: nothing in the append path reads the log."""

from __future__ import annotations

import pytest
from django.db import connections
from django.test.utils import CaptureQueriesContext

from aaa_django.events import Event
from aaa_django.runtime.event_types import RUN_STARTED
from aaa_django.store import DjangoEventStore

pytestmark = pytest.mark.django_db(databases="__all__")


def _queries_of_one_append(alias: str, store: DjangoEventStore, stream: str, type: str, i: int) -> int:
    with CaptureQueriesContext(connections[alias]) as ctx:
        store.append_sync([Event.new(stream, type, {"i": i})])
    return len(ctx.captured_queries)


@pytest.mark.parametrize("kind", ["run", "plain"])
def test_append_queries_do_not_grow_with_the_stream(db_alias, kind):
    store = DjangoEventStore(db_alias)
    stream = f"{kind}-long"
    # a run's stream starts with its start; a plain stream holds types of its own
    type = "aaa.llm.requested" if kind == "run" else "acme.note.made"
    if kind == "run":
        store.append_sync([Event.new(stream, RUN_STARTED, {"algorithm": "x", "input": {}})])
    store.append_sync([Event.new(stream, type, {"i": i}) for i in range(9)])
    early = _queries_of_one_append(db_alias, store, stream, type, 10)
    for start in range(10, 1000, 200):
        store.append_sync([Event.new(stream, type, {"i": i}) for i in range(start, start + 200)])
    late = _queries_of_one_append(db_alias, store, stream, type, 1001)
    assert late == early
    assert early <= 8  # savepoint/transaction, head + known ids, insert, the run index


def test_a_projection_read_from_its_snapshot_is_one_query(db_alias):
    """The snapshot and the events after it in one round trip: a state
    loaded from a snapshot 50 events behind the head asks the database once."""
    from asgiref.sync import async_to_sync

    from aaa_django.events import Projection, Snapshot

    # (the store's sync calls in Django's thread-sensitive executor: this thread, under async_to_sync)
    store = DjangoEventStore(db_alias)
    counter = Projection(
        lambda: {"n": 0}, lambda s, e: {"n": s["n"] + 1}, name="test.count", state_type=dict, every=1_000
    )
    events = store.append_sync([Event.new("counted", "acme.note.made", {"i": i}) for i in range(80)])
    base = events[29]
    store.save_snapshot_sync(Snapshot("counted", "test.count", 1, base.seq, base.id, '{"n":30}'))

    with CaptureQueriesContext(connections[db_alias]) as ctx:
        info = async_to_sync(counter.load_info)(store, "counted")

    assert (info.state, info.source, info.folded) == ({"n": 80}, "snapshot", 50)
    assert len(ctx.captured_queries) == 1


def test_a_snapshot_read_reads_only_the_events_from_its_seq(db_alias):
    """The snapshot read's one query reaches the events through the stream's index from
    the snapshot's seq: PostgreSQL planned the plain join as a scan of the whole stream
    (filtered on seq after reading it), with statistics or without."""
    from aaa_django.events import Snapshot
    from aaa_django.store.database import read_from_snapshot_sql

    store = DjangoEventStore(db_alias)
    events = store.append_sync([Event.new("long", "acme.note.made", {"i": i}) for i in range(300)])
    store.save_snapshot_sync(Snapshot("long", "test.count", 1, 251, events[250].id, "{}"))
    sql, args = read_from_snapshot_sql(connections[db_alias].vendor), ["long", "test.count", 1]

    with connections[db_alias].cursor() as cur:
        if db_alias == "postgres":
            for analyze in (False, True):  # the planner's choice, without and with statistics
                if analyze:
                    cur.execute("ANALYZE aaa_event")
                cur.execute(f"EXPLAIN (ANALYZE, FORMAT JSON) {sql}", args)
                scanned = [
                    node["Actual Rows"]
                    for node in _plan_nodes(cur.fetchone()[0][0]["Plan"])
                    if node.get("Relation Name") == "aaa_event"
                ]
                assert scanned == [50], scanned  # the events from seq 251 on, nothing before
        else:
            cur.execute(f"EXPLAIN QUERY PLAN {sql}", args)
            plan = " | ".join(row[-1] for row in cur.fetchall())
            assert "SEARCH e USING INDEX" in plan and "seq>?" in plan, plan
        cur.execute(sql, args)
        assert len(cur.fetchall()) == 50


def _plan_nodes(node: dict):
    yield node
    for child in node.get("Plans", ()):
        yield from _plan_nodes(child)
