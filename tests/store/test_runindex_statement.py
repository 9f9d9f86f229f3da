"""The run index kept by appends made outside any transaction on PostgreSQL (a Celery
worker's): one statement inserts the events and folds them into the run's row, and
the row equals a whole-log rebuild, whatever the batches."""

from __future__ import annotations

import pytest
from django.db import connections
from django.forms.models import model_to_dict

from aaa_django.events import Event
from aaa_django.models import RunRecord
from aaa_django.runtime import RUNMETA
from aaa_django.store import DjangoEventStore, runindex
from tests.api.test_runindex import log_of as api_log_of

pytestmark = [pytest.mark.django_db(databases=["postgres"], transaction=True), pytest.mark.postgres]


def log_of(run_id: str) -> list[Event]:
    """The run index tests' log (no owner): a run with spend, and its completion."""
    return api_log_of(run_id, None)


def row(run_id: str, using: str = "postgres") -> dict:
    record = RunRecord.objects.using(using).get(pk=run_id)
    return {**model_to_dict(record), "started_at": record.started_at, "updated_at": record.updated_at}


def assert_row_is_the_log_folded(store: DjangoEventStore, run_id: str, using: str = "postgres") -> None:
    """The row kept append by append (for ``log_of``) equals the whole-log fold of
    RUNMETA, and the row ``aaa_reindex`` rebuilds."""
    incremental = row(run_id, using)
    meta = RUNMETA.fold(store.read_sync(run_id))
    assert incremental["status"] == meta.status == "completed"
    assert incremental["outcome"] == "success" and incremental["ended_at"] is not None
    assert (incremental["tokens_in"], incremental["tokens_out"]) == (14, 6)
    assert incremental["cost"] == meta.spend.cost == 0.75
    assert (incremental["model_calls"], incremental["tool_calls"]) == (2, 1)
    assert incremental["last_seq"] == 10 and incremental["parent"] == "run-parent"
    runindex.reindex(using)
    assert row(run_id, using) == incremental


def kind(sql: str) -> str:
    """A statement of the store's, as the tests tell them apart: "CALL" for the call of
    the append function (migration 0009), else its first word."""
    return "CALL" if sql.startswith("SELECT aaa_append_event(") else sql.split()[0]


@pytest.mark.parametrize("prepares", [False, True], ids=["unprepared", "prepared"])
@pytest.mark.parametrize("batches", [[10], [1] * 10, [3, 4, 3], [1, 9], [8, 2]])
def test_appends_outside_a_transaction_keep_the_index(pg_alias, batches, prepares, monkeypatch):
    """The store remembers the head and the run's row its last append left: each
    later batch is one statement (the events and the row's update), no query. An
    append of events stored already is refused by that statement (the unique ids),
    then one query finds them stored: absorbed. On a connection that prepares
    nothing (Django's, by default), a batch of one event is the append function's
    call; else the statement (``prepares``: as the connection would say)."""
    from aaa_django.store import appends

    monkeypatch.setattr(appends, "prepares", lambda raw: prepares)
    store, events = DjangoEventStore(pg_alias), log_of("run-a")
    conn = connections[pg_alias]
    calls: list[list[str]] = []

    def record(execute, sql, params, many, context):
        calls[-1].append(kind(sql))
        return execute(sql, params, many, context)

    assert conn.get_autocommit()
    i = 0
    with conn.execute_wrapper(record):
        for n in batches:
            calls.append([])
            assert len(store.append_sync(events[i : i + n])) == n
            calls.append([])
            assert store.append_sync(events[i : i + n]) == []  # again: absorbed, the row unchanged
            i += n
    assert calls[0] == ["WITH"]  # a new run: its events and its row in one statement
    new, again = calls[2::2], calls[3::2]  # after the batch that made the row
    one = [("WITH" if prepares or n > 1 else "CALL") for n in batches[1:]]
    assert new == [[k] for k in one]
    assert again == [[k, "SELECT"] for k in one]
    assert_row_is_the_log_folded(store, "run-a", pg_alias)


