"""The write path's CPU against another checkout's, in one process, interleaved (a shared,
loaded machine moves both alike; separate processes minutes apart do not compare).

    .venv/bin/python benchmarks/ab_write_path.py --base /work/wt/main-copy          # one run appending
    .venv/bin/python benchmarks/ab_write_path.py --base /work/wt/main-copy --runs 8 # 8 runs at once

``--prepared``: this checkout with psycopg's server-side prepared statements on the
store's connections (``prepare_threshold`` 0, what a site's ``OPTIONS`` can ask for)
against without (Django's default), instead.

``--base``: a checkout of the commit to compare with (``git worktree add --detach DIR
main``). Its ``store/groupcommit.py``, ``store/wakeups.py`` and ``store/rows.py`` are
loaded beside this checkout's, and each round swaps them into one ``PgEventStore``
(its group commit, the notifier its appends hand their streams to, the numbering of
its rows): what differs elsewhere is not compared. Appends as ``profile_append.py``
makes them (a run's start, then events of its stream), on a durable PostgreSQL
(``common.postgres``); prints the medians of the rounds' process CPU and wall time
per append, and this checkout's over the base's.
"""

import argparse
import asyncio
import importlib.util
import os
import statistics
import sys
import time
import types
import uuid
from datetime import UTC, datetime
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import postgres, setup_django, workdir

ap = argparse.ArgumentParser()
ap.add_argument("--base", help="a checkout of the commit to compare with")
ap.add_argument(
    "--prepared",
    action="store_true",
    help="instead: this checkout with psycopg's server-side prepared statements "
    "(prepare_threshold 0 on the store's connections) against without",
)
ap.add_argument("--rounds", type=int, default=10)
ap.add_argument("--runs", type=int, default=1, help="runs appending at once (1: one after another)")
ap.add_argument(
    "--alone",
    action="store_true",
    help="each append says its caller is alone (caller_alone), as the engine's for a run alone",
)
args = ap.parse_args()
if not args.base and not args.prepared:
    ap.error("--base DIR or --prepared")
BASE = Path(args.base or ".") / "aaa_django" / "store"
ROUNDS, K = args.rounds, args.runs


def load(name):
    spec = importlib.util.spec_from_file_location(f"aaa_django.store._base_{name}", BASE / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    mod.__package__ = "aaa_django.store"
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    return mod


def events_for(run):
    from aaa_django.events import Event

    def t():
        return datetime.now(UTC)

    yield [
        Event(
            id=uuid.uuid4().hex,
            stream=run,
            type="aaa.run.started",
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
    import aaa_django.store.appends as A
    import aaa_django.store.postgres as P
    import aaa_django.store.wakeups as W

    store = P.PgEventStore(alias)
    if args.prepared:

        def variant(v):  # "base": unprepared (Django's default), "this": prepared
            for conn in store.conns._idle:  # (between rounds every connection is idle)
                conn.prepare_threshold = 0 if v == "this" else None
    else:
        bgc, bwk, brows = load("groupcommit"), load("wakeups"), load("rows")
        new_group, old_group = store.group, bgc.GroupCommit(store)
        # (a base without ``notify_committed``: its ``notify`` in its place)
        shim = (
            bwk
            if hasattr(bwk, "notify_committed")
            else types.SimpleNamespace(
                notify=bwk.notify,
                notify_committed=lambda using, streams, ended=False: bwk.notify(using, streams, committed=True),
            )
        )
        new_number = A.number

    def swap(v):
        if v == "base":
            store.group, P.wakeups, A.number = old_group, shim, brows.number
        else:
            store.group, P.wakeups, A.number = new_group, W, new_number

    if not args.prepared:
        variant = swap

    async def one_run(n):
        if args.alone:
            from aaa_django.events.store import caller_alone

            caller_alone.set(True)  # (this task's context only)
        gen = events_for("run-" + uuid.uuid4().hex)
        for _ in range(n):
            await store.append(next(gen))

    async def batch(n):
        c0, t0 = time.process_time(), time.perf_counter()
        if K == 1:
            for _ in range(n // 20):
                await one_run(20)
        else:
            for _ in range(n // (20 * K)):
                await asyncio.gather(*(one_run(20) for _ in range(K)))
        return (time.process_time() - c0) / n * 1e3, (time.perf_counter() - t0) / n * 1e3

    for v in ("base", "this"):
        variant(v)
        await batch(200)  # warm-up
    res = {"base": [], "this": []}
    for r in range(ROUNDS):
        for v in ("base", "this") if r % 2 == 0 else ("this", "base"):
            variant(v)
            await batch(40)
            res[v].append(await batch(320))
    med = {v: [statistics.median(x[i] for x in res[v]) for i in (0, 1)] for v in res}
    (bc, bw), (tc, tw) = med["base"], med["this"]
    print(
        f"{K} run(s) at once, per append: base CPU {bc:.3f} ms, wall {bw:.3f} ms; this CPU "
        f"{tc:.3f} ms, wall {tw:.3f} ms; this/base CPU {tc / bc:.2f}x, wall {tw / bw:.2f}x; "
        f"load {os.getloadavg()[0]:.1f}"
    )


with workdir() as tmp, postgres(tmp) as pg:
    b = setup_django(tmp, pg)
    asyncio.run(go(b["PostgreSQL"]))
