"""The run index kept by appends made outside any transaction on PostgreSQL (a Celery
worker's): one statement inserts the events and folds them into the run's row, and
the row equals a whole-log rebuild, whatever the batches."""

from __future__ import annotations

import pytest
from django.db import connections
from django.forms.models import model_to_dict

from aaa_django import runindex
from aaa_django.events import Event
from aaa_django.models import RunRecord
from aaa_django.runtime import RUNMETA
from aaa_django.store import DjangoEventStore
from tests.api.test_runindex import log_of as api_log_of

pytestmark = [pytest.mark.django_db(databases=["postgres"], transaction=True), pytest.mark.postgres]


def log_of(run_id: str) -> list[Event]:
    """The run index tests' log (no owner): a run with spend, a completion, and late
    results after it."""
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


@pytest.mark.parametrize("batches", [[10], [1] * 10, [3, 4, 3], [1, 9], [8, 2]])
def test_appends_outside_a_transaction_keep_the_index(pg_alias, batches):
    """The store remembers the head and the run's row its last append left: each
    later batch is one statement (the events and the row's update), no query. An
    append of events stored already is refused by that statement (the unique ids),
    then one query finds them stored: absorbed."""
    store, events = DjangoEventStore(pg_alias), log_of("run-a")
    conn = connections[pg_alias]
    calls: list[list[str]] = []

    def record(execute, sql, params, many, context):
        calls[-1].append(sql.split()[0])
        return execute(sql, params, many, context)

    assert conn.get_autocommit()
    i = 0
    with conn.execute_wrapper(record):
        for n in batches:
            calls.append([])
            assert len(store.append_sync(events[i:i + n])) == n
            calls.append([])
            assert store.append_sync(events[i:i + n]) == []  # again: absorbed, the row unchanged
            i += n
    new, again = calls[2::2], calls[3::2]  # after the batch that made the row
    assert new == [["WITH"]] * (len(batches) - 1)
    assert again == [["WITH", "SELECT"]] * (len(batches) - 1)
    assert_row_is_the_log_folded(store, "run-a", pg_alias)


def test_a_row_behind_its_log_is_caught_up(pg_alias):
    store, events = DjangoEventStore(pg_alias), log_of("run-b")
    store.append_sync(events[:4])
    RunRecord.objects.using(pg_alias).filter(pk="run-b").update(last_seq=2, tokens_in=0)  # behind
    store.append_sync(events[4:6])
    assert row("run-b")["last_seq"] == 6 and row("run-b")["tokens_in"] == 7
