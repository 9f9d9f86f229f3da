"""The engine's tail (aaa_django.events.tail) is an EventStore: outside a delivery
every read catches up, so it passes the contract over the memory store. Inside a
delivery it serves synced streams from memory until the bus marks them stale."""

from __future__ import annotations

import asyncio
from dataclasses import replace

import pytest

from aaa_django.events import ConcurrencyError, InMemoryEventStore
from aaa_django.events.tail import TailCachedStore
from aaa_django.testing.eventstore import EventStoreContract, ev, run
from tests.runtime.helpers import ReadCountingStore


class TestTailCachedStore(EventStoreContract):
    def make_store(self, request):
        return TailCachedStore(InMemoryEventStore())

    def same_log(self, store):
        return TailCachedStore(store.inner)  # another process's cache on the same log


def test_in_a_delivery_reads_of_a_synced_stream_make_no_query():
    inner = ReadCountingStore()
    run(inner.append([ev(), ev()]))
    store = TailCachedStore(inner)

    async def delivery():
        with store.delivery():
            first = await store.read("run-1")
            await inner.append([ev()])  # another worker writes meanwhile
            again = await store.read("run-1", after=1)
            mine = await store.append([ev()])  # read-your-writes: the log is extended...
            assert mine[0].seq == 4
            store.stale("run-1")  # ...but the lock was taken: catch up
            caught_up = await store.read("run-1")
            return first, again, caught_up

    reads_before = inner.reads
    first, again, caught_up = run(delivery())

    assert len(first) == 2 and len(again) == 1  # served from memory, missing the other write
    assert [e.seq for e in caught_up] == [1, 2, 3, 4]
    assert inner.reads - reads_before == 2  # the first sync and the catch-up


def test_an_erased_and_rewritten_stream_is_read_again():
    inner = InMemoryEventStore()
    store = TailCachedStore(inner)
    run(store.append([ev(data={"v": "old"}), ev()]))
    run(store.read("run-1"))
    run(inner.erase("run-1"))
    run(inner.append([ev(data={"v": "new"})]))

    assert [e.data for e in run(store.read("run-1"))] == [{"v": "new"}]


def test_a_carried_event_is_taken_only_when_it_follows_the_cached_tail():
    inner = ReadCountingStore()
    store = TailCachedStore(inner)
    first, second = run(inner.append([ev(), ev()]))
    third, fourth = run(inner.append([ev(), ev()]))

    async def delivery(event, prev):
        with store.delivery():
            taken = store.accept(event, prev)
            reads = inner.reads
            view = await store.read("run-1")
            return taken, inner.reads - reads, view

    assert store.accept(first, None) is True  # nothing cached yet: seq 1 starts the log
    taken, reads, view = run(delivery(second, first.id))
    assert (taken, reads, [e.seq for e in view]) == (True, 0, [1, 2])
    # another predecessor than the cached one, or a gap: read instead
    assert run(delivery(third, "someone-else"))[:2] == (False, 1)
    store._logs["run-1"] = store._logs["run-1"][:2]
    assert run(delivery(fourth, third.id))[:2] == (False, 1)
    # an event the cache holds already (this process appended it): current as it is
    taken, reads, view = run(delivery(third, second.id))
    assert (taken, reads, len(view)) == (True, 0, 4)
    assert store.accept(replace(third, id="another-id"), second.id) is False


def test_a_young_runs_events_before_the_carried_one_start_an_empty_cache():
    inner = ReadCountingStore()
    first, second, third = run(inner.append([ev(), ev(), ev()]))

    async def delivery(store, event, prev, earlier):
        with store.delivery():
            taken = store.accept(event, prev, earlier)
            reads = inner.reads
            view = await store.read("run-1")
            return taken, inner.reads - reads, [e.seq for e in view]

    assert run(delivery(TailCachedStore(inner), third, second.id, [first, second])) == (True, 0, [1, 2, 3])
    # anything but the whole log before it, ending with its predecessor: read instead
    for prev, earlier in [
        (second.id, [second]),  # not from the start
        (first.id, [first, second]),  # another predecessor
        (second.id, [first, replace(second, seq=3)]),  # a gap
        (second.id, [replace(first, stream="run-2"), second]),
    ]:  # another stream
        assert run(delivery(TailCachedStore(inner), third, prev, earlier))[:2] == (False, 1)
    # a cache that holds the run already goes by its own tail
    store = TailCachedStore(inner)
    run(delivery(store, second, first.id, [first]))
    assert run(delivery(store, third, second.id, [replace(first, id="x"), second]))[:2] == (True, 0)


def test_a_guarded_append_expects_the_head_the_step_read():
    inner = InMemoryEventStore()
    store = TailCachedStore(inner)
    run(inner.append([ev()]))

    async def step(interfere: bool):
        with store.delivery():
            store.stale("run-1")
            with store.guard("run-1"):
                await store.read("run-1")
                if interfere:
                    await inner.append([ev()])  # a handler in another worker, meanwhile
                return await store.append([ev()])

    assert [e.seq for e in run(step(False))] == [2]
    with pytest.raises(ConcurrencyError):
        run(step(True))
    assert [e.seq for e in run(inner.read("run-1"))] == [1, 2, 3]  # nothing of the step stored
    # outside a step (a handler), appends are not guarded
    with_delivery = TailCachedStore(inner)
    assert [e.seq for e in run(with_delivery.append([ev()]))] == [4]


