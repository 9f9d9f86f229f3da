"""A lock or lease held by a process of this machine that has ended is taken by the next
that waits for it at once, not after its TTL; one held by a live process is not.

Found by the field trial's worker kill (benchmarks/field_trial.py --kill): a model call
whose exclusive lease the killed worker had taken, before it recorded the attempt, was
made 30 s later (the lease's TTL) by the worker started in its place."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
import uuid

import pytest

from aaa_django.celery.coordination import Coordinator

#: the leases' TTL here: far longer than the test may take (a lease taken before it
#: lapsed was taken because its holder had ended)
TTL = 600

HOLDER = """
import asyncio, sys
from aaa_django.celery.coordination import Coordinator

async def main():
    coord = Coordinator(sys.argv[1], prefix=sys.argv[2], lock_ttl=600, lease_ttl=600)
    async with coord.lease("exclusive", "attempt", 1), coord.lock("run-1"), coord.busy("run-1"):
        print("held", flush=True)
        await asyncio.sleep(3600)

asyncio.run(main())
"""


def holder(redis_url: str, prefix: str) -> subprocess.Popen:
    """A process that holds the exclusive lease ``attempt``, the lock of ``run-1`` and
    its busy mark, once it has printed "held"."""
    proc = subprocess.Popen([sys.executable, "-c", HOLDER, redis_url, prefix], stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None and proc.stdout.readline().strip() == "held", proc.poll()
    return proc


@pytest.fixture
def prefix() -> str:
    return f"test-gone-{uuid.uuid4().hex[:8]}"


def test_a_dead_holders_lock_and_leases_are_taken_at_once(redis_url, prefix):
    proc = holder(redis_url, prefix)
    coord = Coordinator(redis_url, prefix=prefix, lock_ttl=TTL, lease_ttl=TTL)
    assert coord.is_busy("run-1")
    lease_key = coord.key("exclusive", "attempt")
    (dead_token, expires_ms), *more = coord.client.zrange(lease_key, 0, -1, withscores=True)
    assert not more
    proc.send_signal(signal.SIGKILL)
    proc.wait()

    async def take() -> list:
        async with coord.lease("exclusive", "attempt", 1), coord.lock("run-1"):
            now_ms = time.time() * 1000
            return [now_ms, coord.client.zrange(lease_key, 0, -1), coord.client.get(coord.key("lock", "run-1"))]

    now_ms, tokens, lock_token = asyncio.run(asyncio.wait_for(take(), 60))  # (a hang guard)
    # taken while the dead holder's lease had minutes to live: because it had ended
    assert expires_ms - now_ms > (TTL - 120) * 1000
    assert dead_token not in tokens and len(tokens) == 1
    assert tokens[0].decode().split("#")[0].split("|")[3] == str(os.getpid())
    assert lock_token.decode().split("|")[3] == str(os.getpid())
    assert not coord.is_busy("run-1")  # (the sweeper's question: the dead worker's mark is gone)


def test_a_live_holders_lease_and_lock_are_not_taken(redis_url, prefix):
    proc = holder(redis_url, prefix)
    try:
        coord = Coordinator(redis_url, prefix=prefix, lock_ttl=TTL, lease_ttl=TTL)

        async def take(cm) -> bool:
            try:
                async with asyncio.timeout(2.5):  # (the waiter has looked for an ended holder twice)
                    async with cm:
                        return True
            except TimeoutError:
                return False

        assert not asyncio.run(take(coord.lease("exclusive", "attempt", 1)))
        assert not asyncio.run(take(coord.lock("run-1")))
        assert coord.is_busy("run-1")
        assert len(coord.client.zrange(coord.key("exclusive", "attempt"), 0, -1)) == 1
    finally:
        proc.kill()
        proc.wait()
