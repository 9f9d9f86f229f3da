"""What one delivery of the Celery bus costs, without Celery: a harness and a profiler.

    .venv/bin/python benchmarks/profile_delivery.py                  # timings (~15 s)
    .venv/bin/python benchmarks/profile_delivery.py --profile        # + cProfile of them
    .venv/bin/python benchmarks/profile_delivery.py --sql --runs 1   # the statements of a run
    .venv/bin/python benchmarks/profile_delivery.py --async-commit   # without waiting for fsync

It starts a durable PostgreSQL 15 and a Redis (as ``bench_celery.py`` does), builds
the engine a worker builds (``aaa_django.celery.engines.build_worker_engine``: the tail cache,
the Celery bus with its Redis lock, the site's handlers from ``celery_site.setup``),
and drives ToolLoop runs by calling :func:`aaa_django.celery.delivering.deliver_event` for each
published event, the way the ``aaa.deliver`` task does, on one long-lived loop. The
messages the bus would send to the broker are kept in a queue instead, and
``--engines 2`` hands them to two engines in turn (two workers, each with its own
caches, so each delivery catches up with what the other appended).

It prints the wall time and the CPU time per delivery, and how many store calls and
queries a delivery makes: the engine's own cost of a hop, which ``bench_celery.py``
measures end to end next to a bare Celery hop.
"""

from __future__ import annotations

import argparse
import collections
import cProfile
import os
import pstats
import statistics
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from bench_celery import redis_server  # noqa: E402
from common import ms, postgres, table, workdir  # noqa: E402

#: --store: the store spec a worker gets in its messages
STORES = {"pg": "aaa_django.store.postgres.PgEventStore", "django": "aaa_django.store.DjangoEventStore"}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=40)
    parser.add_argument("--turns", type=int, default=5)
    parser.add_argument("--engines", type=int, default=2)
    parser.add_argument("--profile", action="store_true")
    parser.add_argument("--top", type=int, default=40)
    parser.add_argument("--sql", action="store_true", help="print the statements of one run")
    parser.add_argument(
        "--async-commit", action="store_true", help="synchronous_commit=off: what a delivery costs besides the fsync"
    )
    parser.add_argument(
        "--store",
        choices=sorted(STORES),
        default="pg",
        help="the store the web process hands its workers: pg (PgEventStore, what "
        "build_engine() gives on PostgreSQL: awaited on the loop) or django "
        "(DjangoEventStore: its calls on the worker's db threads)",
    )
    parser.add_argument(
        "--send",
        action="store_true",
        help="also publish each message to Redis as a worker does (to a queue nobody reads)",
    )
    parser.add_argument(
        "--trace", action="store_true", help="the median of each part of a delivery (benchmarks/trace_hops.py marks)"
    )
    args = parser.parse_args()

    with workdir() as tmp, postgres(tmp) as pg, redis_server(tmp) as broker:
        if args.async_commit:
            import psycopg

            with psycopg.connect(**pg, dbname="aaa_bench", autocommit=True) as conn:
                conn.execute("ALTER DATABASE aaa_bench SET synchronous_commit = off")
        os.environ.update(
            {
                "AAA_BENCH_PG_HOST": pg["host"],
                "AAA_BENCH_PG_PORT": str(pg["port"]),
                "AAA_BENCH_PG_NAME": "aaa_bench",
                "AAA_BENCH_REDIS": broker,
                "DJANGO_SETTINGS_MODULE": "celery_site",
            }
        )
        import django
        from django.core.management import call_command

        django.setup()
        call_command("migrate", verbosity=0)
        run(args)


