"""The polls of waits for runs' ends, on a store that says which runs still go
(``KnowsRunning``: the site's database): every wait that polls within ``POLL_BATCH``
seconds of the others shares one query (``reads.Polls``), and only a run that no
longer goes is read. Three thousand waits polled one by one were three thousand reads
of their logs (benchmarks/bench_concurrency.py: about one read a turn at 3,000 runs in
flight, growing with the load's length)."""

from __future__ import annotations

import asyncio
import threading

import pytest

from aaa_django.events import FoldCache, StoreUnavailable
from aaa_django.runtime import Engine, InProcessBus
from aaa_django.runtime.reads import Polls
from aaa_django.runtime.wakeups import Hub
from aaa_django.store.postgres import PgEventStore
from aaa_django.store.sqlite import SqliteEventStore
from tests.api.test_runindex import log_of

from .helpers import arun

RUNS = 12


# -- the batches (pure: a recording query) ---------------------------------------------


class Asked:
    """A store's ``running``: records each question, answers from ``going``."""

    def __init__(self, going: set[str], fail: BaseException | None = None) -> None:
        self.going, self.fail = going, fail
        self.questions: list[list[str]] = []

    async def __call__(self, streams):
        self.questions.append(list(streams))
        await asyncio.sleep(0)
        if self.fail is not None:
            raise self.fail
        return {s for s in streams if s in self.going}


def test_polls_within_the_batch_share_one_question():
    ask = Asked({"run-1", "run-3"})
    polls = Polls(ask, batch=0.01)

    async def main():
        return await asyncio.gather(*(polls.running(f"run-{i}") for i in range(5)), polls.running("run-1"))

    assert arun(main()) == [False, True, False, True, False, True]
    assert [sorted(q) for q in ask.questions] == [["run-0", "run-1", "run-2", "run-3", "run-4"]]
    assert (polls.queries, polls.answered) == (1, 6)


def test_polls_after_a_batch_went_out_make_the_next_one():
    ask = Asked({"run-a"})
    polls = Polls(ask, batch=0.01)

    async def main():
        first = await polls.running("run-a")
        second = await asyncio.gather(polls.running("run-a"), polls.running("run-b"))
        return first, second

    assert arun(main()) == (True, [True, False])
    assert ask.questions == [["run-a"], ["run-a", "run-b"]]


def test_a_failed_question_fails_every_poll_of_its_batch_and_not_the_next():
    down = StoreUnavailable("the database is down")
    ask = Asked({"run-a"}, fail=down)
    polls = Polls(ask, batch=0.01)

    async def main():
        failed = await asyncio.gather(polls.running("run-a"), polls.running("run-b"), return_exceptions=True)
        ask.fail = None
        return failed, await polls.running("run-a")

    failed, after = arun(main())
    assert failed == [down, down]
    assert after is True


def test_a_poll_cancelled_meanwhile_leaves_the_others_answered():
    ask = Asked({"run-b"})
    polls = Polls(ask, batch=0.05)

    async def main():
        gone = asyncio.ensure_future(polls.running("run-a"))
        kept = asyncio.ensure_future(polls.running("run-b"))
        await asyncio.sleep(0)
        gone.cancel()
        return await kept, gone.cancelled()

    assert arun(main()) == (True, True)
    assert polls.answered == 1


def test_each_loop_has_its_own_batch():
    """An engine's waits may run on several loops (threads of a sync caller): a batch
    is answered on the loop its polls wait on."""
    ask = Asked({"run-a"})
    polls = Polls(ask, batch=0.05)
    barrier = threading.Barrier(2)
    out: dict[str, bool] = {}

    def on_its_loop(run_id: str) -> None:
        async def main():
            barrier.wait()  # both loops poll within the same batch window
            return await polls.running(run_id)

        out[run_id] = arun(main())

    threads = [threading.Thread(target=on_its_loop, args=(r,)) for r in ("run-a", "run-b")]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert out == {"run-a": True, "run-b": False}
    assert sorted(map(tuple, ask.questions)) == [("run-a",), ("run-b",)]


# -- the waits, on the site's stores ---------------------------------------------------


@pytest.fixture(params=["sqlite", "postgres"])
def store_of(request):
    """A function that opens the store (each call another handle on the same log, as
    another process would open it)."""
    if request.param == "postgres":
        alias = request.getfixturevalue("pg_alias")
        request.getfixturevalue("transactional_db")
        return lambda: PgEventStore(alias)
    request.getfixturevalue("transactional_db")
    return lambda: SqliteEventStore("default")


def counted(engine: Engine) -> list[str]:
    """The runs whose outcome the engine reads, in order (the wait's reads)."""
    reads: list[str] = []
    outcome = engine.outcome

    async def counting(run_id):
        reads.append(run_id)
        return await outcome(run_id)

    engine.outcome = counting  # type: ignore[method-assign]
    return reads


@pytest.mark.django_db(databases="__all__", transaction=True)
def test_waits_poll_in_batches_and_read_only_the_runs_that_ended(store_of):
    """Runs driven elsewhere, whose ends no hub announces here: each wait reads its run
    once when it begins, then polls; the polls say the runs still go, in shared
    queries, until another process ends them; then each is read once more."""
    elsewhere = store_of()
    logs = {f"run-{i}": log_of(f"run-{i}", None) for i in range(RUNS)}
    for events in logs.values():
        arun(elsewhere.append(events[:3]))  # started, validated, a model call requested

    async def main():
        engine = Engine(store=store_of(), bus=InProcessBus(), cache=FoldCache(), wakeups=Hub(), poll_interval=0.05)
        async with engine:
            reads = counted(engine)
            waits = [asyncio.ensure_future(engine.wait(run_id, timeout=30)) for run_id in logs]
            polls = engine._reads.polls
            assert polls is not None
            while polls.answered < 3 * RUNS:  # (each run polled several times, still going)
                await asyncio.sleep(0.01)
            assert reads == list(logs)  # the first looks only
            for events in logs.values():
                await elsewhere.append(events[3:])  # ...to the end
            outcomes = await asyncio.gather(*waits)
            return outcomes, reads, polls

    outcomes, reads, polls = arun(main())
    assert {o.outcome for o in outcomes} == {"success"}
    assert sorted(reads) == sorted(list(logs) * 2)  # the first look, and the end
    assert polls.queries < polls.answered / 2, (polls.queries, polls.answered)


@pytest.mark.django_db(databases="__all__", transaction=True)
def test_a_wait_the_hub_wakes_reads_at_once_without_a_poll(store_of):
    elsewhere = store_of()
    events = log_of("run-woken", None)
    arun(elsewhere.append(events[:3]))
    hub = Hub()

    async def main():
        engine = Engine(store=store_of(), bus=InProcessBus(), cache=FoldCache(), wakeups=hub, poll_interval=3600)
        async with engine:
            reads = counted(engine)
            wait = asyncio.ensure_future(engine.wait("run-woken", timeout=30))
            while not reads:
                await asyncio.sleep(0.01)
            await elsewhere.append(events[3:])
            hub.wake("run-woken")
            return await wait, reads, engine._reads.polls

    outcome, reads, polls = arun(main())
    assert outcome.outcome == "success"
    assert reads == ["run-woken", "run-woken"]
    assert polls is not None and polls.queries == 0
