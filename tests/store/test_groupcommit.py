"""Group commit (``aaa_django.store.groupcommit``): appends of several runs that arrive
together share one transaction; each run's order and invariants are the ones an
append alone has, and one append's refusal fails no other.

One lane (``lanes=1``) makes the grouping deterministic: appends started together on
one loop are all queued before the lane's first transaction starts.
"""

from __future__ import annotations

import asyncio

import pytest

from aaa_django.events import ClosedStreamError, ConcurrencyError, Event
from aaa_django.events.store import caller_alone
from aaa_django.models import RunRecord
from aaa_django.runtime.event_types import RUN_COMPLETED, RUN_STARTED, TOOL_COMPLETED
from aaa_django.store.groupcommit import GroupCommit
from aaa_django.store.postgres import PgEventStore
from aaa_django.testing.eventstore import ev, raw, run

pytestmark = pytest.mark.django_db(databases=["postgres"], transaction=True)


@pytest.fixture
def store(pg_alias):
    store = PgEventStore(pg_alias)
    store.group = GroupCommit(store, lanes=1)
    return store


def started(run_id: str) -> Event:
    return Event.new(run_id, RUN_STARTED, {"algorithm": "tests.Algo", "input": {}})


def together(*appends):
    async def main():
        return await asyncio.gather(*appends, return_exceptions=True)

    return run(main())


def test_appends_of_several_runs_started_together_share_one_transaction(store):
    results = together(*(store.append([started(f"run-{i}"), ev(f"run-{i}")]) for i in range(5)))

    assert (store.group.groups, store.group.grouped) == (1, 5)
    for i, stored in enumerate(results):
        assert [(e.stream, e.seq) for e in stored] == [(f"run-{i}", 1), (f"run-{i}", 2)]
        assert stored.committed
        assert run(store.read(f"run-{i}")) == stored
    # the run index is kept in the same transaction, as by an append alone
    rows = RunRecord.objects.using(store.using).filter(run_id__startswith="run-")
    assert sorted((r.run_id, r.last_seq) for r in rows) == [(f"run-{i}", 2) for i in range(5)]


def test_an_append_whose_caller_is_alone_holds_no_turn_of_the_loop(store):
    # A caller that says its loop has nothing else to do (``caller_alone``: the engine,
    # for a run alone) gets its statement sent before anything else the loop has ready
    # runs; any other caller, and one alone while another append is on its way, holds
    # a turn for company (the appends started with it then go together).
    order: list[str] = []
    statement = store._append_statement

    async def recorded(stream, *args):
        order.append(stream)
        return await statement(stream, *args)

    store._append_statement = recorded

    async def append(stream: str, *, alone: bool):
        token = caller_alone.set(alone)
        try:
            asyncio.get_running_loop().call_soon(order.append, f"the loop's next turn ({stream})")
            return await store.append([started(stream)])
        finally:
            caller_alone.reset(token)

    run(append("run-alone", alone=True))
    run(append("run-not-alone", alone=False))
    assert order == [
        "run-alone",
        "the loop's next turn (run-alone)",
        "the loop's next turn (run-not-alone)",
        "run-not-alone",
    ]

    async def alone_behind_another():
        first = asyncio.ensure_future(append("run-first", alone=True))
        await asyncio.sleep(0)  # (on its way)
        return await asyncio.gather(first, append("run-second", alone=True), append("run-third", alone=False))

    order.clear()
    results = run(alone_behind_another())
    assert [[e.seq for e in stored] for stored in results] == [[1], [1], [1]]
    assert order[0] == "run-first" and "run-second" not in order and "run-third" not in order
    assert (store.group.groups, store.group.grouped) == (1, 2)  # the two behind it, together


def test_a_refused_append_fails_only_itself(store):
    for i in range(3):
        run(store.append([started(f"run-{i}")]))
    run(store.append([ev("run-1", "a.first")]))
    again = run(store.read("run-1", after=1))  # stored already: absorbed, not stored twice

    results = together(
        store.append([ev("run-0", "a.b")]),
        store.append([ev("run-1", "a.b")], expected_seq=5),  # the head is 2
        store.append(again),
        store.append([raw(stream="run-2", type="a.b", seq=7)]),  # claims a seq that is not next
        store.append([ev("run-2", "c.d")]),
    )

    # two groups (one append per stream in each); the refused appends sent nothing
    assert (store.group.groups, store.group.grouped) == (2, 5)
    assert [e.seq for e in results[0]] == [2]
    assert isinstance(results[1], ConcurrencyError)
    assert results[2] == []
    assert isinstance(results[3], ConcurrencyError)
    assert [(e.type, e.seq) for e in results[4]] == [("c.d", 2)]
    assert [e.type for e in run(store.read("run-1"))] == [RUN_STARTED, "a.first"]
    assert [e.type for e in run(store.read("run-2"))] == [RUN_STARTED, "c.d"]


