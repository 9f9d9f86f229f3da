"""``Engine.wait`` is a subscription on the engine's wake-ups hub, the one the process's
other waiters (the REST API's event streams) use: whatever wakes a run on the hub (on
PostgreSQL, the database's notification of another process's append) makes the wait
read the run's end at once, and an end the engine makes itself wakes the hub's other
waiters too."""

from __future__ import annotations

import asyncio

import pytest

from aaa_django.events import FoldCache, InMemoryEventStore
from aaa_django.runtime import Engine, InProcessBus
from aaa_django.runtime.wakeups import RELIABLE_POLL
from aaa_django.runtime.outcome import FAILED
from aaa_django.runtime.wakeups import Hub

from .algos import Boom
from .helpers import ReadCountingStore, arun


def engine(store, **kwargs) -> Engine:
    return Engine(store=store, bus=InProcessBus(), cache=FoldCache(), **kwargs)


def test_a_wait_reads_the_runs_end_when_the_hub_wakes_its_run():
    """Another engine (another process) ends the run: the waiter hears it only from its
    hub, and reads then, not at its next poll (an hour away)."""
    store, hub = InMemoryEventStore(), Hub()
    reads = []

    async def main():
        async with engine(store, wakeups=hub, poll_interval=3600) as waiter, engine(store) as elsewhere:
            outcome = waiter.outcome

            async def watched(run_id):
                found = await outcome(run_id)
                reads.append(found)
                if len(reads) == 1:  # not ended yet: it ends elsewhere, and the hub hears of it
                    run = await elsewhere.start(Boom(), {}, run_id=run_id)
                    await run.result(timeout=10)
                    hub.wake(run_id)
                return found

            waiter.outcome = watched
            return await waiter.wait("run-x", timeout=10)

    outcome = arun(main())
    assert outcome.outcome == FAILED
    assert reads == [None, outcome]


def test_an_end_the_engine_makes_wakes_the_hubs_other_waiters():
    hub = Hub()
    stream = hub.subscribe("run-y")  # e.g. an event stream of the run, in this process
    other = hub.subscribe("run-z")

    async def main():
        async with engine(InMemoryEventStore(), wakeups=hub) as e:
            run = await e.start(Boom(), {}, run_id="run-y")
            return await run.result(timeout=10)

    arun(main())
    assert stream.wait(0) and not other.wait(0)


def test_a_wait_for_a_run_this_engine_ended_reads_nothing():
    # The engine appended the run's end: it has the outcome, and reads nothing back for
    # a wait (a thousand runs waited on at once were a thousand reads and more).
    store = ReadCountingStore()

    async def main():
        async with engine(store) as e:
            run = await e.start(Boom(), {}, run_id="run-b")
            await e.drain()
            before = store.reads
            outcome = await run.result(timeout=10)
            return outcome, store.reads - before

    outcome, reads = arun(main())
    assert outcome.outcome == FAILED
    assert reads == 0


class RecordingStore(InMemoryEventStore):
    """The in-memory store, recording what is asked of it."""

    def __init__(self) -> None:
        super().__init__()
        self.asked: list[tuple] = []

    async def read(self, stream, *, after=0, limit=None, tenant=None):
        self.asked.append(("read", stream, after, limit))
        return await super().read(stream, after=after, limit=limit, tenant=tenant)

    async def head(self, stream):
        self.asked.append(("head", stream))
        return await super().head(stream)

    async def load_snapshot(self, stream, name, version):
        self.asked.append(("load_snapshot", stream))
        return await super().load_snapshot(stream, name, version)


def test_the_end_of_a_run_another_process_ended_is_read_as_the_logs_last_event():
    """A wait woken by another process's end reads the log's head and its last event
    (the end: nothing follows it), not the run's whole log and a fold of it: a
    thousand waits woken at once each pay two small reads."""
    store = RecordingStore()

    async def main():
        async with engine(store, poll_interval=3600) as waiter, engine(store) as elsewhere:
            run = await elsewhere.start(Boom(), {}, run_id="run-e")
            await run.result(timeout=10)
            length = len(await store.read("run-e"))
            store.asked.clear()
            return await waiter.outcome("run-e"), await waiter.outcome("run-none"), length

    ended, never, length = arun(main())
    assert ended is not None and ended.outcome == FAILED
    assert never is None
    assert length > 2
    assert store.asked == [("head", "run-e"), ("read", "run-e", length - 1, 1), ("head", "run-none")]


