"""What a Redis lease costs a worker's loop: taken and let go of one command at a time,
against the loop's batch (``aaa_django.celery.coordination._Batch``: what ships).

    .venv-bench/bin/python benchmarks/bench_leases.py            # 2,000 leases at once, 7 rounds
    .venv-bench/bin/python benchmarks/bench_leases.py --quick    # 3 rounds

A Celery worker's loop takes a lease on every model request it calls (the request's
first attempt: a second delivery waits for a live maker) and lets go of it when the
result is appended; at 3,000 runs in flight hundreds are taken in one pass of the loop.
On a Redis started here, N leases taken at once, each held 0.2 s and let go of:

- *one by one*: as a lease was taken before the batch: each command sent alone (the
  acquire script, then ``ZREM``), and a task per lease for its renewals;
- *batched*: ``Coordinator.lease`` (what ships): the commands of one pass of the loop
  in one pipeline, and a renewal's task only for a lease held past a third of its TTL.

The sides alternate round by round; figures are the medians of the process's CPU a
lease (taken and let go of) and the ratio batched / one by one (< 1 is cheaper).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import statistics
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))
from bench_celery import redis_server  # noqa: E402
from common import table, workdir  # noqa: E402


async def one_by_one(coord, n: int, tag: str, hold: float) -> float:
    from aaa_django.celery.coordination import _ACQUIRE, _RENEW_LEASE, _token

    client, _ = coord._async()
    acquire = client.register_script(_ACQUIRE)

    renew_lease = client.register_script(_RENEW_LEASE)
    ttl_ms = int(coord.lease_ttl * 1000)

    async def one(i: int) -> None:
        key, token = coord.key("attempt", f"{tag}-{i}"), _token()
        assert await acquire(keys=[key], args=[0, ttl_ms, token])
        # (and its renewal's task, started with the lease, as it was)
        stop = asyncio.Event()
        renewal = asyncio.ensure_future(
            coord._keep(lambda: renew_lease(keys=[key], args=[ttl_ms, token, 0]), coord.lease_ttl, key, stop)
        )
        await asyncio.sleep(hold)
        stop.set()
        renewal.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await renewal
        await client.zrem(key, token)

    t = time.process_time()
    await asyncio.gather(*(one(i) for i in range(n)))
    return (time.process_time() - t) / n


async def batched(coord, n: int, tag: str, hold: float) -> float:
    async def one(i: int) -> None:
        async with coord.lease("attempt", f"{tag}-{i}"):
            await asyncio.sleep(hold)

    t = time.process_time()
    await asyncio.gather(*(one(i) for i in range(n)))
    return (time.process_time() - t) / n


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--leases", type=int, default=2000, help="leases taken at once")
    parser.add_argument("--hold", type=float, default=0.2, help="seconds each is held")
    parser.add_argument("--quick", action="store_true", help="3 rounds")
    args = parser.parse_args()
    rounds = 3 if args.quick else 7

    import os

    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tests.settings")
    import django

    django.setup()
    from aaa_django.celery.coordination import Coordinator

    with workdir() as tmp, redis_server(tmp) as url:
        coord = Coordinator(url, prefix="bench-leases")

        async def run() -> dict[str, list[float]]:
            sides = {"one by one": one_by_one, "batched": batched}
            # (a warm-up of each: connections made, scripts compiled)
            for name, side in sides.items():
                await side(coord, 50, f"warm-{name}", 0.01)
            got: dict[str, list[float]] = {name: [] for name in sides}
            for r in range(rounds):
                order = list(sides) if r % 2 == 0 else list(reversed(sides))
                for name in order:
                    got[name].append(await sides[name](coord, args.leases, f"{name}-{r}", args.hold))
            batch = coord.batch()
            got["pipelines"] = [batch.pipelines, batch.commands]
            return got

        got = asyncio.run(run())
    pipelines, commands = got.pop("pipelines")
    alone = statistics.median(got["one by one"])
    together = statistics.median(got["batched"])
    print(
        f"# bench_leases: {args.leases} leases at once, held {args.hold} s, {rounds} rounds; "
        f"the batch sent {commands} commands in {pipelines} pipelines"
    )
    print(
        table(
            ["side", "CPU a lease (median)", "range", "/ one by one"],
            [
                [
                    name,
                    f"{1000 * statistics.median(v):.3f} ms",
                    f"{1000 * min(v):.3f}-{1000 * max(v):.3f} ms",
                    f"{statistics.median(v) / alone:.2f}x",
                ]
                for name, v in got.items()
            ],
        )
    )
    print(f"# goal: batched below one by one: {'met' if together < alone else 'NOT met'} ({together / alone:.2f}x)")


if __name__ == "__main__":
    main()
