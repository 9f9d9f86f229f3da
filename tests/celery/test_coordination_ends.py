"""Waits on runs' ends (``Coordinator.wait_ended``: a worker's tool call, cancelled when
its run ends in another worker) share one subscription per event loop. One
subscription per wait held one Redis connection each: at 200 runs a worker they took
every connection of the loop's pool, and the leases' renewals failed with "Too many
connections"."""

from __future__ import annotations

import asyncio
import uuid

import pytest

from aaa_django.celery.coordination import ASYNC_CONNECTIONS, Coordinator

pytestmark = [pytest.mark.redis]


def test_more_waits_than_the_pool_has_connections_share_one_subscription_and_each_hears_its_end(redis_url):
    coord = Coordinator(redis_url, prefix=f"test-ends-{uuid.uuid4().hex[:8]}")
    runs = [f"run-{i}" for i in range(ASYNC_CONNECTIONS + 50)]
    ended_elsewhere: set[str] = set()

    async def main():
        checks: dict[str, int] = {}

        def ended_of(run_id):
            async def ended() -> bool:  # what the log says: not ended, until it is
                checks[run_id] = checks.get(run_id, 0) + 1
                return run_id in ended_elsewhere

            return ended

        # poll: an hour, so a wait ends by its notice alone
        waits = {r: asyncio.ensure_future(coord.wait_ended(r, ended_of(r), poll=3600)) for r in runs}
        while len(checks) < len(runs):  # every wait has checked once: subscribed
            await asyncio.sleep(0.01)
        client, _ = coord._async()
        channels = await client.pubsub_numsub(*(coord.channel(r) for r in runs))
        # A lease taken and renewed meanwhile: a connection is free for it.
        async with coord.busy("run-0"):
            pass
        # Half the runs end elsewhere: exactly their waits return.
        for r in runs[::2]:
            ended_elsewhere.add(r)
            coord.notify_ended(r)
        done, pending = await asyncio.wait([waits[r] for r in runs[::2]], timeout=60)
        others = [waits[r] for r in runs[1::2]]
        still = sum(not w.done() for w in others)
        for w in others:
            w.cancel()
        await asyncio.gather(*others, return_exceptions=True)
        return channels, len(done), len(pending), still, [w.exception() for w in done]

    async def guarded():  # (a hang guard: one wait per connection never gets them all subscribed)
        return await asyncio.wait_for(main(), 120)

    channels, done, pending, still, errors = asyncio.run(guarded())
    assert all(n == 0 for _, n in channels)  # no wait subscribed on its own
    assert (done, pending, still) == (len(runs[::2]), 0, len(runs[1::2]))
    assert errors == [None] * done


def test_a_wait_after_the_subscription_has_closed_for_want_of_waits_hears_its_end(redis_url):
    """The loop's listener ends once no wait is left; the next wait starts it again."""
    coord = Coordinator(redis_url, prefix=f"test-ends-{uuid.uuid4().hex[:8]}")

    async def never() -> bool:
        return False

    async def main():
        first = asyncio.ensure_future(coord.wait_ended("a", never, poll=3600))
        ends = coord._ends()
        await ends.up(30)
        listener = ends.task
        first.cancel()
        await asyncio.gather(first, return_exceptions=True)
        await asyncio.wait_for(asyncio.shield(listener), 30)  # idle: it ends by itself
        second = asyncio.ensure_future(coord.wait_ended("b", never, poll=3600))
        await ends.up(30)
        coord.notify_ended("b")
        await asyncio.wait_for(second, 30)  # (a hang guard: its notice ends it)
        return listener, ends.task

    old, new = asyncio.run(main())
    assert old.done() and old is not new


def test_without_redis_a_wait_returns_when_the_log_says_its_run_ended():
    """No subscription (Redis unreachable): the wait polls ``ended()``."""
    coord = Coordinator("redis://127.0.0.1:1", prefix="test-ends-away")
    polls: list[int] = []

    async def ended() -> bool:
        polls.append(1)
        return len(polls) >= 3

    async def main():
        await asyncio.wait_for(coord.wait_ended("r", ended, poll=0.01), 30)

    asyncio.run(main())
    assert len(polls) == 3
