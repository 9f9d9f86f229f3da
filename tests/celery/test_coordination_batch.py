"""A loop's lease commands go to Redis together: those asked for in one pass of the loop
in one pipeline, each caller answered with its own command's answer or error; a pool's
size still holds; a lease held past a third of its TTL is renewed (a shorter one starts
no renewal); and a Redis that is away fails each lease as a command sent alone would."""

from __future__ import annotations

import asyncio
import uuid

import pytest
import redis

from aaa_django.celery.coordination import Coordinator


def coordinator(redis_url: str, **kw) -> Coordinator:
    return Coordinator(redis_url, prefix=f"test-batch-{uuid.uuid4().hex[:8]}", **kw)


def test_leases_taken_in_one_pass_go_in_one_pipeline_and_each_is_held_until_let_go(redis_url):
    coord = coordinator(redis_url)
    held = asyncio.Event()
    go = asyncio.Event()
    inside = []

    async def one(i: int) -> None:
        async with coord.busy(f"run-{i}"):
            inside.append(i)
            if len(inside) == 200:
                held.set()
            await go.wait()

    async def main():
        tasks = [asyncio.ensure_future(one(i)) for i in range(200)]
        await asyncio.wait_for(held.wait(), 30)  # (a hang guard)
        batch = coord.batch()
        taken = (batch.pipelines, batch.commands)
        busy = [coord.is_busy(f"run-{i}") for i in range(200)]
        go.set()
        await asyncio.gather(*tasks)
        return taken, busy, (batch.pipelines, batch.commands)

    taken, busy, after = asyncio.run(main())
    assert taken == (1, 200)  # the 200 taken in one pass: one pipeline
    assert all(busy)
    assert after == (2, 400)  # and let go of in one more
    assert not any(coord.is_busy(f"run-{i}") for i in range(200))


def test_a_pool_of_two_admits_two_of_the_leases_asked_for_in_one_pipeline(redis_url):
    coord = coordinator(redis_url)
    most = [0]
    now = [0]

    async def one() -> None:
        async with coord.pool("tools", 2):
            now[0] += 1
            most[0] = max(most[0], now[0])
            await asyncio.sleep(0.05)
            now[0] -= 1

    async def main():
        await asyncio.wait_for(asyncio.gather(*(one() for _ in range(6))), 60)

    asyncio.run(main())
    assert most[0] == 2
    assert coord.in_use("tools") == 0


def test_a_lease_held_past_a_third_of_its_ttl_is_renewed_and_a_shorter_one_starts_no_renewal(redis_url):
    coord = coordinator(redis_url, lease_ttl=0.6)  # (renewed every 0.2 s once held 0.2 s)

    def renewals() -> int:
        return sum(t.get_coro().__qualname__ == "Coordinator._keep" for t in asyncio.all_tasks())

    async def main():
        async with coord.busy("short"):
            short_tasks = renewals()
        async with coord.busy("long"):
            await asyncio.sleep(1.5)  # past its TTL: alive only if renewed
            long_busy = coord.is_busy("long")
            long_tasks = renewals()
        return short_tasks, long_busy, long_tasks, renewals()

    short_tasks, long_busy, long_tasks, after = asyncio.run(main())
    assert short_tasks == 0  # no renewal's task for a lease let go of at once
    assert long_busy is True
    assert long_tasks == 1
    assert after == 0
    assert coord.is_busy("long") is False


def test_a_redis_that_is_away_fails_every_lease_of_the_pass(redis_url):
    coord = coordinator("redis://127.0.0.1:1/0", socket_timeout=1)  # (nothing listens there)

    async def one(i: int) -> str:
        try:
            async with coord.busy(f"run-{i}"):
                return "held"
        except redis.ConnectionError:
            return "refused"

    async def main():
        return await asyncio.wait_for(asyncio.gather(*(one(i) for i in range(5))), 30)

    assert asyncio.run(main()) == ["refused"] * 5


