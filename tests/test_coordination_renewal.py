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
