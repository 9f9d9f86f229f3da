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
        tasks = [asyncio.ensure_future(store.append(events, expected_seq=expected)) for events, expected in batches]
        await asyncio.sleep(0.05)  # every task has queued its append
        release.set()
        return await asyncio.gather(*tasks, return_exceptions=True)

    return run(main())


def test_appends_waiting_for_the_thread_commit_as_one_group():
    store = SqliteEventStore("default")
    for i in range(5):  # each stream's first event, one at a time
        run(store.append([ev(f"s-{i}")]))
    groups = store.db.groups

    results = appends_while_the_thread_is_busy(store, [([ev(f"s-{i % 5}", data={"n": i})], None) for i in range(10)])

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

    results = appends_while_the_thread_is_busy(
        store,
        [
            ([ev("s-a", data={"n": 1})], None),
            ([ev("s-b", data={"n": 2})], 5),  # not the head: refused
            ([ev("run-x", data={"late": True})], None),  # after the run's end: refused
            ([ev("s-b", data={"n": 3})], 1),
        ],
    )

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
        assert len(run(store.append(events[at : at + n]))) == n
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
        assert len(store.append_sync(events[at : at + n])) == n
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
            # (traced again for each step of a trigger it fires: one statement)
            (update,) = {s for s in statements if s.startswith("UPDATE aaa_run")}
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


# -- a caller with nothing else to do: the append on its own thread ----------------------


def threads_of_inserts(store: SqliteEventStore) -> tuple[list[str], object]:
    """The threads that run the store's event INSERTs, by name, in turn (its
    connection's trace callback: a thread's INSERTs in a row, and their triggers'
    statements, once), and a function that stops recording."""
    names: list[str] = []

    def trace(sql: str) -> None:
        name = threading.current_thread().name
        if sql.startswith("INSERT INTO aaa_event") and (not names or names[-1] != name):
            names.append(name)

    assert store.db is not None and store.db.raw is not None
    store.db.raw.set_trace_callback(trace)
    return names, lambda: store.db.raw.set_trace_callback(None)


def test_an_append_of_a_caller_alone_is_made_on_its_thread_and_any_other_on_the_stores():
    """With ``caller_alone`` (the engine's hint: the append is all its loop has to do)
    the one-transaction append runs on the calling thread: no hand-off to the store's
    thread and back. Without it, on the store's thread, as ever."""
    from aaa_django.events.store import caller_alone

    store = SqliteEventStore("default")
    run(store.append([ev("s-a")]))
    names, stop = threads_of_inserts(store)
    here = store.db.here

    async def alone_append(seq: int):
        token = caller_alone.set(True)
        try:
            return await store.append([ev("s-a", data={"n": seq})]), threading.current_thread().name
        finally:
            caller_alone.reset(token)

    try:
        stored, caller = run(alone_append(2))
        run(store.append([ev("s-a", data={"n": 3})]))
    finally:
        stop()
    assert stored[0].seq == 2 and store.db.here == here + 1
    assert names == [caller, "aaa-sqlite-default_0"]
    assert [e.seq for e in run(store.read("s-a"))] == [1, 2, 3]

    store = SqliteEventStore("default", here_when_alone=False)  # (alone_append's store now)
    names, stop = threads_of_inserts(store)
    try:
        stored, caller = run(alone_append(4))
    finally:
        stop()
    assert stored[0].seq == 4 and names == ["aaa-sqlite-default_0"]  # on the thread


def test_an_appends_caller_is_told_after_the_thread_is_free_again():
    """The thread ends its drain (no append left for it) before it tells the callers:
    a caller whose append is done finds the connection idle, so its next append alone
    may be made on its own thread. (CI found the other order: the caller told first,
    its next append sent to a thread that had not yet said it was free.) The drain's
    last step is slowed here to widen the window; it never changes the order."""
    store = SqliteEventStore("default")
    run(store.append([ev("s-t")]))  # opened
    db = store.db
    plain = db._pending_lock

    class Slow:  # the thread's last step of a drain, slowed
        def __enter__(self):
            if threading.current_thread().name.startswith("aaa-sqlite"):
                threading.Event().wait(0.05)
            return plain.__enter__()

        def __exit__(self, *exc):
            return plain.__exit__(*exc)

    async def main():
        db._pending_lock = Slow()
        try:
            stored = await store.append([ev("s-t", data={"n": 2})])
            return stored, db._draining
        finally:
            db._pending_lock = plain

    stored, draining = run(main())
    assert stored[0].seq == 2
    assert draining is False  # told once the thread had let go