def test_a_row_behind_its_log_is_caught_up(pg_alias):
    store, events = DjangoEventStore(pg_alias), log_of("run-b")
    store.append_sync(events[:4])
    RunRecord.objects.using(pg_alias).filter(pk="run-b").update(last_seq=2, tokens_in=0)  # behind
    store.append_sync(events[4:6])
    assert row("run-b")["last_seq"] == 6 and row("run-b")["tokens_in"] == 7


@pytest.mark.parametrize("owner", ["exists", "missing", "not-a-pk", None])
def test_a_new_runs_row_is_made_by_its_first_statement(pg_alias, owner):
    """A run's first append (no query: a start is most likely new) inserts its events
    and its row at once; the row's owner is the user the run names only if that user
    exists, as a whole-log rebuild has it."""
    from django.contrib.auth import get_user_model

    user = get_user_model().objects.db_manager(pg_alias).create_user("owner-" + str(owner))
    named = {"exists": str(user.pk), "missing": str(user.pk + 1000), "not-a-pk": "x", None: None}[owner]
    store, events = DjangoEventStore(pg_alias), api_log_of("run-o", named)
    conn = connections[pg_alias]
    calls: list[str] = []

    def record(execute, sql, params, many, context):
        calls.append(sql.split()[0])
        return execute(sql, params, many, context)

    with conn.execute_wrapper(record):
        assert len(store.append_sync(events[:3])) == 3
        assert len(store.append_sync(events[3:])) == len(events) - 3
    assert calls == ["WITH", "WITH"]
    made = row("run-o", pg_alias)
    assert made["owner"] == (user.pk if owner == "exists" else None)
    assert made["started_at"] == events[0].time and made["last_seq"] == len(events)
    runindex.reindex(pg_alias)
    assert row("run-o", pg_alias) == made


def test_a_start_that_is_not_new_falls_back_to_asking(pg_alias):
    """The one-statement start is a guess: a start stored already is absorbed, and a
    start after other events of its stream lands after them (one refused statement,
    then the head is asked for)."""
    store, events = DjangoEventStore(pg_alias), log_of("run-n")
    conn = connections[pg_alias]
    calls: list[str] = []

    def record(execute, sql, params, many, context):
        calls.append(sql.split()[0])
        return execute(sql, params, many, context)

    store.append_sync(events[:2])
    with conn.execute_wrapper(record):
        assert DjangoEventStore(pg_alias).append_sync([events[0]]) == []  # another process: absorbed
    assert calls[0] == "WITH" and "SELECT" in calls
    assert [e.id for e in store.read_sync("run-n")] == [e.id for e in events[:2]]

    other = DjangoEventStore(pg_alias)
    other.append_sync([Event.new("stream-x", "tests.plain", {})])
    late = Event(id="late-start", stream="stream-x", type=events[0].type, data=events[0].data)
    stored = DjangoEventStore(pg_alias).append_sync([late])
    assert [e.seq for e in stored] == [2]
    assert not RunRecord.objects.using(pg_alias).filter(pk="stream-x").exists()  # not a run's start


@pytest.mark.parametrize("prepares", [False, True], ids=["unprepared", "prepared"])
def test_a_column_the_fold_leaves_keeps_what_the_row_holds(pg_alias, prepares, monkeypatch):
    """An append writes the run row's columns its fold changed, and keeps the others
    as the row holds them, though its view of the row is older (here ``algorithm``
    and ``parent``, moved without ``last_seq``): the statement names only those
    columns, the function's call masks the others out."""
    from aaa_django.store import appends

    monkeypatch.setattr(appends, "prepares", lambda raw: prepares)
    store, events = DjangoEventStore(pg_alias), log_of("run-m")
    store.append_sync(events[:3])
    RunRecord.objects.using(pg_alias).filter(pk="run-m").update(algorithm="edited", parent="moved")
    calls: list[str] = []

    def record(execute, sql, params, many, context):
        calls.append(kind(sql))
        return execute(sql, params, many, context)

    with connections[pg_alias].execute_wrapper(record):
        for event in events[3:]:
            store.append_sync([event])  # one at a time, each from the store's hint
    assert calls == ["WITH" if prepares else "CALL"] * (len(events) - 3)
    kept = row("run-m", pg_alias)
    assert (kept["algorithm"], kept["parent"]) == ("edited", "moved")
    assert kept["last_seq"] == len(events) and kept["outcome"] == "success"
    assert kept["ended_at"] == events[-1].time