class ReliableHub(Hub):
    """A hub that hears every process's changes (as the site's PostgreSQL listener
    does while it listens); it records how long each wait on it waits at most."""

    def __init__(self, reliable: bool) -> None:
        super().__init__()
        self._reliable = reliable
        self.waits: list[float] = []

    def reliable(self) -> bool:
        return self._reliable

    def subscribe(self, stream, loop=None, *, ends_only=False):
        sub = super().subscribe(stream, loop, ends_only=ends_only)
        until = sub.until

        async def recorded(timeout):
            self.waits.append(timeout)
            return await until(min(timeout, 0.01))  # (the test's own short wait)

        sub.until = recorded
        return sub


@pytest.mark.parametrize("reliable", [True, False])
def test_while_the_hub_hears_everything_a_wait_polls_only_as_a_safety_net(reliable):
    hub = ReliableHub(reliable)

    async def main():
        async with engine(InMemoryEventStore(), wakeups=hub, poll_interval=0.5) as e:
            with pytest.raises(asyncio.TimeoutError):  # a run no one ends
                await e.wait("run-never", timeout=0.2)

    arun(main())
    assert hub.waits
    if reliable:
        assert min(hub.waits) >= RELIABLE_POLL
    else:
        assert hub.waits[:3] == [0.5, 1.0, 2.0]


def blocked_model(gate: asyncio.Event):
    """A model that answers once ``gate`` is set."""
    from aaa_django.llm.fake import text

    async def model(request):
        await gate.wait()
        return text("done")

    return model


def test_a_wait_on_a_run_this_engine_drives_reads_nothing_when_it_begins():
    """The engine holds the run's log and will append its end: the wait's first look is
    its wake-up (a read at once raced the run's own first appends)."""
    from aaa_django.algos import ToolLoop
    from aaa_django.llm import FakeLLMClient, LLMHandler

    store = ReadCountingStore()

    async def main():
        gate = asyncio.Event()
        async with engine(store, poll_interval=3600) as e:
            LLMHandler(FakeLLMClient(blocked_model(gate))).attach(e)
            run = await e.start(ToolLoop(), {"task": "wait"}, run_id="run-d")
            await asyncio.sleep(0.05)  # the model call is in flight
            before = store.reads
            waiting = asyncio.ensure_future(e.wait("run-d", timeout=10))
            await asyncio.sleep(0.05)
            read_meanwhile = store.reads - before
            gate.set()
            return await waiting, read_meanwhile, run

    outcome, read_meanwhile, _ = arun(main())
    assert outcome.outcome == "success"
    assert read_meanwhile == 0


def test_a_run_it_holds_that_ended_elsewhere_is_read_at_the_first_poll_even_on_a_reliable_hub():
    """The run ended in another process before the wait began (its notification woke
    nobody yet): the first poll, ``poll_interval`` after, reads it, not
    ``RELIABLE_POLL`` after."""
    from aaa_django.algos import ToolLoop
    from aaa_django.llm import FakeLLMClient, LLMHandler

    store, hub = InMemoryEventStore(), ReliableHub(True)

    async def main():
        gate = asyncio.Event()
        async with engine(store, wakeups=hub, poll_interval=0.5) as here, engine(store) as elsewhere:
            LLMHandler(FakeLLMClient(blocked_model(gate))).attach(here)
            await here.start(ToolLoop(), {"task": "wait"}, run_id="run-e")
            await asyncio.sleep(0.05)  # here holds the run's log, its model call in flight
            assert await elsewhere.cancel("run-e", reason="elsewhere")
            await elsewhere.drain(5)
            outcome = await here.wait("run-e", timeout=10)
            gate.set()
            return outcome

    outcome = arun(main())
    assert outcome.outcome == "cancelled"
    assert hub.waits[0] == 0.5