def test_an_alone_append_never_waits_for_another_writers_lock_on_its_loop():
    """Another connection holds the database's write lock: the caller's append does not
    wait for it on the caller's thread (the busy timeout is 0 for its BEGIN); it goes
    to the store's thread, which waits (the busy timeout), while the loop goes on:
    here the loop itself releases the other writer's lock, which it could not do if
    the append held it."""
    import sqlite3

    from django.db import connections

    from aaa_django.events.store import caller_alone

    store = SqliteEventStore("default")
    run(store.append([ev("s-b")]))
    other = sqlite3.connect(connections["default"].settings_dict["NAME"], isolation_level=None, check_same_thread=False)
    other.execute("BEGIN IMMEDIATE")
    here = store.db.here
    caller: list[str] = []  # what the caller's thread ran on the connection
    thread: list[str] = []  # ... and the store's
    store.db.raw.set_trace_callback(
        lambda sql: (thread if threading.current_thread().name.startswith("aaa-sqlite") else caller).append(sql)
    )

    async def main():
        token = caller_alone.set(True)
        try:
            append = asyncio.ensure_future(store.append([ev("s-b", data={"n": 2})]))
        finally:
            caller_alone.reset(token)
        for _ in range(5):
            await asyncio.sleep(0)  # the append is under way, on the thread
        other.execute("ROLLBACK")  # the loop is free: it lets the other writer go
        return await append

    try:
        stored = run(main())
    finally:
        store.db.raw.set_trace_callback(None)
        other.close()
    assert stored[0].seq == 2 and store.db.here == here  # made on the store's thread
    # the caller only tried the lock, without waiting; the thread set the alias's
    # timeout back before its own BEGIN, and waited with it
    assert caller == ["PRAGMA busy_timeout = 0", "BEGIN IMMEDIATE"]
    assert thread[:2] == [f"PRAGMA busy_timeout = {store.db.busy_ms}", "BEGIN IMMEDIATE"]
    busy = store.db.raw.execute("PRAGMA busy_timeout").fetchone()[0]
    assert busy == store.db.busy_ms > 0  # the connection's own timeout


def test_a_lone_runs_appends_set_the_busy_timeout_once_and_any_other_call_sets_it_back():
    """Appends of a caller alone, one after another, take the write lock with a busy
    timeout of 0, set once and left so between them (two PRAGMAs an append were a
    tenth of its cost); the next call of any other kind (here a read, then an append
    on the store's thread) has the alias's timeout back first."""
    from aaa_django.events.store import caller_alone

    store = SqliteEventStore("default")
    run(store.append([ev("s-p")]))  # opened, on the thread
    sent: list[tuple[bool, str]] = []  # (on the store's thread?, statement)
    store.db.raw.set_trace_callback(
        lambda sql: sent.append((threading.current_thread().name.startswith("aaa-sqlite"), sql))
    )

    async def alone(n: int):
        token = caller_alone.set(True)
        try:
            for i in range(n):
                await store.append([ev("s-p", data={"n": i})])
        finally:
            caller_alone.reset(token)

    busy = f"PRAGMA busy_timeout = {store.db.busy_ms}"
    try:
        here = store.db.here
        run(alone(3))
        assert store.db.here == here + 3  # all three on the caller's thread
        pragmas = [sql for _, sql in sent if sql.startswith("PRAGMA")]
        assert pragmas == ["PRAGMA busy_timeout = 0"]
        sent.clear()
        assert len(run(store.read("s-p"))) == 4
        assert [sql for _, sql in sent if sql.startswith("PRAGMA")] == [busy]
        sent.clear()
        run(store.append([ev("s-p", data={"n": 9})]))  # not alone: on the thread
        assert [sql for _, sql in sent if sql.startswith("PRAGMA")] == []  # it is set already
        assert all(on_thread for on_thread, _ in sent)
    finally:
        store.db.raw.set_trace_callback(None)
    assert store.db.raw.execute("PRAGMA busy_timeout").fetchone()[0] == store.db.busy_ms > 0


def test_a_lone_runs_appends_are_made_on_the_engines_loop():
    """One ToolLoop run on the site's store: every append made in a delivery (all but
    the start's) is the only work its engine has going, and is made on the loop's
    thread; the log and the run's row are what they always are."""
    from aaa_django.algos import ToolLoop
    from aaa_django.events import FoldCache
    from aaa_django.llm import FakeLLMClient, LLMHandler
    from aaa_django.llm.fake import text, tool_call
    from aaa_django.models import RunRecord
    from aaa_django.runtime import Engine
    from aaa_django.tools import ToolHandler, ToolRegistry, tool

    @tool(name="noop", inline=True)
    def noop(i: int = 0) -> int:
        """Does nothing."""
        return i

    registry = ToolRegistry([noop])

    async def model(request):
        done = sum(1 for m in request.messages if m.role == "tool")
        return text("done") if done >= 3 else tool_call("noop", i=done)

    store = SqliteEventStore("default")
    run(store.append([ev("warm-up")]))  # (the connection open)
    names, stop = threads_of_inserts(store)

    async def main():
        async with Engine(store=store, cache=FoldCache()) as engine:
            LLMHandler(FakeLLMClient(model)).attach(engine)
            ToolHandler(registry).attach(engine)
            started = await engine.start(ToolLoop(registry, max_turns=5), {"task": "x"})
            return started.run_id, await started.result(), threading.current_thread().name

    try:
        run_id, outcome, loop_thread = run(main())
    finally:
        stop()
    assert outcome.outcome == "success"
    # the start (not in a delivery) on the store's thread, then every other on the loop's
    assert names == ["aaa-sqlite-default_0", loop_thread]
    log = run(store.read(run_id))
    assert [e.seq for e in log] == list(range(1, len(log) + 1))
    assert RunRecord.objects.get(pk=run_id).tool_calls == 3