def run(args) -> None:
    if args.trace:  # (before the functions it wraps are imported here)
        os.environ["AAA_BENCH_TRACE"] = str(Path(tempfile.mkdtemp()) / "marks.jsonl")
        import trace_hops

        trace_hops.install()
    import django.db.backends.base.base as base
    from asgiref.sync import async_to_sync
    from celery_site import registry, script
    from django.db import connections

    from aaa_django.celery.bus import DistributedBus
    from aaa_django.celery.delivering import deliver_event
    from aaa_django.celery.engines import build_worker_engine
    from aaa_django.celery.worker import WorkerRuntime
    from aaa_django.events import FoldCache
    from aaa_django.site.engines import build_engine

    queue: collections.deque = collections.deque()

    sink = {"publisher": None, "n": 0}

    def capture(self, messages, ended, *, swallow=True):
        """What the bus would send to the broker: kept, to be delivered here (and with
        ``--send`` published too, as a worker does, to a queue nobody reads)."""
        for margs in (m[1] for m in messages):  # (queue, args, ...)
            queue.append(margs)
            self.sent += 1
            if args.send:
                publisher = sink["publisher"]
                if publisher is None:
                    from celery_site import app

                    from aaa_django.celery.publish import FastPublisher

                    publisher = sink["publisher"] = FastPublisher(app)
                assert publisher.send("aaa.deliver", margs, "profile.sink", repr(margs[1:4]))
                sink["n"] += 1
                if sink["n"] % 500 == 0:
                    publisher._producer.channel.client.delete("profile.sink")
        for run_id in ended:
            self.coordination().notify_ended(run_id)

    DistributedBus._send = capture
    if args.trace:
        trace_hops._timed(DistributedBus, "_send", "send")

    # Count (or print) the statements of every connection, the loop thread's included.
    queries = {"n": 0, "print": False}

    def count_queries(execute, sql, params, many, context):
        queries["n"] += 1
        if queries["print"]:
            print("   SQL", " ".join(sql.split())[:150])
        return execute(sql, params, many, context)

    connect = base.BaseDatabaseWrapper.connect

    def counted_connect(self, *a, **kw):
        connect(self, *a, **kw)
        if count_queries not in self.execute_wrappers:
            self.execute_wrappers.append(count_queries)

    base.BaseDatabaseWrapper.connect = counted_connect
    connections.close_all()

    rt = WorkerRuntime()  # the loop in a thread of its own, the store's calls on its db threads
    engines = []
    for _ in range(args.engines):
        engine = build_worker_engine(["django", "default", STORES[args.store]], db=rt.db)
        engine.cache = FoldCache(check_every=engine.cache.check_every)  # a holder per "worker"
        engines.append(engine)

    async def start(count: int) -> None:
        from aaa_django.algos import ToolLoop

        async with build_engine(bus=DistributedBus(in_worker=True)) as starter:
            algo = ToolLoop(registry(), max_turns=args.turns + 1)
            for _ in range(count):
                await starter.start(algo, {"task": script(args.turns)})

    def drive(runs: int, profiler=None, show: bool = False) -> tuple[list[float], float, int, int]:
        async_to_sync(start)(runs)
        if profiler is not None:  # the deliveries run on the loop's thread: profile that one
            rt.call(profiler.enable)
        walls, i, n0 = [], 0, queries["n"]
        cpu0 = time.process_time()
        while queue:
            spec, stream, seq, event_id, *wire = queue.popleft()
            if show:
                print(f"-- delivery of seq {seq} to engine {i % len(engines)}")
            t0 = time.perf_counter()
            rt.run(deliver_event(engines[i % len(engines)], stream, seq, event_id, wire=wire[0] if wire else None))
            walls.append(time.perf_counter() - t0)
            i += 1
        cpu = time.process_time() - cpu0
        if profiler is not None:
            rt.call(profiler.disable)
        return walls, cpu, i, queries["n"] - n0

    drive(5)  # warm up
    if args.sql:
        queries["print"] = True
        drive(1, show=True)
        queries["print"] = False
    if args.trace:
        trace_hops.flush()
        Path(os.environ["AAA_BENCH_TRACE"]).unlink(missing_ok=True)
    walls, cpu, deliveries, nq = drive(args.runs)
    if args.trace:
        trace_hops.flush()
    profiler = cProfile.Profile() if args.profile else None
    if profiler is not None:
        drive(args.runs, profiler)
    getattr(rt, "close", lambda: None)()  # (the runtime of an older worker.py has none)

    commit = "synchronous_commit=off" if args.async_commit else "durable"
    print(
        f"profile_delivery: {args.runs} ToolLoop runs of {args.turns} turns, "
        f"{args.engines} engine(s) taking deliveries in turn, PostgreSQL ({commit}), Redis, "
        f"store {STORES[args.store]}"
    )
    print()
    print(
        table(
            ["per delivery", "value"],
            [
                ["deliveries", str(deliveries)],
                ["wall, median", ms(statistics.median(walls))],
                ["wall, mean", ms(statistics.mean(walls))],
                ["CPU (this process, all threads), mean", ms(cpu / deliveries)],
                # (Django's connections only: PgEventStore's own psycopg connections are not counted)
                ["SQL statements through Django, mean", f"{nq / deliveries:.2f}"],
            ],
        )
    )
    if args.trace:
        print()
        print(trace_hops.delivery_report(os.environ["AAA_BENCH_TRACE"]))
    if profiler is not None:
        print()
        stats = pstats.Stats(profiler)
        stats.sort_stats("cumulative").print_stats(args.top)
        stats.sort_stats("tottime").print_stats(args.top)


if __name__ == "__main__":
    main()
