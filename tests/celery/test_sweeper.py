"""The sweeper finds runs nothing is working on and re-drives them from their logs."""

from __future__ import annotations

import asyncio
import io
import time
import uuid

from django.core.management import call_command
from django.test import override_settings

from aaa_django.celery.redrives import BACKOFF_LIMIT, DatabaseLedger
from aaa_django.celery.sweeper import sweep
from aaa_django.celery.tasks import sweep as sweep_task
from aaa_django.models import RunRecord

from .conftest import CELERY_DB, make_engine
from .site import loop, script
from .workers import queue_names

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


def test_a_run_whose_messages_wait_in_the_queue_is_re_driven_once_per_wait(arun, redis):
    """Queued is not lost: a run whose delivery waits in a queue nobody takes yet (a
    backlog, a consumer paused) looks stalled to every sweep. It is re-driven once,
    then left to move for as long as it had been idle (the wait doubling, at most
    BACKOFF_LIMIT * stall_after): each re-drive adds its deliveries to that queue.
    Swept every second for 190 s of idleness (stall_after 10 s): five re-drives, not
    191 (before the ledger: one per sweep)."""
    suffix = f"-unconsumed-{uuid.uuid4().hex[:8]}"
    queues = queue_names(suffix)  # no worker takes these
    stall = 10.0

    def queued() -> int:
        return sum(redis.llen(k) for k in redis.keys(f"aaa.*{suffix}*") if redis.type(k) == "list")

    async def main():
        async with make_engine(queues) as engine:
            run = await engine.start(loop(), {"task": script(turns=2)})
            last = (await engine.store.read(run.run_id))[-1].time.timestamp()
            seen = []
            for k in range(int(stall), int(20 * stall)):  # a sweep a second, as idle as that
                before = await asyncio.to_thread(queued)
                report = await sweep(engine, stall_after=stall, now=last + k)
                after = await asyncio.to_thread(queued)
                assert run.run_id in report.redriven + report.recent, (k, report.summary())
                seen.append((k, run.run_id in report.redriven, after - before))
            row = await RunRecord.objects.using("postgres").aget(pk=run.run_id)
            return last, seen, row

    try:
        last, seen, row = arun(main())
    finally:
        for key in redis.keys(f"aaa.*{suffix}*"):
            redis.delete(key)

    redriven = [k for k, yes, _ in seen if yes]
    print(f"\n{len(seen)} sweeps, re-driven at {redriven} s of idleness")
    # S, then as long as it had been idle: 2S, 4S, 8S, then every BACKOFF_LIMIT * S
    assert BACKOFF_LIMIT == 8 and redriven == [10, 20, 40, 80, 160]
    added = {k: n for k, _, n in seen}
    assert all(added[k] >= 1 for k in redriven)  # a re-drive publishes the run's delivery again
    assert all(n == 0 for k, n in added.items() if k not in redriven)  # the others nothing
    assert (row.redrives, row.redriven_at) == (5, last + 160)


def test_a_re_drive_that_was_lost_is_followed_by_another(cluster, arun):
    """The ledger holds a run back for a while, never for good: a re-drive whose
    messages were lost (here: never published) is followed by another once it has had
    its time, and the run finishes."""
    stall = 0.5

    async def main():
        run_id = await stalled_run()
        async with make_engine() as lost, make_engine() as engine:
            lost.bus.closed = True  # its re-drive publishes nothing
            last = (await engine.store.read(run_id))[-1].time.timestamp()
            at = max(time.time(), last + stall)
            first = await sweep(lost, stall_after=stall, now=at)
            early = await sweep(engine, stall_after=stall, now=at + stall / 2)
            due = at + max(stall, at - last)
            while time.time() < due:
                await _sleep(0.05)
            again = await sweep(engine, stall_after=stall)
            outcome = await engine.run(run_id).result(timeout=30)
            row = await RunRecord.objects.using("postgres").aget(pk=run_id)
            return run_id, first, early, again, outcome, row

    run_id, first, early, again, outcome, row = arun(main())

    assert run_id in first.redriven
    assert run_id in early.recent and run_id not in early.redriven
    assert run_id in again.redriven
    assert outcome.outcome == "success"
    assert row.redrives == 2


def test_two_sweeps_at_once_re_drive_a_run_once(arun):
    """The re-drive is claimed on the run's index row: of two sweeps that read the same
    ledger, one re-drives."""

    async def main():
        run_id = await stalled_run()
        async with make_engine() as one, make_engine() as two:
            one.bus.closed = two.bus.closed = True
            now = time.time() + 60
            reports = await asyncio.gather(sweep(one, stall_after=1, now=now), sweep(two, stall_after=1, now=now))
            return run_id, now, reports

    run_id, now, reports = arun(main())

    assert sorted(run_id in r.redriven for r in reports) == [False, True]
    assert [run_id in r.recent for r in reports].count(True) == 1
    # the claim itself: on the time both read, once
    ledger = DatabaseLedger("postgres")
    assert ledger.claim_sync(run_id, now, now + 100) is True
    assert ledger.claim_sync(run_id, now, now + 100) is False
    assert ledger.claim_sync("no-such-run", None, now) is True  # no row: re-driven all the same
    assert RunRecord.objects.using("postgres").get(pk=run_id).redrives == 2


async def _sleep(seconds: float) -> None:
    import asyncio

    await asyncio.sleep(seconds)


def test_a_sweep_leaves_the_runs_of_another_fleet_alone(cluster, arun):
    """Two sites (or deployments) that share a database but not their queues are two
    fleets (``aaa_django.site.holding.fleet``): a stalled run, or one with a due time,
    last held by a process of the other fleet is neither re-driven, adopted nor fired
    by this one's sweep, whose workers may lack its agent, tools or model. Its own
    fleet's sweep takes it."""
    from aaa_django.site.holding import RunKeeper, holder_id
    from aaa_django.store.leases import RunLeases

    run_id = arun(stalled_run())
    leases = RunLeases("postgres")
    try:
        assert leases.claim(holder_id("worker@theirs"), [run_id], 0.01) == {run_id}
    finally:
        leases.close()
    time.sleep(0.05)  # its lease lapsed

    async def main():
        async with make_engine() as engine:
            swept = {}
            for fleet in ("mine", "theirs"):
                keeper = RunKeeper("postgres", name="sweep", fleet=fleet)
                try:
                    swept[fleet] = await sweep(engine, stall_after=0, keeper=keeper)
                    await keeper.stop(release=True)
                finally:
                    await asyncio.to_thread(keeper.close)
            return swept, await engine.run(run_id).result(timeout=30)

    swept, outcome = arun(main())
    mine, theirs = swept["mine"], swept["theirs"]
    assert mine.elsewhere == [run_id]
    assert run_id not in mine.redriven + mine.adopted + mine.fired
    assert run_id in theirs.adopted and theirs.elsewhere == []
    assert outcome.outcome == "success"
