"""A held lock or lease is renewed by a task its holder stops on the way out. redis-py
may swallow a cancellation that lands in the middle of a command (the renewal's): the
renewal must still end, or it would keep the lease alive for ever while its holder
waits for it (seen: runs that had ended stayed "busy", and the sweeper would never
have re-driven them)."""

from __future__ import annotations

import asyncio

from aaa_django.celery.coordination import Coordinator


def test_a_renewal_that_swallows_its_cancellation_still_stops():
    async def main():
        coord = Coordinator("redis://127.0.0.1:1")  # (no connection is made)
        in_renewal = asyncio.Event()
        renewals = []

        async def renew():  # a Redis command that swallows a cancellation, as redis-py may
            renewals.append(1)
            if len(renewals) == 1:
                in_renewal.set()
                try:
                    await asyncio.sleep(30)
                except asyncio.CancelledError:
                    pass
            return True

        stop = asyncio.Event()
        keeper = asyncio.ensure_future(coord._keep(renew, 0.003, "the lease", stop))
        await in_renewal.wait()
        stop.set()  # what the holder does on the way out
        keeper.cancel()
        await asyncio.wait_for(asyncio.shield(keeper), 10)  # (a hang guard: it ends at once)
        return len(renewals)

    assert asyncio.run(main()) == 1  # stopped after the renewal it was in, no other


def test_a_busy_mark_that_lapsed_while_held_is_taken_again_and_a_pool_lease_is_not(redis_url, caplog):
    """A lease not renewed within its TTL (the holder's process stalled) has lapsed. A
    delivery's busy mark has no limit: its next renewal takes it again (the delivery is
    still going; without it the sweeper could re-drive a run a live worker holds), with
    a warning. A lease of a pool with a size is lost (taking it again could exceed the
    size): an error, as before."""
    import logging
    import uuid

    coord = Coordinator(redis_url, prefix=f"test-lapse-{uuid.uuid4().hex[:8]}", lease_ttl=0.6)

    async def said(words: str) -> None:
        while not any(words in r.getMessage() for r in caplog.records):  # (a renewal every 0.2 s)
            await asyncio.sleep(0.01)

    async def main():
        async with coord.busy("run-1"):
            coord.client.delete(coord.key("busy", "run-1"))  # lapsed: as after a stall past the TTL
            await asyncio.wait_for(said("had lapsed while held"), 30)  # (a hang guard)
            busy = coord.is_busy("run-1")
        async with coord.pool("tools", 2):
            coord.client.delete(coord.key("pool", "tools"))
            await asyncio.wait_for(said("lost"), 30)
            in_use = coord.in_use("tools")
        return busy, in_use, coord.is_busy("run-1")

    with caplog.at_level(logging.WARNING, logger="aaa_django.bus"):
        busy, in_use, busy_after = asyncio.run(main())
    assert busy is True and busy_after is False  # held again, then released on the way out
    assert in_use == 0  # the pool's lease: not taken again
    levels = {r.levelname for r in caplog.records if "lapsed" in r.getMessage() or "lost" in r.getMessage()}
    assert levels == {"WARNING", "ERROR"}
