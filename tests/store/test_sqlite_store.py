"""The SQLite store's own connection and thread (``aaa_django.store.sqlite``): the site's
store on SQLite, its appends waiting for the thread committed together (one
transaction, a savepoint each), an append refused in a group failing alone.

(The EventStore contract runs on it too: tests/store/test_eventstore_django.py.)"""

from __future__ import annotations

import asyncio
import threading

import pytest

from aaa_django.events import ClosedStreamError, ConcurrencyError, StoreUnavailable
from aaa_django.runtime.event_types import RUN_COMPLETED, RUN_STARTED
from aaa_django.store.postgres import site_store
from aaa_django.store.sqlite import SqliteEventStore
from aaa_django.testing.eventstore import ev, run

# transaction=True: the store's connection is its own, and sees committed rows only
pytestmark = pytest.mark.django_db(databases=["default"], transaction=True)


def test_the_site_store_on_sqlite_is_the_sqlite_store():
    store = site_store("default")
    assert isinstance(store, SqliteEventStore) and store.db is not None and store.own_thread


def held(store: SqliteEventStore):
    """The store's thread kept busy until the returned event is set: the appends
    made meanwhile wait for it, together."""
    release = threading.Event()
    assert store.db is not None
    store.db.executor().submit(release.wait, 30)
    return release


def appends_while_the_thread_is_busy(store: SqliteEventStore, batches: list[tuple[list, int | None]]):
    """Each of ``batches`` appended by a task of its own while the thread is busy,
    then the thread let go; each task's result or exception, in order."""

    async def main():
        release = held(store)
        tasks = [asyncio.ensure_future(store.append(events, expected_seq=expected))
                 for events, expected in batches]
        await asyncio.sleep(0.05)  # every task has queued its append
        release.set()
        return await asyncio.gather(*tasks, return_exceptions=True)

    return run(main())


def test_appends_waiting_for_the_thread_commit_as_one_group():
    store = SqliteEventStore("default")
    for i in range(5):  # each stream's first event, one at a time
        run(store.append([ev(f"s-{i}")]))
    groups = store.db.groups

    results = appends_while_the_thread_is_busy(
        store, [([ev(f"s-{i % 5}", data={"n": i})], None) for i in range(10)])

    assert store.db.groups == groups + 1  # the ten in one transaction
    assert not any(isinstance(r, BaseException) for r in results), results
    for i in range(5):  # two more on each stream, in the order they were made
        log = run(store.read(f"s-{i}"))
        assert [e.seq for e in log] == [1, 2, 3]
        assert [e.data for e in log[1:]] == [{"n": i}, {"n": i + 5}]
    assert [e.seq for r in results for e in r] == [2] * 5 + [3] * 5


def test_an_append_refused_in_a_group_fails_alone():
    store = SqliteEventStore("default")
    run(store.append([ev("s-a")]))
    run(store.append([ev("s-b")]))
    run(store.append([ev("run-x", type=RUN_STARTED, data={"algorithm": "a", "input": {}})]))
    run(store.append([ev("run-x", type=RUN_COMPLETED, data={"outcome": "success"})]))

    results = appends_while_the_thread_is_busy(store, [
        ([ev("s-a", data={"n": 1})], None),
        ([ev("s-b", data={"n": 2})], 5),  # not the head: refused
        ([ev("run-x", data={"late": True})], None),  # after the run's end: refused
        ([ev("s-b", data={"n": 3})], 1),
    ])

    assert isinstance(results[1], ConcurrencyError)
    assert isinstance(results[2], ClosedStreamError)
    assert [e.data for e in results[0]] == [{"n": 1}]
    assert [e.data for e in results[3]] == [{"n": 3}]
    assert [e.data for e in run(store.read("s-b"))] == [{}, {"n": 3}]
    assert [e.type for e in run(store.read("run-x"))] == [RUN_STARTED, RUN_COMPLETED]


@pytest.mark.parametrize("own_thread", [True, False], ids=["own-thread", "on-loop"])
def test_a_broken_connection_is_replaced_and_a_write_on_it_is_a_store_fault(own_thread):
    store = SqliteEventStore("default", own_thread=own_thread)
    run(store.append([ev("s-1")]))
    db = store.db
    opened = db.opened
    db.raw.close()  # broken under the store (as a lost file or a driver fault leaves it)

    assert [e.seq for e in run(store.read("s-1"))] == [1]  # a read: again, on a new one
    assert db.opened == opened + 1

    db.raw.close()
    with pytest.raises(StoreUnavailable):
        run(store.append([ev("s-1")]))
    assert run(store.head("s-1"))[0] == 1  # nothing written; the next call reconnects


