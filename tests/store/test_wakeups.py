"""Wake-ups of waiting event streams on PostgreSQL (LISTEN/NOTIFY).

The store notifies an append's stream and each erased stream after the commit (and not
at all when the caller's transaction rolls back), from a thread that sends what came
in meanwhile in one statement and ends when idle; one listening connection per process
wakes the subscriptions of that stream, sync and async; a lost connection wakes
everyone (they poll meanwhile) and comes back.
"""

from __future__ import annotations

import asyncio
import time

import psycopg
import pytest
from django.db import connections, transaction

from aaa_django.events import Event, new_id
from aaa_django.store import DjangoEventStore, wakeups
from aaa_django.store.groupcommit import GroupCommit
from aaa_django.store.postgres import PgEventStore

from ..api.conftest import wait_until

pytestmark = pytest.mark.django_db(transaction=True, databases=["postgres"])


def events(stream: str, n: int = 1) -> list[Event]:
    return [Event(id=new_id(), stream=stream, type="t.ping", data={"i": i}) for i in range(n)]


@pytest.fixture
def listener(pg_alias):
    hub = wakeups.Listener(pg_alias)
    yield hub
    hub.stop()


def test_an_append_wakes_the_streams_of_its_run_and_no_other(listener, pg_alias):
    mine, other = listener.subscribe("run-a"), listener.subscribe("run-b")
    assert listener.listening(10) and listener.reliable()
    for sub in (mine, other):  # the wake-up of everyone when listening began
        sub.clear()
    DjangoEventStore(pg_alias).append_sync(events("run-a"))
    assert mine.wait(10)
    assert not other.wait(0)


def test_appends_and_erasures_notify_their_streams_after_the_commit(pg_alias):
    params = connections[pg_alias].get_connection_params()
    store = DjangoEventStore(pg_alias)
    with psycopg.Connection.connect(**params, autocommit=True) as conn:
        conn.execute(f"LISTEN {wakeups.CHANNEL}")

        def heard(expect: frozenset[str] = frozenset()) -> list[str]:
            """What is heard until every stream of ``expect`` has been (10 s: a bound
            for a loaded machine; the notifier's thread may be slow to run), then
            within 0.5 s more: what should not come has that long to show."""
            got: list[str] = []
            deadline = time.monotonic() + 10
            while not expect <= set(got) and time.monotonic() < deadline:
                got += [n.payload for n in conn.notifies(timeout=deadline - time.monotonic(), stop_after=1)]
            return got + [n.payload for n in conn.notifies(timeout=0.5)]

        store.append_sync(events("run-batch", 50))
        store.append_sync(events("run-batch", 3))
        batch = heard(frozenset({"run-batch"}))
        assert set(batch) == {"run-batch"} and len(batch) <= 2  # per append, or both in one: never per event
        with transaction.atomic(using=pg_alias):
            store.append_sync(events("run-kept", 2))
            assert heard() == []  # not before the commit
        assert heard(frozenset({"run-kept"})) == ["run-kept"]
        with pytest.raises(RuntimeError), transaction.atomic(using=pg_alias):
            store.append_sync(events("run-rolled-back", 1))
            raise RuntimeError("the caller's transaction rolls back")
        assert heard() == []
        ended = [wakeups.ENDED + "run-batch", wakeups.ENDED + "run-kept"]
        store.erase_many_sync(["run-batch", "run-kept"])  # they end: their waits are woken too
        assert sorted(heard(frozenset({"run-batch", "run-kept", *ended}))) == sorted(["run-batch", "run-kept", *ended])
        # an append whose events end the run: the plain id (event streams, and a listener
        # of the previous version) and the marked one (Engine.wait)
        store.append_sync(
            [*events("run-ends"), Event(id=new_id(), stream="run-ends", type="aaa.run.completed", data={})]
        )
        assert sorted(heard(frozenset({"run-ends", wakeups.ENDED + "run-ends"}))) == [
            wakeups.ENDED + "run-ends",
            "run-ends",
        ]
    # then the notifier's thread ends, and its connection with it
    assert wakeups._notifier(pg_alias).idle(10)


def test_the_async_stores_appends_notify_alone_and_in_a_group_commit(pg_alias):
    """What the site's engines append on PostgreSQL goes through ``PgEventStore``'s
    awaits, alone or in a group commit: each wakes its run's streams too."""
    store = PgEventStore(pg_alias)
    store.group = GroupCommit(store, lanes=1)  # appends started together: one group
    params = connections[pg_alias].get_connection_params()
    with psycopg.Connection.connect(**params, autocommit=True) as conn:
        conn.execute(f"LISTEN {wakeups.CHANNEL}")

        def heard(expected: set[str]) -> set[str]:
            got: set[str] = set()
            for note in conn.notifies(timeout=10):  # (a bound for a loaded machine)
                got.add(note.payload)
                if got >= expected:
                    break
            return got

        async def appends(streams: list[str]) -> None:
            await asyncio.gather(*(store.append(events(s)) for s in streams))

        asyncio.run(appends(["run-alone"]))
        assert heard({"run-alone"}) == {"run-alone"}
        grouped = [f"run-group-{i}" for i in range(4)]
        asyncio.run(appends(grouped))
        assert (store.group.groups, store.group.grouped) == (1, 4)
        assert heard(set(grouped)) == set(grouped)