def test_in_a_delivery_a_short_synced_log_needs_no_snapshot():
    class Asked(InMemoryEventStore):
        asked = 0

        async def load_snapshot(self, *args):
            Asked.asked += 1
            return await super().load_snapshot(*args)

    inner = Asked()
    run(inner.append([ev() for _ in range(3)]))
    store = TailCachedStore(inner)

    async def delivery():
        with store.delivery():
            await store.read("run-1")  # synced: the whole log is in memory
            return await store.load_snapshot("run-1", "test.tally", 1)

    assert run(delivery()) is None and Asked.asked == 0  # folding 3 events beats a query
    run(store.load_snapshot("run-1", "test.tally", 1))  # outside a delivery: asked
    assert Asked.asked == 1


@pytest.mark.parametrize("wire", ["not json", "[1]", "[null, [1, 2]]", '[null, {"id": "x"}]', '"a"'])
def test_an_unreadable_event_in_a_message_is_read_instead(wire):
    from aaa_django.celery.delivering import _accept

    store = TailCachedStore(InMemoryEventStore())
    (first,) = run(store.inner.append([ev()]))
    assert _accept(store, "run-1", 1, first.id, wire) is False


def test_a_run_whose_end_overtakes_a_read_outside_a_delivery_is_not_kept():
    """A background self-check (a read outside any delivery) catches up a run's log;
    the run's end drops the log meanwhile: the check gets what it read, and the tail
    keeps nothing of the ended run (kept, it would stay until 2,048 other runs pushed
    it out: ~1.6% of the runs a worker serves)."""
    import asyncio

    class Slow(InMemoryEventStore):
        gate: asyncio.Event | None = None

        async def read(self, *args, **kwargs):
            if self.gate is not None:
                await self.gate.wait()
            return await super().read(*args, **kwargs)

    inner = Slow()
    store = TailCachedStore(inner)

    async def check_overtaken_by_the_end():
        await store.append([ev(), ev()])  # a new run: held from its first event
        inner.gate = asyncio.Event()
        check = asyncio.ensure_future(store.read("run-1"))
        await asyncio.sleep(0)  # the check waits for its query
        store.forget("run-1")  # the run ended
        inner.gate.set()
        return await check

    assert [e.seq for e in run(check_overtaken_by_the_end())] == [1, 2]
    assert store.cached("run-1", 1) is None


class SnapshotThenWait(InMemoryEventStore):
    """A store whose reads take their result at once and return it when the test says
    (``hold()``: the next read waits on the returned event): a query that reads a
    snapshot of the log and is answered later, while this process appends."""

    def __init__(self) -> None:
        super().__init__()
        self.gates: list = []

    def hold(self):
        gate = asyncio.Event()
        self.gates.append(gate)
        return gate

    async def read(self, stream, **kwargs):
        found = await super().read(stream, **kwargs)
        if self.gates:
            await self.gates.pop(0).wait()
        return found


def held_three() -> tuple[SnapshotThenWait, TailCachedStore]:
    """A tail holding three events of ``run-1``, over a store whose reads wait."""
    inner = SnapshotThenWait()
    store = TailCachedStore(inner)
    run(store.append([ev(), ev(), ev()]))
    return inner, store


async def synced(store: TailCachedStore):
    """A delivery's first read of ``run-1``: the tail syncs it."""
    with store.delivery():
        return await store.read("run-1")


def test_two_reads_overlapping_an_append_never_leave_the_older_view():
    """Two deliveries of one run sync its log while this process appends to it (a worker
    carries hundreds at once): one read's view is older than the other's by the time it
    is answered. The tail keeps the newer: it lost the event just appended (the field's
    200 runs: 1 to 5 of them stalled until the sweeper re-drove them, their event
    "missing" from a view the delivery was told it holds)."""
    inner, store = held_three()

    async def main():
        first_gate = inner.hold()
        first = asyncio.ensure_future(synced(store))  # reads from seq 3 on: [3]
        await asyncio.sleep(0)
        (fourth,) = await store.append([ev()])  # the held log grows to 4
        second_gate = inner.hold()
        second = asyncio.ensure_future(synced(store))  # reads from seq 4 on: [4]
        await asyncio.sleep(0)
        first_gate.set()  # its [3] ends the log as it was held: the held log, grown since, stays
        assert [e.seq for e in await first] == [1, 2, 3, 4]
        (fifth,) = await store.append([ev()])  # extends the view the first read installed
        second_gate.set()  # its view (up to 4) is older than the one kept now
        await second
        with store.delivery():
            assert store.holds(fifth)
            return fourth, fifth, await store.read("run-1")

    fourth, fifth, seen = run(main())
    assert [e.id for e in seen[-2:]] == [fourth.id, fifth.id]
    assert store.held("run-1") == 5


def test_a_read_that_an_append_overtakes_twice_keeps_every_event_appended():
    """The schedule the field's worker logged: a sync reads the log after its held
    tail; an append of this process extends the held tail meanwhile, so the read no
    longer ends it; the tail then read the whole log again, and another append landed
    while that read was on its way: the whole log it installed lacked the newest event
    (a watcher of the run's end, reading while the run's tool results were appended)."""
    inner, store = held_three()

    async def main():
        read_gate = inner.hold()
        syncing = asyncio.ensure_future(synced(store))  # reads from seq 3 on: [3]
        await asyncio.sleep(0)
        await store.append([ev()])  # 4: the held tail grows past the read
        reread_gate = inner.hold()  # (a read of the whole log, if one is made, waits too)
        read_gate.set()
        for _ in range(3):
            await asyncio.sleep(0)
        (fifth,) = await store.append([ev()])  # 5, while a whole-log read would be on its way
        reread_gate.set()
        seen = await syncing
        return fifth, seen

    fifth, seen = run(main())
    assert [e.seq for e in seen][:4] == [1, 2, 3, 4]
    assert store.held("run-1") == 5 and store.cached("run-1", 5) == fifth
