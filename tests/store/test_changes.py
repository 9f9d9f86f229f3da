"""The order of the runs' changes (``aaa_run.changed``, :mod:`aaa_django.store.changes`), on
SQLite and PostgreSQL: a run's position moves when a watcher would see it change (its start,
status, outcome, spend, end) and only then; a read after a position finds what changed
later, in order; on PostgreSQL a change committed behind one still in flight waits for it,
so a reader never passes a change that is still to come."""

from __future__ import annotations

import time

import pytest
from django.db import connections

from aaa_django.events import Event, derive_id
from aaa_django.models import RunRecord
from aaa_django.runtime.event_types import (
    INPUT_VALIDATED,
    LLM_COMPLETED,
    LLM_REQUESTED,
    RUN_COMPLETED,
    RUN_STARTED,
    TOOL_COMPLETED,
    TOOL_REQUESTED,
    completion_id,
    started_id,
)
from aaa_django.store import DjangoEventStore, changes, runindex

pytestmark = pytest.mark.django_db(databases="__all__", transaction=True)

#: what a watcher of runs sees of a row
WATCHED = ("status", "outcome", "tokens_in", "tokens_out", "cost", "model_calls", "tool_calls", "ended_at")


def settled(rows, position, limit) -> changes.Changed:
    """``changes.after`` once nothing is held back by a transaction of another test: on
    PostgreSQL the horizon is the snapshot's ``xmin``, which the server takes over all
    its databases, so a test in another database (another xdist worker's) that holds a
    transaction open holds back the rows changed after it began, until it ends."""
    give_up = time.monotonic() + 30
    while (found := changes.after(rows, position, limit)).held and time.monotonic() < give_up:
        time.sleep(0.05)
    return found


def started(run_id: str) -> Event:
    return Event(
        id=started_id(run_id),
        stream=run_id,
        type=RUN_STARTED,
        data={"algorithm": "tests.api.echo", "input": {}, "owner": None},
    )


def later(run_id: str) -> list[Event]:
    """The rest of a run's log: some events change what a watcher sees, some do not."""

    def ev(type, key, **data):
        return Event(id=derive_id(started_id(run_id), type, key), stream=run_id, type=type, data=data)

    return [
        ev(INPUT_VALIDATED, 0),
        ev("acme.note.made", 1, text="an algorithm's own record"),
        ev(LLM_REQUESTED, 2),
        ev(LLM_COMPLETED, 2, usage={"input_tokens": 7, "output_tokens": 3}, cost=0.25),
        ev("acme.note.made", 3, text="another"),
        ev(TOOL_REQUESTED, 4, call_id="c", name="t", args={}),
        ev(TOOL_COMPLETED, 4, content="ok"),
        Event(id=completion_id(run_id), stream=run_id, type=RUN_COMPLETED, data={"outcome": "success", "value": 1}),
    ]


def seen(using: str, run_id: str) -> tuple:
    row = RunRecord.objects.using(using).get(pk=run_id)
    return tuple(getattr(row, f) for f in WATCHED), row.changed


def test_a_runs_position_moves_when_a_watcher_would_see_it_change_and_only_then(db_alias):
    store = DjangoEventStore(db_alias)
    store.append_sync([started("run-a")])
    fields, position = seen(db_alias, "run-a")
    assert position > 0  # a new run is a change
    moves = []
    for event in later("run-a"):
        store.append_sync([event])
        now_fields, now_position = seen(db_alias, "run-a")
        assert (now_position != position) == (now_fields != fields), event.type
        assert now_position >= position  # never back
        moves.append(now_position != position)
        fields, position = now_fields, now_position
    assert moves[0] and moves[-1]  # running; ended
    assert moves[1] is False and moves[4] is False  # an algorithm's own record: no change


def test_a_read_after_a_position_finds_what_changed_later_in_order(db_alias):
    store = DjangoEventStore(db_alias)
    rows = RunRecord.objects.using(db_alias)
    for run_id in ("run-a", "run-b", "run-c"):
        store.append_sync([started(run_id)])
    first = settled(rows, None, 10)
    assert [r.run_id for r in first.rows] == ["run-a", "run-b", "run-c"] and not first.held
    cut = changes.position(first.rows[-1])
    assert changes.after(rows, cut, 10).rows == []

    store.append_sync([later("run-b")[0]])  # b runs, then a, then b ends
    store.append_sync([later("run-a")[0]])
    store.append_sync(later("run-b")[1:])
    found = settled(rows, cut, 10)
    assert [(r.run_id, r.status) for r in found.rows] == [("run-a", "running"), ("run-b", "completed")]
    positions = [changes.position(r) for r in found.rows]
    assert positions == sorted(positions) and all(p > cut for p in positions)
    # in pages: the same rows, in the same order
    page = settled(rows, cut, 1)
    assert [r.run_id for r in page.rows] == ["run-a"]
    assert [r.run_id for r in settled(rows, changes.position(page.rows[0]), 1).rows] == ["run-b"]


def test_a_position_is_never_given_twice_even_after_the_last_changed_run_is_erased(db_alias):
    store = DjangoEventStore(db_alias)
    rows = RunRecord.objects.using(db_alias)
    store.append_sync([started("run-a")])
    store.append_sync([started("run-b")])
    last = changes.position(rows.get(pk="run-b"))
    store.erase_sync("run-b")
    runindex.forget(db_alias, "run-b")
    store.append_sync([later("run-a")[0]])
    assert changes.position(rows.get(pk="run-a")) > last


def test_positions_as_the_stream_writes_them():
    assert changes.parse(changes.text((12, "run-a.b:c"))) == (12, "run-a.b:c")
    for bad in ("", "12", ".run", "x.run", "-1.run", "1" * 19 + ".run", "１２.run"):
        with pytest.raises(ValueError):
            changes.parse(bad)


def test_a_change_committed_behind_one_in_flight_waits_for_it(pg_alias):
    """Transaction 1 changes run a and stays open; transaction 2, later, changes run b and
    commits. b waits (held) until a's transaction ends: then both come, a first. A reader
    that had sent b would never have seen a (a's position is below b's)."""
    import psycopg

    store = DjangoEventStore(pg_alias)
    rows = RunRecord.objects.using(pg_alias)
    store.append_sync([started("run-a")])
    store.append_sync([started("run-b")])
    cut = changes.position(settled(rows, None, 10).rows[-1])
    params = connections[pg_alias].get_connection_params()
    with psycopg.connect(**params) as one, psycopg.connect(**params, autocommit=True) as two:
        one.execute("UPDATE aaa_run SET status = 'running' WHERE run_id = 'run-a'")
        two.execute("UPDATE aaa_run SET status = 'running' WHERE run_id = 'run-b'")
        waiting = changes.after(rows, cut, 10)
        assert waiting.rows == [] and waiting.held  # b is committed, and waits for a
        one.commit()
    both = settled(rows, cut, 10)
    assert [(r.run_id, r.status) for r in both.rows] == [("run-a", "running"), ("run-b", "running")]
    assert not both.held
