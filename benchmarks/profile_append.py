"""The CPU of one append on the async PostgreSQL store (its write path).

    .venv-bench/bin/python benchmarks/profile_append.py                 # ~30 s
    .venv-bench/bin/python benchmarks/profile_append.py --profile --sort cumtime

Appends one event at a time, as a run does (a run's start, then events of its
stream: each append folds into the run's index row), on ``PgEventStore`` over a
durable PostgreSQL (``common.postgres``). Prints the process CPU per append and the
main thread's share (the rest: the notifier's thread, ``store/wakeups.py``);
``--profile``: cProfile of the main thread, by thread CPU time (not wall time:
this machine is shared, and waits would swamp it).
"""

import argparse
import asyncio
import cProfile
import os
import pstats
import statistics
import sys
import time
import uuid
from datetime import UTC, datetime
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import postgres, setup_django, workdir

ap = argparse.ArgumentParser()
ap.add_argument("--n", type=int, default=2000)
ap.add_argument("--profile", action="store_true")
ap.add_argument("--top", type=int, default=50)
ap.add_argument("--sort", default="tottime")
ap.add_argument("--nogroup", action="store_true")
args = ap.parse_args()


def events_for(run):
    from aaa_django.events import Event
    from aaa_django.runtime.event_types import RUN_STARTED

    def t():
        return datetime.now(UTC)

    yield [
        Event(
            id=uuid.uuid4().hex,
            stream=run,
            type=RUN_STARTED,
            data={"algorithm": "toolloop", "input": {"task": "x"}},
            time=t(),
        )
    ]
    while True:
        yield [
            Event(
                id=uuid.uuid4().hex,
                stream=run,
                type="aaa.model.requested",
                data={"call": uuid.uuid4().hex, "messages": [{"role": "user", "content": "hello " * 20}]},
                time=t(),
            )
        ]


async def go(alias):
    from aaa_django.store.postgres import PgEventStore

    store = PgEventStore(alias, group_commit=not args.nogroup)

    async def batch(n):
        c0, t0, h0 = time.process_time(), time.perf_counter(), time.thread_time()
        for _run in range(n // 20):
            gen = events_for("run-" + uuid.uuid4().hex)
            for _ in range(20):
                await store.append(next(gen))
        return (time.process_time() - c0) / n, (time.perf_counter() - t0) / n, (time.thread_time() - h0) / n

    await batch(200)
    prof = cProfile.Profile(time.thread_time) if args.profile else None
    if prof:
        prof.enable()
    res = [await batch(args.n // 5) for _ in range(5)]
    if prof:
        prof.disable()
    print(
        f"append: CPU {statistics.median(r[0] for r in res) * 1e3:.3f} ms, wall {statistics.median(r[1] for r in res) * 1e3:.3f} ms; main thread CPU {statistics.median(r[2] for r in res) * 1e3:.3f} ms; load {os.getloadavg()[0]:.1f}"
    )
    if prof:
        pstats.Stats(prof).sort_stats(args.sort).print_stats(args.top)


with workdir() as tmp, postgres(tmp) as pg:
    b = setup_django(tmp, pg)
    asyncio.run(go(b["PostgreSQL"]))
