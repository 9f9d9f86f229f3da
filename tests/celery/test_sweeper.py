"""The sweeper finds runs nothing is working on and re-drives them from their logs."""

from __future__ import annotations

import io
import time

from django.core.management import call_command
from django.test import override_settings

from aaa_django.celery.sweeper import sweep
from aaa_django.celery.tasks import sweep as sweep_task

from .conftest import CELERY_DB, make_engine
from .site import loop, script

pytestmark = [CELERY_DB]


async def stalled_run(task: str | None = None) -> str:
    """A run whose started event is stored but whose delivery was never enqueued (as
    when a process dies between the commit and the enqueue)."""
    async with make_engine() as engine:
        engine.bus.closed = True  # publishes nothing
        run = await engine.start(loop(), {"task": task or script(turns=2)})
        return run.run_id


def test_a_stalled_run_is_re_driven_and_finishes(cluster, arun):
    async def main():
        run_id = await stalled_run()
        async with make_engine() as engine:
            await _sleep(0.3)
            quiet = await sweep(engine, stall_after=60)
            report = await sweep(engine, stall_after=0.1)
            outcome = await engine.run(run_id).result(timeout=20)
            after = await sweep(engine, stall_after=0)
            return run_id, quiet, report, outcome, after

    run_id, quiet, report, outcome, after = arun(main())

    assert run_id in quiet.active and run_id not in quiet.redriven  # too recent to touch
    assert run_id in report.redriven
    assert outcome.outcome == "success"
    assert run_id not in after.redriven + after.active  # finished runs are not looked at


def test_a_run_with_a_delivery_in_progress_is_left_alone(cluster, arun, redis):
    task = script(turns=2, tool="slow", args={"tag": "slow-sweep", "seconds": 30})

    async def main():
        async with make_engine() as engine:
            run = await engine.start(loop(), {"task": task})
            end = time.monotonic() + 20
            while not redis.get("aaa-test:slow-sweep:started"):
                assert time.monotonic() < end
                await _sleep(0.02)
            await _sleep(0.3)  # the delivery has taken its busy lease
            report = await sweep(engine, stall_after=0)
            await run.cancel()
            await run.result(timeout=20)
            return run.run_id, report

    run_id, report = arun(main())

    assert run_id in report.busy and run_id not in report.redriven


def test_the_command_and_the_beat_task_re_drive(cluster, arun):
    first = arun(stalled_run())
    out = io.StringIO()
    with override_settings(AAA={"BUS": "celery"}):
        call_command("aaa_sweep", "--stall-after", "0", "--database", "postgres", "--dry-run", stdout=out)
    assert first in out.getvalue() and "would re-drive" in out.getvalue()

    second = arun(stalled_run())
    # The task a site's own schedule would send (the workers' duty sweeps by itself).
    sweep_task.apply_async(kwargs={"stall_after": 0, "using": "postgres"}, queue="aaa.algorithms")

    async def main():
        async with make_engine() as engine:
            return [await engine.run(r).result(timeout=30) for r in (first, second)]

    assert [o.outcome for o in arun(main())] == ["success", "success"]


async def _sleep(seconds: float) -> None:
    import asyncio

    await asyncio.sleep(seconds)