def test_a_streams_appends_in_one_group_keep_their_order(store):
    run(store.append([started("run-a")]))
    first, second, other = ev("run-a", "a.first"), ev("run-a", "a.second"), ev("run-b", "a.other")

    results = together(store.append([first]), store.append([other]), store.append([second]))

    # one append per stream in a group: the second of run-a goes in the next one
    assert (store.group.groups, store.group.grouped) == (1, 2), results
    assert [e.seq for e in results[0]] == [2] and [e.seq for e in results[2]] == [3]
    assert [e.type for e in run(store.read("run-a"))] == [RUN_STARTED, "a.first", "a.second"]
    assert RunRecord.objects.using(store.using).get(run_id="run-a").last_seq == 3


def test_a_lost_race_in_a_group_makes_each_append_again_alone(store, pg_alias):
    for stream in ("run-a", "run-b"):
        run(store.append([started(stream)]))
    # Another process appends to run-a: this store's hint of its head is stale.
    run(PgEventStore(pg_alias).append([ev("run-a", "a.elsewhere")]))

    results = together(store.append([ev("run-a", "a.here")]), store.append([ev("run-b", "b.here")]))

    # The database refused run-a's statement: the group was rolled back whole, and
    # each append made again alone.
    assert (store.group.groups, store.group.grouped) == (0, 0)
    assert [(e.type, e.seq) for e in results[0]] == [("a.here", 3)]
    assert [(e.type, e.seq) for e in results[1]] == [("b.here", 2)]
    assert [e.type for e in run(store.read("run-a"))] == [RUN_STARTED, "a.elsewhere", "a.here"]
    assert RunRecord.objects.using(pg_alias).get(run_id="run-b").last_seq == 2


def test_an_append_to_a_closed_run_in_a_group_fails_only_itself(store):
    run(store.append([started("run-ended"), ev("run-ended", RUN_COMPLETED)]))
    run(store.append([started("run-going")]))

    results = together(
        store.append([ev("run-ended", TOOL_COMPLETED)]),  # a late result of an ended run
        store.append([ev("run-going", "a.b")]),
        store.append([ev("run-erased", TOOL_COMPLETED)]),  # no start: an orphan stream
    )

    # The triggers refused it in the group's transaction: rolled back whole, each
    # append made again alone, and the refusals are final (no retry, nothing written).
    assert store.group.rolled_back == 1
    assert isinstance(results[0], ClosedStreamError) and "completed" in str(results[0])
    assert [(e.type, e.seq) for e in results[1]] == [("a.b", 2)]
    assert isinstance(results[2], ClosedStreamError) and RUN_STARTED in str(results[2])
    assert [e.type for e in run(store.read("run-ended"))] == [RUN_STARTED, RUN_COMPLETED]
    assert run(store.read("run-erased")) == []


@pytest.mark.parametrize("ends", ["refused", "absorbed"])
def test_an_append_that_ends_after_its_query_leaves_the_groups_other_appends_committed(store, pg_alias, ends):
    # run-a's append starts from this store's hint (its insert goes in the first round
    # trip); run-b's has none and asks first, then ends with that answer: refused by
    # its own check, or absorbed (its event stored already). No append of the group
    # had a statement after that round, so the COMMIT was never sent: the transaction
    # was rolled back and run-a's event reported stored (a result lost for good).
    for stream in ("run-a", "run-b"):
        run(store.append([started(stream)]))
    again = run(store.append([ev("run-b", "b.first")]))
    store._forget("run-b")  # (a hint not kept, or forgotten after another process's append)
    late = store.append([ev("run-b", "b.late")], expected_seq=5) if ends == "refused" else store.append(again)

    results = together(store.append([ev("run-a", "a.here")]), late)

    assert (store.group.groups, store.group.grouped) == (1, 2)
    assert [(e.type, e.seq) for e in results[0]] == [("a.here", 2)]
    if ends == "refused":
        assert isinstance(results[1], ConcurrencyError)
    else:
        assert results[1] == []
    # committed: another store (its own connections) reads it, and the run's row has it
    assert [e.type for e in run(PgEventStore(pg_alias).read("run-a"))] == [RUN_STARTED, "a.here"]
    assert RunRecord.objects.using(pg_alias).get(run_id="run-a").last_seq == 2
    assert [e.type for e in run(PgEventStore(pg_alias).read("run-b"))] == [RUN_STARTED, "b.first"]


