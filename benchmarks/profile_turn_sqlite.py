"""Where a ToolLoop turn's CPU goes on SQLite: the Django store's path.

    .venv-bench/bin/python benchmarks/profile_turn_sqlite.py                  # ~20 s
    .venv-bench/bin/python benchmarks/profile_turn_sqlite.py --profile --sort tottime

Runs ToolLoop runs of 20 turns (``bench_turn``'s) on the site's store over SQLite
(WAL, ``synchronous=FULL``, as ``bench_turn``), and on the in-memory store; prints the
process CPU per turn of each, the CPU of the loop's thread and of every other thread
(the store's: Django's thread-sensitive executor), and the CPU of one append as the
store runs it (``append_sync`` alone, and through the store's async ``append``).
``--profile``: cProfile of the loop's thread and of the store's thread, by thread CPU
time (this machine is shared: waits would swamp a wall-clock profile).

    .venv-bench/bin/python benchmarks/profile_turn_sqlite.py --compare --runs 20

``--compare``: one process, alternating rounds of the same runs on the Django store,
``SqliteEventStore`` as it is by default (a run alone has its appends made on its
loop's thread), the same always on its thread (``here_when_alone=False``), on the
loop (``own_thread=False``), and the in-memory store; each against the Django store
as the median of the rounds' ratios.
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
from bench_turn import aaa_run
from common import setup_django, workdir

ap = argparse.ArgumentParser()
ap.add_argument("--runs", type=int, default=30)
ap.add_argument("--turns", type=int, default=20)
ap.add_argument("--profile", action="store_true")
ap.add_argument("--top", type=int, default=40)
ap.add_argument("--sort", default="tottime")
ap.add_argument(
    "--compare",
    action="store_true",
    help="the Django store (a hop a call) against SqliteEventStore as it is by default, "
    "always on its thread, and on the loop, in alternating rounds",
)
args = ap.parse_args()


def events(run: str, n: int):
    from aaa_django.events import Event
    from aaa_django.runtime.event_types import RUN_STARTED

    now = lambda: datetime.now(UTC)  # noqa: E731
    yield [
        Event(
            id=uuid.uuid4().hex,
            stream=run,
            type=RUN_STARTED,
            data={"algorithm": "toolloop", "input": {"task": "x"}},
            time=now(),
        )
    ]
    for _ in range(n - 1):
        yield [
            Event(
                id=uuid.uuid4().hex,
                stream=run,
                type="aaa.model.requested",
                data={"call": uuid.uuid4().hex, "messages": [{"role": "user", "content": "hello"}]},
                time=now(),
            )
        ]


def ms(s: float) -> str:
    return f"{s * 1e3:.3f} ms"


async def compare(alias: str) -> None:
    """Runs on each store in turn, round after round (a busy moment of this shared
    machine moves them alike): wall and process CPU per turn, and each against the
    Django store's in the same round (the median of the rounds' ratios)."""
    from aaa_django.events import InMemoryEventStore
    from aaa_django.store import DjangoEventStore
    from aaa_django.store.sqlite import SqliteEventStore

    stores = {
        "DjangoEventStore (hop)": DjangoEventStore(alias),
        "SqliteEventStore (the default)": SqliteEventStore(alias),
        "SqliteEventStore (own thread)": SqliteEventStore(alias, here_when_alone=False),
        "SqliteEventStore (on the loop)": SqliteEventStore(alias, own_thread=False),
        "memory store": InMemoryEventStore(),
    }
    for store in stores.values():  # warm up
        await aaa_run(store, args.turns)
    rows = []
    load0 = os.getloadavg()[0]
    for _ in range(args.runs):
        rows.append({name: await aaa_run(store, args.turns) for name, store in stores.items()})
    med = statistics.median
    base = "DjangoEventStore (hop)"
    print(f"# {args.runs} rounds of {args.turns} turns, load {load0:.1f} -> {os.getloadavg()[0]:.1f}")
    for name in stores:
        wall = med(r[name]["seconds"] for r in rows) / args.turns
        cpu = med(r[name]["cpu"] for r in rows) / args.turns
        vs_wall = med(r[name]["seconds"] / r[base]["seconds"] for r in rows)
        vs_cpu = med(r[name]["cpu"] / r[base]["cpu"] for r in rows)
        print(f"{name:32} wall {ms(wall)} ({vs_wall:.2f}x)  process CPU {ms(cpu)} ({vs_cpu:.2f}x)")


async def go(alias: str) -> None:
    from asgiref.sync import sync_to_async

    from aaa_django.events import InMemoryEventStore
    from aaa_django.store.postgres import site_store

    store = site_store(alias)
    print(f"# {store!r}, load {os.getloadavg()[0]:.1f}")
    for _ in range(3):  # warm up
        await aaa_run(store, args.turns)
        await aaa_run(InMemoryEventStore(), args.turns)

    # the store's thread: measure (and profile) its CPU from inside it
    def thread_cpu():
        return time.thread_time()

    store_thread = sync_to_async(thread_cpu, thread_sensitive=True)
    profs = {}
    if args.profile:
        profs["loop"] = cProfile.Profile(time.thread_time)
        profs["store"] = cProfile.Profile(time.thread_time)
        await sync_to_async(profs["store"].enable, thread_sensitive=True)()
        profs["loop"].enable()
    rows = []
    for _ in range(args.runs):
        s0, l0 = await store_thread(), time.thread_time()
        r = await aaa_run(store, args.turns)
        s1, l1 = await store_thread(), time.thread_time()
        m = await aaa_run(InMemoryEventStore(), args.turns)
        rows.append((r["cpu"], l1 - l0, s1 - s0, m["cpu"], r["seconds"]))
    if args.profile:
        profs["loop"].disable()
        await sync_to_async(profs["store"].disable, thread_sensitive=True)()
    med = lambda i: statistics.median(r[i] for r in rows) / args.turns  # noqa: E731
    print(
        f"per turn: process CPU {ms(med(0))} (loop thread {ms(med(1))}, store thread "
        f"{ms(med(2))}); memory store {ms(med(3))}; wall {ms(med(4))}; calls {r['by_method']}"
    )

    # one append, as the store runs it
    n = 400
    gen = events("run-" + uuid.uuid4().hex, n + 1)

    def appends_sync(k):
        t0 = time.thread_time()
        for _ in range(k):
            store.append_sync(next(gen))
        return (time.thread_time() - t0) / k

    await sync_to_async(appends_sync, thread_sensitive=True)(1)
    sync_cpu = await sync_to_async(appends_sync, thread_sensitive=True)(n // 2)
    c0 = time.process_time()
    for _ in range(n // 2):
        await store.append(next(gen))
    async_cpu = (time.process_time() - c0) / (n // 2)
    print(
        f"append (one event, a run's stream): append_sync {ms(sync_cpu)} thread CPU; "
        f"await append {ms(async_cpu)} process CPU; load {os.getloadavg()[0]:.1f}"
    )

    if args.profile:
        for name, prof in profs.items():
            print(f"\n## {name} thread")
            pstats.Stats(prof).sort_stats(args.sort).print_stats(args.top)


with workdir() as tmp:
    b = setup_django(tmp, None)
    asyncio.run((compare if args.compare else go)(b["SQLite"]))
