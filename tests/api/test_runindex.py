"""The run index is a fold of the log: incremental indexing equals a whole-log rebuild."""

from __future__ import annotations

from io import StringIO

import pytest
from django.core.management import call_command
from django.forms.models import model_to_dict

from aaa_django.events import Event, derive_id
from aaa_django.models import RunRecord
from aaa_django.runtime import RUNMETA
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
from aaa_django.store import DjangoEventStore, runindex

pytestmark = pytest.mark.django_db

STORE = DjangoEventStore("default")


def log_of(run_id: str, owner: str | None) -> list[Event]:
    started = Event(
        id=started_id(run_id),
        stream=run_id,
        type=RUN_STARTED,
        data={"algorithm": "tests.api.echo", "input": {}, "owner": owner, "parent": "run-parent"},
    )

    def ev(type, key, **data):
        return Event(id=derive_id(started.id, type, key), stream=run_id, type=type, data=data)

    usage = {"input_tokens": 7, "output_tokens": 3}
    return [
        started,
        ev(INPUT_VALIDATED, 0),
        ev(LLM_REQUESTED, 1),
        ev(LLM_COMPLETED, 1, usage=usage, cost=0.25),
        ev(TOOL_REQUESTED, 2, call_id="c", name="t", args={}),
        ev(TOOL_COMPLETED, 2, content="ok"),
        ev(LLM_REQUESTED, 3),
        ev(LLM_COMPLETED, 3, usage=usage, cost=0.5),
        ev("acme.note.made", 4, text="an algorithm's own record"),
        Event(
            id=completion_id(run_id), stream=run_id, type=RUN_COMPLETED, data={"outcome": "success", "value": 1}
        ),  # last: nothing follows a completion
    ]


def row(run_id: str) -> dict:
    d = model_to_dict(RunRecord.objects.get(pk=run_id))
    d["started_at"] = RunRecord.objects.get(pk=run_id).started_at
    d["updated_at"] = RunRecord.objects.get(pk=run_id).updated_at
    return d


@pytest.mark.parametrize("batches", [[10], [1] * 10, [3, 4, 3], [1, 9], [8, 2]])
def test_incremental_index_equals_the_whole_log_fold(alice, batches):
    events = log_of("run-a", str(alice.pk))
    i = 0
    for n in batches:
        runindex.index_events("default", STORE.append_sync(events[i : i + n]))
        i += n
    incremental = row("run-a")
    meta = RUNMETA.fold(STORE.read_sync("run-a"))
    assert incremental["status"] == meta.status == "completed"
    assert incremental["outcome"] == "success"
    assert (incremental["tokens_in"], incremental["tokens_out"]) == (14, 6)
    assert incremental["cost"] == meta.spend.cost == 0.75
    assert (incremental["model_calls"], incremental["tool_calls"]) == (2, 1)
    assert incremental["owner"] == alice.pk and incremental["parent"] == "run-parent"
    assert incremental["last_seq"] == 10
    runindex.reindex("default")
    assert row("run-a") == incremental


def test_indexing_twice_counts_once_and_a_gap_is_read_from_the_log(alice):
    events = log_of("run-b", str(alice.pk))
    first = STORE.append_sync(events[:4])
    runindex.index_events("default", first)
    runindex.index_events("default", first)  # redelivered: absorbed
    assert row("run-b")["tokens_in"] == 7
    STORE.append_sync(events[4:8])  # appended by a process without the index
    runindex.index_events("default", STORE.append_sync(events[8:]))
    assert row("run-b")["last_seq"] == 10
    assert row("run-b")["tokens_in"] == 14 and row("run-b")["tool_calls"] == 1


def test_refresh_creates_and_catches_up_a_row(alice):
    STORE.append_sync(log_of("run-c", str(alice.pk))[:3])
    assert runindex.refresh("default", "run-c").status == "running"
    assert runindex.refresh("default", "run-nope") is None
    STORE.append_sync([Event(id="not-a-run", stream="odd", type="acme.thing.happened")])
    assert runindex.refresh("default", "odd") is None


def test_an_unknown_owner_indexes_as_no_owner(db):
    runindex.index_events("default", STORE.append_sync(log_of("run-d", "no-such-user")[:2]))
    assert RunRecord.objects.get(pk="run-d").owner is None


def test_reindex_command_rebuilds_and_drops_erased_runs(alice):
    runindex.index_events("default", STORE.append_sync(log_of("run-e", str(alice.pk))))
    RunRecord.objects.filter(pk="run-e").update(tokens_in=999, request_hash="h")
    RunRecord.objects.create(
        run_id="run-gone",
        status="completed",
        started_at=row("run-e")["started_at"],
        updated_at=row("run-e")["updated_at"],
    )
    out = StringIO()
    call_command("aaa_reindex", stdout=out)
    assert "Indexed 1 runs" in out.getvalue() and "deleted 1" in out.getvalue()
    assert row("run-e")["tokens_in"] == 14
    assert row("run-e")["request_hash"] == "h"  # not in the log: kept
    assert not RunRecord.objects.filter(pk="run-gone").exists()


def test_reindex_of_named_runs_says_which_are_not_in_the_log(alice):
    runindex.index_events("default", STORE.append_sync(log_of("run-f", str(alice.pk))))
    STORE.append_sync([Event(id="odd-1", stream="odd-f", type="acme.thing.happened")])
    RunRecord.objects.create(
        run_id="run-erased",
        status="completed",
        started_at=row("run-f")["started_at"],
        updated_at=row("run-f")["updated_at"],
    )
    out = StringIO()
    call_command(
        "aaa_reindex", "--run", "run-f", "--run", "odd-f", "--run", "run-erased", "--run", "run-never", stdout=out
    )
    said = out.getvalue()
    assert "Indexed 1 runs; skipped 1 streams that are not runs; deleted 1 rows" in said
    assert "Not in the log: 2 of the runs named" in said
    assert not RunRecord.objects.filter(pk="run-erased").exists()
    assert runindex.reindex("default", ["run-f"]) == {"indexed": 1, "skipped": 0, "missing": 0, "deleted": 0}


@pytest.mark.django_db(databases="__all__", transaction=True)
def test_the_store_indexes_runs_in_the_append_transaction(db_alias, django_user_model):
    owner = django_user_model.objects.db_manager(db_alias).create_user("erin")
    store = DjangoEventStore(db_alias)
    events = log_of("run-f", str(owner.pk))
    store.append_sync(events[:2])
    rows = RunRecord.objects.using(db_alias)
    assert rows.get(pk="run-f").status == "running"
    assert rows.get(pk="run-f").owner_id == owner.pk
    for e in events[2:]:
        store.append_sync([e])
    incremental = model_to_dict(rows.get(pk="run-f"))
    assert incremental["cost"] == 0.75 and incremental["status"] == "completed"
    runindex.reindex(db_alias)
    assert model_to_dict(rows.get(pk="run-f")) == incremental


def test_a_log_the_index_cannot_fold_never_fails_the_append(db):
    store = DjangoEventStore("default")
    odd = Event(id="odd-start", stream="run-odd", type=RUN_STARTED, data={"budget": "lots"})
    assert store.append_sync([odd])[0].seq == 1
    assert not RunRecord.objects.filter(pk="run-odd").exists()