def test_a_command_redis_refuses_fails_its_own_caller_only(redis_url):
    coord = coordinator(redis_url)
    coord.client.set(coord.key("busy", "not-a-set"), "a string")  # (ZADD on it: WRONGTYPE)

    async def one(name: str) -> str:
        try:
            async with coord.busy(name):
                return "held"
        except redis.ResponseError as exc:
            return str(exc).split()[0]

    async def main():
        return await asyncio.gather(one("run-1"), one("not-a-set"), one("run-2"))

    assert asyncio.run(main()) == ["held", "WRONGTYPE", "held"]


@pytest.mark.parametrize("cancel_after", [0, 1])
def test_a_lease_whose_taker_is_cancelled_leaves_the_others_of_its_pipeline_held(redis_url, cancel_after):
    coord = coordinator(redis_url)

    async def main():
        go = asyncio.Event()

        async def hold(name: str) -> None:
            async with coord.busy(name):
                await go.wait()

        kept = [asyncio.ensure_future(hold(f"run-{i}")) for i in range(3)]
        dropped = asyncio.ensure_future(hold("dropped"))
        for _ in range(cancel_after):
            await asyncio.sleep(0)
        dropped.cancel()
        while not all(coord.is_busy(f"run-{i}") for i in range(3)):
            await asyncio.sleep(0.01)
        go.set()
        await asyncio.wait_for(asyncio.gather(*kept), 30)
        return dropped.cancelled()

    assert asyncio.run(main()) is True
    assert not any(coord.is_busy(f"run-{i}") for i in range(3))


def test_a_run_ended_notice_sent_on_a_loop_goes_with_its_batch_and_a_redis_away_is_said_not_raised(redis_url, caplog):
    import logging

    coord = coordinator(redis_url)
    away = coordinator("redis://127.0.0.1:1/0", socket_timeout=1)

    async def never() -> bool:
        return False

    async def main():
        wait = asyncio.ensure_future(coord.wait_ended("run-1", never, poll=3600))
        await coord._ends().up(30)
        coord.notify_ended("run-1")  # (returns at once: the loop's batch sends it)
        await asyncio.wait_for(wait, 30)  # (a hang guard: its notice ends it)
        away.notify_ended("run-2")
        while not any("run-ended notice was not sent" in r.getMessage() for r in caplog.records):
            await asyncio.sleep(0.01)
        return coord.batch().commands, away.batch().commands

    with caplog.at_level(logging.WARNING, logger="aaa_django.bus"):
        sent, sent_away = asyncio.run(asyncio.wait_for(main(), 60))  # (a hang guard)
    assert (sent, sent_away) == (1, 1)


@pytest.mark.parametrize("passes", [0, 1, 2, 3, 5])
def test_a_taker_cancelled_before_or_while_its_acquire_goes_leaves_no_lease_held(redis_url, passes):
    """A taker that stops waiting (a model request's first attempt is reserved for at
    most a second) after ``passes`` passes of the loop: before its command is queued,
    before its pipeline goes (the command is not sent), or while the pipeline is on
    its way (the lease it took is let go of when the answer comes). Whichever, no
    lease is left held by no one until its TTL (here ten minutes) runs out."""
    coord = coordinator(redis_url, lease_ttl=600)
    key = coord.key("exclusive", "request-1")

    async def main():
        async def hold() -> None:
            async with coord.lease("exclusive", "request-1", 1):
                await asyncio.Event().wait()  # (held until cancelled)

        taker = asyncio.ensure_future(hold())
        for _ in range(passes):
            await asyncio.sleep(0)
        taker.cancel()
        await asyncio.gather(taker, return_exceptions=True)
        batch = coord.batch()
        while batch.queued or batch._sending:  # (every pipeline answered, an undo's too)
            await asyncio.sleep(0.01)
        return taker.cancelled(), batch.commands, batch.undone

    cancelled, commands, undone = asyncio.run(asyncio.wait_for(main(), 30))  # (a hang guard)
    assert redis.Redis.from_url(redis_url).zcard(key) == 0
    if cancelled:
        # sent: then taken, and undone (an acquire and its ZREM); or not sent at all
        assert (commands, undone) in ((0, 0), (2, 1)), (commands, undone)
    else:  # (held before the cancel came: let go of by the lease's own exit)
        assert (commands, undone) == (2, 0)