def test_the_functions_mask_is_the_folds_columns_in_order():
    """Bit i of the append function's mask writes the fold's i-th compared column, and
    the bit after them ``ended_at`` (the call's parameters are in that order)."""
    from importlib import import_module

    sql = import_module("aaa_django.migrations.0009_append_event_function").PG_APPEND_EVENT
    columns = [c for c, _ in runindex._COMPARED]
    assert columns == [
        "algorithm",
        "status",
        "outcome",
        "parent",
        "tokens_in",
        "tokens_out",
        "cost",
        "model_calls",
        "tool_calls",
    ]
    for i, column in enumerate([*columns, "ended_at"]):
        assert f"{column} = CASE WHEN p_set & {1 << i} <> 0 THEN p_{column} ELSE {column} END" in sql
    assert runindex._ENDS == 1 << len(columns)
    params = sql[sql.index("(") + 1 : sql.index(") RETURNS")]
    names = [p.split()[0] for p in params.replace("\n", " ").split(",")]
    assert names[11:20] == [f"p_{c}" for c in columns]
    assert names[20:] == ["p_updated_at", "p_due_at", "p_ended_at"]
    assert runindex.APPEND_EVENT.count("%s") == len(names)


def test_racing_appenders_of_one_run_keep_its_row_the_log_folded(pg_alias):
    """Six appenders (a store and a connection each, as six workers) append one event
    at a time to one run's stream at once, on connections that prepare nothing: the
    append function's calls refused (the head moved since the hint) ask and land
    after; a row moved under a call is caught up. The log is dense, nothing lost, and
    the run's row is the whole log's fold."""
    from aaa_django.runtime.event_types import LLM_COMPLETED, RUN_STARTED
    from aaa_django.store import appends
    from aaa_django.testing.eventstore import Concurrently

    assert not appends.prepares(connections[pg_alias].connection)  # the call's path
    run_id, writers, each = "run-race", 6, 15
    DjangoEventStore(pg_alias).append_sync(
        [Event.new(run_id, RUN_STARTED, {"algorithm": "tests.api.echo", "input": {}, "owner": None, "parent": None})]
    )

    def writer(w: int):
        def body() -> None:
            mine = DjangoEventStore(pg_alias)
            try:
                for i in range(each):
                    data = (
                        {"usage": {"input_tokens": 1, "output_tokens": 2}, "cost": 0.5}
                        if i % 3 == 0
                        else {"w": w, "i": i}
                    )
                    event = Event.new(run_id, LLM_COMPLETED if i % 3 == 0 else "tests.step", data)
                    assert [e.id for e in mine.append_sync([event])] == [event.id]
            finally:
                connections[pg_alias].close()  # (this thread's)

        return body

    Concurrently(lambda: None)(*(writer(w) for w in range(writers)))
    events = DjangoEventStore(pg_alias).read_sync(run_id)
    assert [e.seq for e in events] == list(range(1, 1 + 1 + writers * each))
    kept = row(run_id, pg_alias)
    spend = RUNMETA.fold(events).spend
    calls = writers * len(range(0, each, 3))
    assert (spend.tokens_in, spend.tokens_out, spend.cost) == (calls, 2 * calls, 0.5 * calls)
    assert (kept["tokens_in"], kept["tokens_out"], kept["cost"]) == (calls, 2 * calls, 0.5 * calls)
    assert (kept["model_calls"], kept["tool_calls"]) == (spend.model_calls, spend.tool_calls)
    assert kept["last_seq"] == len(events) and kept["updated_at"] == events[-1].time
    runindex.reindex(pg_alias)
    assert row(run_id, pg_alias) == kept