@pytest.mark.parametrize("batches", [[10], [1] * 10, [3, 4, 3], [1, 9]])
@pytest.mark.parametrize("owner", ["exists", "missing", None])
def test_a_new_runs_row_is_made_by_the_stores_own_statements(batches, owner):
    """A run's first events on the store's own connection make its index row in the
    same transaction (``runindex.row_insert``, as on PostgreSQL), not on Django's path:
    the row equals the one the run index rebuilds from the log, its owner the user the
    run names only if that user exists."""
    from django.contrib.auth import get_user_model

    from aaa_django.store import runindex
    from tests.api.test_runindex import log_of
    from tests.store.test_runindex_statement import row

    user = get_user_model().objects.create_user(f"owner-{owner}-{len(batches)}")
    named = {"exists": str(user.pk), "missing": str(user.pk + 1000), None: None}[owner]
    store, events = SqliteEventStore("default"), log_of("run-o", named)
    elsewhere: list[int] = []
    django_path = store._append_elsewhere

    async def counted(batch, **kwargs):
        elsewhere.append(len(batch))
        return await django_path(batch, **kwargs)

    store._append_elsewhere = counted
    at = 0
    for n in batches:
        assert len(run(store.append(events[at:at + n]))) == n
        at += n
    assert elsewhere == []  # every append on the store's own connection, the start's too
    made = row("run-o", "default")
    assert made["owner"] == (user.pk if owner == "exists" else None)
    assert made["status"] == "completed" and made["last_seq"] == len(events)
    runindex.reindex("default")
    assert row("run-o", "default") == made


@pytest.mark.parametrize("batches", [[10], [1] * 10, [3, 4, 3]])
@pytest.mark.parametrize("owner", ["exists", "missing", None])
def test_the_django_stores_sync_appends_make_a_new_runs_row_by_the_same_statements(batches, owner):
    """The Django store's own append on SQLite (``append_sync`` outside a transaction)
    runs the same one-transaction statements, a run's start included: the row equals
    the one the run index rebuilds, its owner the user the run names only if that user
    exists."""
    from django.contrib.auth import get_user_model

    from aaa_django.store import DjangoEventStore, runindex
    from tests.api.test_runindex import log_of
    from tests.store.test_runindex_statement import row

    user = get_user_model().objects.create_user(f"sync-owner-{owner}-{len(batches)}")
    named = {"exists": str(user.pk), "missing": str(user.pk + 1000), None: None}[owner]
    store, events = DjangoEventStore("default"), log_of("run-s", named)
    statements: list[bool] = []
    one_transaction = store._append_sqlite_transaction

    def counted(*args, **kwargs):
        stored = one_transaction(*args, **kwargs)
        statements.append(stored is not None)
        return stored

    store._append_sqlite_transaction = counted
    at = 0
    for n in batches:
        assert len(store.append_sync(events[at:at + n])) == n
        at += n
    assert statements == [True] * len(batches)  # the start's append too
    made = row("run-s", "default")
    assert made["owner"] == (user.pk if owner == "exists" else None)
    assert made["status"] == "completed" and made["last_seq"] == len(events)
    runindex.reindex("default")
    assert row("run-s", "default") == made


def test_an_appends_update_of_the_runs_row_names_only_the_columns_it_changes():
    """SQLite rewrites the entry of every index on a column an UPDATE names, even to the
    value it had: an append that names the run row's indexed columns (status,
    algorithm, outcome, parent) when its events change none of them makes the
    commit write and sync their index pages for nothing. Each append's UPDATE names
    the columns its fold changed (and ``updated_at``, ``last_seq``, ``due_at``); the
    row still equals the one the run index rebuilds."""
    import re

    from aaa_django.runtime.event_types import INPUT_VALIDATED
    from aaa_django.store import runindex
    from tests.api.test_runindex import log_of
    from tests.store.test_runindex_statement import row

    store, events = SqliteEventStore("default"), log_of("run-u", None)
    run(store.append(events[:1]))
    statements: list[str] = []
    assert store.db is not None and store.db.raw is not None
    store.db.raw.set_trace_callback(statements.append)
    named: dict[str, set[str]] = {}
    try:
        for e in events[1:]:
            statements.clear()
            run(store.append([e]))
            (update,) = [s for s in statements if s.startswith("UPDATE aaa_run")]
            sets = update.split(" SET ", 1)[1].split(" WHERE ", 1)[0]
            named[e.type] = set(re.findall(r"(\w+) = ", sets))
    finally:
        store.db.raw.set_trace_callback(None)

    always = {"updated_at", "last_seq", "due_at"}
    assert named[INPUT_VALIDATED] == always | {"status"}
    assert named["aaa.llm.requested"] == always | {"model_calls"}
    assert named["aaa.llm.completed"] == always | {"tokens_in", "tokens_out", "cost"}
    assert named["aaa.tool.requested"] == always | {"tool_calls"}
    assert named["aaa.tool.completed"] == named["acme.note.made"] == always
    assert named[RUN_COMPLETED] == always | {"status", "outcome", "ended_at"}
    made = row("run-u", "default")
    assert made["status"] == "completed" and made["ended_at"] is not None
    assert (made["model_calls"], made["tool_calls"], made["cost"]) == (2, 1, 0.75)
    runindex.reindex("default")
    assert row("run-u", "default") == made
