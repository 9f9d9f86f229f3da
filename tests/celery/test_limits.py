"""Limits that must hold across worker processes: shared tool pools, cancellation of a
tool running in another worker, a deadline when no worker is busy with the run, an
approval that expires while nobody looks."""

from __future__ import annotations

import time

from aaa_django.runtime.event_types import (
    APPROVAL_EXPIRED,
    APPROVAL_REQUESTED,
    RUN_COMPLETED,
    RUN_STARTED,
    TOOL_COMPLETED,
    TOOL_FAILED,
)

from .conftest import CELERY_DB, make_engine
from .site import POOL_SIZE, loop, script

pytestmark = [CELERY_DB]


def test_a_tool_pool_holds_across_workers(new_cluster, arun, redis):
    # Six worker processes could run six calls at once; the pool allows POOL_SIZE.
    wide = new_cluster(2, suffix="-pool", concurrency=3)
    task = script(turns=2, tool="pooled", args={"ms": 300, "tag": "pool-a"}, parallel=6)

    async def main():
        async with make_engine(wide.queues) as engine:
            run = await engine.start(loop(), {"task": task})
            return await run.result(timeout=60), await run.events()

    outcome, events = arun(main())

    assert outcome.outcome == "success"
    assert [e.type for e in events].count(TOOL_COMPLETED) == 6
    assert int(redis.get("aaa-test:pool-a:max")) == POOL_SIZE
    assert wide.errors() == []


def test_cancel_reaches_a_tool_running_in_another_worker(cluster, arun, redis):
    task = script(turns=2, tool="slow", args={"tag": "slow-a", "seconds": 60})

    async def main():
        async with make_engine() as engine:
            run = await engine.start(loop(), {"task": task})
            end = time.monotonic() + 20
            while not redis.get("aaa-test:slow-a:started"):
                assert time.monotonic() < end, "the slow tool never started"
                await _sleep(0.02)
            t0 = time.monotonic()
            await run.cancel("enough")
            outcome = await run.result(timeout=20)
            # the tool, in its worker, sees the cancellation (its own result is not
            # recorded: the run's end recorded the call it cut off, nothing follows the end)
            while not redis.get("aaa-test:slow-a:cancelled"):
                assert time.monotonic() - t0 < 10, "the tool call was not cancelled"
                await _sleep(0.02)
            return outcome, await run.events(), time.monotonic() - t0

    outcome, events, took = arun(main())

    assert outcome.outcome == "cancelled"
    assert [e.type for e in events][-2:] == [TOOL_FAILED, RUN_COMPLETED]
    cut = events[-2].data
    assert (cut["reason"], cut["cut_off"]) == ("cancelled", True)
    assert redis.get("aaa-test:slow-a:cancelled") == redis.get("aaa-test:slow-a:started")
    # a notice, not the 60 s the tool would take: the worker recorded the tool's cancellation
    del took


def test_a_deadline_fires_when_no_worker_is_busy_with_the_run(cluster, arun):
    # The run waits for an approval nobody gives: nothing is in flight when it is due.
    async def main():
        async with make_engine() as engine:
            t0 = time.monotonic()
            run = await engine.start(loop(), {"task": script(turns=2, tool="gated")}, deadline=1.5)
            outcome = await run.result(timeout=20)
            return outcome, await run.events(), time.monotonic() - t0

    outcome, events, took = arun(main())

    assert outcome.outcome == "timeout" and "deadline" in outcome.value
    assert APPROVAL_REQUESTED in [e.type for e in events]
    # the deadline fired on the log's clock, not before it was due
    started = next(e for e in events if e.type == RUN_STARTED)
    ended = next(e for e in events if e.type == RUN_COMPLETED)
    assert (ended.time - started.time).total_seconds() >= 1.5
    del took


def test_an_approval_expires_while_nobody_looks(cluster, arun):
    async def main():
        async with make_engine() as engine:
            run = await engine.start(loop(), {"task": script(turns=2, tool="gated_briefly")})
            return await run.result(timeout=20), await run.events()

    outcome, events = arun(main())

    types = [e.type for e in events]
    assert APPROVAL_EXPIRED in types
    (failed,) = [e for e in events if e.type == TOOL_FAILED]
    assert failed.data["reason"] == "expired"
    assert outcome.outcome == "success"  # the model was told, and answered


async def _sleep(seconds: float) -> None:
    import asyncio

    await asyncio.sleep(seconds)