def test_the_site_engines_wait_wakes_on_another_processs_end_of_the_run(pg_alias):
    """``build_engine``'s waits share the process's hub with its event streams: on
    PostgreSQL an end another process appends wakes ``run.result()`` by its NOTIFY,
    not at the wait's next poll (an hour away here)."""
    from aaa_django.runtime import Engine, InProcessBus
    from aaa_django.runtime.wakeups import Hub
    from aaa_django.site.engines import build_engine
    from tests.runtime.algos import Boom

    reads = []

    async def main():
        # elsewhere: an engine that tells no one here (a hub of its own), as another process
        async with (
            build_engine(using=pg_alias, bus=InProcessBus(), poll_interval=3600) as waiter,
            Engine(store=PgEventStore(pg_alias), bus=InProcessBus(), wakeups=Hub()) as elsewhere,
        ):
            assert waiter.wakeups is wakeups.for_database(pg_alias)
            waiter.wakeups.subscribe("warm-up").close()
            assert await asyncio.to_thread(waiter.wakeups.listening, 10)
            outcome = waiter.outcome

            async def watched(run_id):
                found = await outcome(run_id)
                reads.append(found)
                if len(reads) == 1:  # not ended yet: it ends elsewhere
                    run = await elsewhere.start(Boom(), {}, run_id=run_id)
                    await run.result(timeout=30)
                return found

            waiter.outcome = watched
            return await waiter.wait(f"run-{new_id()}", timeout=60)

    outcome = asyncio.run(main())
    assert outcome.outcome == "failed" and reads[0] is None and reads[-1] == outcome


@pytest.mark.parametrize("appends", [3, 12])
def test_a_waits_reads_do_not_grow_with_its_runs_appends(pg_alias, appends):
    """``Engine.wait`` subscribes ``ends_only``: another process's appends to
    the run wake the run's event streams (each one, on the same listener) and not the
    wait, which reads the run when it begins and when the run ends: as many reads for
    3 appends as for 12 (woken by every append, it would read once per append: 28 reads
    a run in bench_concurrency)."""
    from aaa_django.runtime import InProcessBus
    from aaa_django.runtime.event_types import RUN_COMPLETED, RUN_STARTED, completion_id, started_id
    from aaa_django.site.engines import build_engine

    run_id = f"run-{new_id()}"
    elsewhere = PgEventStore(pg_alias)  # another process: it tells no hub of this one
    reads: list[object] = []
    streamed: list[bool] = []

    async def main():
        async with build_engine(using=pg_alias, bus=InProcessBus(), poll_interval=3600) as waiter:
            hub = waiter.wakeups
            stream = hub.subscribe(run_id)  # an event stream of the run, in this process
            assert await asyncio.to_thread(hub.listening, 10)
            outcome = waiter.outcome

            async def watched(rid):
                found = await outcome(rid)
                reads.append(found)
                return found

            waiter.outcome = watched
            waiting = asyncio.ensure_future(waiter.wait(run_id, timeout=60))
            await elsewhere.append([Event(id=started_id(run_id), stream=run_id, type=RUN_STARTED, data={})])
            for batch in [events(run_id) for _ in range(appends)]:
                stream.clear()
                await elsewhere.append(batch)
                # heard: the listener has woken whom this append wakes (it woke the
                # wait too, before; the wait then read the run)
                streamed.append(await asyncio.to_thread(stream.wait, 10))
                await asyncio.sleep(0)
            stream.clear()
            await elsewhere.append(
                [Event(id=completion_id(run_id), stream=run_id, type=RUN_COMPLETED, data={"outcome": "success"})]
            )
            found = await waiting
            streamed.append(await asyncio.to_thread(stream.wait, 10))
            stream.close()
            return found

    found = asyncio.run(main())
    assert found.outcome == "success" and reads[-1] == found
    assert streamed == [True] * (appends + 1)  # every append woke the event stream
    # the first read, the end's; one more at most: the listener wakes everyone when
    # it (re)connects, and a wake-up may come between a read and the next clear()
    assert len(reads) <= 3, reads


def append_closing(alias: str, batch) -> None:
    """An append from a thread of the loop's executor, whose connection is closed after
    it (else it outlives the test: the test database is "being accessed by other users"
    when it is dropped)."""
    try:
        DjangoEventStore(alias).append_sync(batch)
    finally:
        connections[alias].close()


def test_an_async_subscription_wakes_on_its_loop(listener, pg_alias):
    async def go() -> bool:
        sub = listener.subscribe("run-async", asyncio.get_running_loop())
        await asyncio.to_thread(listener.listening, 10)
        sub.clear()
        await asyncio.to_thread(append_closing, pg_alias, events("run-async"))
        woken = await sub.until(10)
        sub.close()
        return woken

    assert asyncio.run(go())


def test_a_lost_listening_connection_wakes_everyone_and_comes_back(listener, pg_alias):
    sub = listener.subscribe("run-c")
    assert listener.listening(10)
    sub.clear()
    with connections[pg_alias].cursor() as cur:
        cur.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE query = %s AND datname = current_database()",
            [f"LISTEN {wakeups.CHANNEL}"],
        )
        assert cur.fetchone() == (True,)
    assert sub.wait(10)  # woken: read now (and poll until the listener is back)
    wait_until(listener.reliable, 20)
    sub.clear()
    DjangoEventStore(pg_alias).append_sync(events("run-c"))
    assert sub.wait(10)


def test_each_database_gets_one_kind_of_wakeups(pg_alias):
    assert isinstance(wakeups.for_database(pg_alias), wakeups.Listener)
    assert wakeups.for_database(pg_alias) is wakeups.for_database(pg_alias)
    sqlite = wakeups.for_database("default")  # woken only by what this process learns
    assert not isinstance(sqlite, wakeups.Listener) and not sqlite.reliable()
