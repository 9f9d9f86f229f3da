"""The sweeper's question (``unfinished``: every run started and not completed, with the
time of its newest event) asked of the run index, on SQLite and PostgreSQL: the same
answer as the log gives, and on PostgreSQL a cost that follows the unfinished runs, not
the log's length."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from django.db import connections

from aaa_django.events import Event
from aaa_django.models import RunRecord
from aaa_django.runtime import meta as meta_module
from aaa_django.runtime.meta import OPEN_STATUSES, STATUSES
from aaa_django.store import DjangoEventStore, runindex
from tests.api.test_runindex import log_of

pytestmark = pytest.mark.django_db(databases="__all__", transaction=True)


def the_logs_answer(store: DjangoEventStore) -> dict[str, float]:
    """The question asked of the log itself: each stream's events read whole."""
    out = {}
    for stream in store.streams_sync():
        events = store.read_sync(stream)
        if events[0].type == "aaa.run.started" and events[-1].type != "aaa.run.completed":
            out[stream] = events[-1].time.timestamp()
    return out


def test_unfinished_are_the_runs_started_and_not_completed_with_their_newest_events_time(db_alias):
    store = DjangoEventStore(db_alias)
    done, going, starting = log_of("run-done", None), log_of("run-going", None), log_of("run-starting", None)
    store.append_sync(done)
    store.append_sync(going[:6])
    store.append_sync(going[6:8])  # two appends: the row folded twice
    store.append_sync(starting[:1])
    store.append_sync([Event.new("not-a-run", "test.e", {})])
    found = store.unfinished_sync()
    assert set(found) == {"run-going", "run-starting"}
    assert found == the_logs_answer(store)
    assert found["run-going"] == store.read_sync("run-going")[-1].time.timestamp()


def test_a_row_behind_its_log_does_not_hide_a_completion_nor_move_the_time(db_alias):
    """A row is caught up after the commit when it moved meanwhile: until then it is
    behind. The newest event decides, not the row."""
    store = DjangoEventStore(db_alias)
    ended, going = log_of("run-ended", None), log_of("run-on", None)
    store.append_sync(ended)
    store.append_sync(going[:8])
    # Both rows as they were after the third event (status running, older time).
    RunRecord.objects.using(db_alias).filter(pk__in=["run-ended", "run-on"]).update(
        status="running", outcome=None, ended_at=None, last_seq=3
    )
    found = store.unfinished_sync()
    assert set(found) == {"run-on"}
    assert found == the_logs_answer(store)


@pytest.mark.postgres
def test_the_question_reads_the_unfinished_runs_events_not_the_log(pg_alias):
    """Counted by PostgreSQL (EXPLAIN ANALYZE: the rows each node of ``aaa_event``
    returned or filtered out): a newest event for each unfinished run, however many
    events the completed runs hold. (Asked of the log, it read them all.)"""
    store = DjangoEventStore(pg_alias)
    for i in range(40):
        store.append_sync(log_of(f"run-{i}", None))  # 10 events each, completed
    unfinished = [f"run-open-{i}" for i in range(3)]
    for run_id in unfinished:
        store.append_sync(log_of(run_id, None)[:5])
    with connections[pg_alias].cursor() as cur:
        cur.execute("ANALYZE aaa_event")
        cur.execute("ANALYZE aaa_run")
    plan = runindex.unfinished_query(pg_alias).explain(format="json", analyze=True)
    read = sum(_rows_of(node, "aaa_event") for node in _nodes(json.loads(plan)[0]["Plan"]))
    assert set(store.unfinished_sync()) == set(unfinished)
    # two subqueries (time, type), one index probe each per unfinished run
    assert read <= 2 * len(unfinished), plan


def _nodes(node: dict):
    yield node
    for child in node.get("Plans", ()):
        yield from _nodes(child)


def _rows_of(node: dict, table: str) -> int:
    if node.get("Relation Name") != table:
        return 0
    loops = node.get("Actual Loops", 1)
    return int((node.get("Actual Rows", 0) + node.get("Rows Removed by Filter", 0)) * loops)


def test_every_status_the_fold_sets_is_named_and_only_completed_ends_a_run():
    """The index asks for ``OPEN_STATUSES``: a status the fold sets that ``STATUSES``
    does not name would hide its runs from the sweeper."""
    source = Path(meta_module.__file__).read_text()
    set_by_fold = set(re.findall(r'\.status = "(\w+)"', source))
    assert set_by_fold and set_by_fold <= set(STATUSES)
    assert meta_module.RunMeta().status in STATUSES
    assert set(STATUSES) - set(OPEN_STATUSES) == {"completed"}
    assert RunRecord.STATUSES == tuple(s for s in STATUSES if s != "new")  # the rows' choices