def test_groups_refused_in_the_pipeline_leave_the_connections_prepared_statements_usable(pg_alias):
    # The store's connections prepare what they repeat (aaa_django.store.connections):
    # groups whose pipeline the database refuses, between groups that commit, on one
    # connection that prepares, leave it usable (an out-of-step connection answers
    # "prepared statement _pg3_N does not exist" on its next use).
    from aaa_django.store.connections import PREPARE_THRESHOLD, PgConnections

    store = PgEventStore(pg_alias)
    store.pg = PgConnections(pg_alias)
    store.group = GroupCommit(store, lanes=1)
    other = PgEventStore(pg_alias)
    streams = [f"run-prep-{i}" for i in range(3)]
    for stream in streams:
        run(store.append([started(stream)]))
    failures = []
    for turn in range(3 * PREPARE_THRESHOLD):
        if turn % 3 == 2:  # another process appends: this store's hint is stale, its statement refused
            run(other.append([ev(streams[turn % len(streams)], "x.elsewhere")]))
        results = together(*(store.append([ev(stream, "x.here")]) for stream in streams))
        failures += [r for r in results if isinstance(r, BaseException)]
        run(store.read(streams[0]))  # a read on the same connection (raises if it is out of step)
    assert failures == []
    assert store.group.rolled_back >= PREPARE_THRESHOLD  # the refusals happened
    assert store.group.groups >= PREPARE_THRESHOLD  # and groups committed between them
    for stream in streams:
        seqs = [e.seq for e in run(store.read(stream))]
        assert seqs == list(range(1, len(seqs) + 1))
    run(store.pg.close())


def test_a_connection_whose_group_was_refused_in_its_pipeline_is_not_used_again(pg_alias):
    # psycopg counts a statement prepared once it has queued its Parse and checks the
    # Parse's result only for a statement new to it: a Parse the server skipped behind
    # the pipeline's refused statement leaves the connection believing in a statement
    # that was never made. Seen in the field (runs cancelled in bursts, their appends
    # refused): "prepared statement _pg3_N does not exist" on the connection's later
    # groups, and on their appends made again alone, failed deliveries in the worker's
    # log. Here: groups refused twice in a row, then one that commits, on a connection
    # that prepares at psycopg's default threshold: only the refused groups roll back
    # (before: 27 of 36, three of the groups that should commit failing on a statement
    # the connection lacked, on the one connection, reused), each refused group's
    # connection is dropped, and transaction control is never prepared.
    from aaa_django.store.connections import PgConnections

    store = PgEventStore(pg_alias)
    conns = store.pg = PgConnections(pg_alias)
    store.group = GroupCommit(store, lanes=1)
    other = PgEventStore(pg_alias)
    for stream in ("run-a", "run-b"):
        run(store.append([started(stream)]))
    failures = []
    for _ in range(12):
        for refused in (True, True, False):
            if refused:
                run(other.append([ev("run-a", "a.elsewhere")]))  # this store's hint for run-a is stale
            results = together(store.append([ev("run-a", "a.here")]), store.append([ev("run-b", "b.here")]))
            failures += [r for r in results if isinstance(r, BaseException)]

    async def prepared() -> list[str]:
        async with conns.connection() as conn, conn.cursor() as cur:
            await cur.execute("SELECT statement FROM pg_prepared_statements")
            return [row[0] for row in await cur.fetchall()]

    statements = run(prepared())
    assert failures == []
    assert (store.group.rolled_back, store.group.groups) == (24, 12)
    assert conns.opened == 1 + 24  # each refused group's connection dropped, no other
    assert not [s for s in statements if s.split()[0] in ("BEGIN", "COMMIT", "ROLLBACK")], statements
    assert [e.seq for e in run(store.read("run-b"))] == list(range(1, 2 + 36))
    run(conns.close())
