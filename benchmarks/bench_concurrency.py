"""Agent-scale concurrency: N runs x T turns with model latency L, started together.

    .venv-bench/bin/python benchmarks/bench_concurrency.py                     # 200 x 3 x 1 s, every row
    .venv-bench/bin/python benchmarks/bench_concurrency.py --runs 1000 --latency 2 --only inprocess-pg
    .venv-bench/bin/python benchmarks/bench_concurrency.py --only celery --runs 50
    .venv-bench/bin/python benchmarks/bench_concurrency.py --only inprocess-pg,celery --repeat 5 --without NAME

(``.venv-bench``: a venv with ``requirements/bench.txt``, see benchmarks/README.md.)

Every run is a ToolLoop of T model calls (a no-op tool call after each but the last);
the model is scripted and its reply comes after ``asyncio.sleep(L)``: a run waits
T x L at the least, and that is the ideal wall time of N such runs started together
(they wait at the same time). Printed per row: the wall time from the first start to
the last result, the ideal T x L, their ratio, each run's own wall time (its start to
its result) over the ideal, median and 90th percentile (what one user of the load
feels), the memory per in-flight run (the peak resident memory of the processes
doing the work during the load, less what they held before it, over N), and the
machine's CPU a turn (every process's, from /proc/stat, during the load, over N x T;
split into this process's, the workers', PostgreSQL's, Redis's and the rest); for the
in-process rows, the garbage collector's time during the load (``--gc off`` or
``freeze`` to see what it costs) and ``--width`` for the engine's turns
(``aaa_django.runtime.turns``).

Rows (each in a process of its own, on the same durable databases, in one run):

- ``inprocess-sqlite``, ``inprocess-pg``: the embedded default, ``Engine`` on the
  in-process bus with the site's store (``site_store``: ``SqliteEventStore`` on SQLite
  WAL + synchronous=FULL; on PostgreSQL 15 with fsync on, ``PgEventStore``, its calls
  awaits on psycopg's async connections, with group commit), the model and tool
  handlers in the same process; ``inprocess-pg-django`` (the Django store: every call
  through Django's thread-sensitive executor) and ``inprocess-pg-nogroup`` (the async
  store without group commit) measure the same in the same run; ``inprocess-pg-x2``:
  ``inprocess-pg``'s engine in each of two processes (the web processes of the
  embedded default, one a core), half the runs each, started together once both have
  warmed up (their memory, CPU and collector summed; the machine's CPU from the start
  to the last run's end);
- ``celery``: the README's one-worker command for every queue, ``celery worker -Q
  aaa.algorithms,aaa.llm,aaa.tools -c C`` (prefork, ``--celery-concurrency``, 2 by
  default: two worker processes), on PostgreSQL and Redis; runs started by a driver
  process's engine (``build_engine()``: the web process's side); memory is the
  worker processes', and so is the CPU (user + system, the timed runs only);
- ``langgraph``: the same loop as a LangGraph 1.2 graph, ``ainvoke(...,
  durability="sync")`` with ``AsyncPostgresSaver`` on a ``psycopg_pool`` pool
  (``autocommit=True, row_factory=dict_row, prepare_threshold=0``; ``--pool`` connections).

``--without NAME`` (``benchmarks/switches.py``): each row also runs, in the same
repetition and in alternating order, with the public API in place of one private
internal of a dependency that the library uses; the paired ratios (without / as
shipped, each repetition against its own) and the machine's load average are printed.

Goals: 200 x 3 x 1 s within 1.3x ideal in-process on PostgreSQL and on
Celery with 2 worker processes, ahead of LangGraph; 1,000 x 3 x 2 s on one process
within 1.5x ideal, at most 200 KB per in-flight run.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import gc
import json
import os
import platform
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import switches  # noqa: E402
from common import (  # noqa: E402
    PG_DB,
    ROOT,
    CPUWindow,
    cpu_seconds,
    descendants,
    postgres,
    postgres_pids,
    rss,
    setup_django,
    table,
    workdir,
)

ROWS = [
    "inprocess-sqlite",
    "inprocess-pg-django",
    "inprocess-pg-nogroup",
    "inprocess-pg",
    "inprocess-pg-x2",
    "celery",
    "langgraph",
    "inprocess-memory",
]


class PeakRSS:
    """Samples the resident memory of some processes on a thread of its own (so a busy
    event loop does not hide a peak); ``peak`` is the largest sum seen."""

    def __init__(self, pids, every: float = 0.02) -> None:
        self.pids, self.every = pids, every
        self.peak = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)

    def now(self) -> int:
        total = 0
        for pid in self.pids():
            try:
                total += rss(pid)
            except (FileNotFoundError, ProcessLookupError):
                pass
        return total

    def _sample(self) -> None:
        while not self._stop.is_set():
            self.peak = max(self.peak, self.now())
            self._stop.wait(self.every)

    def __enter__(self) -> PeakRSS:
        self.base = self.now()
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, self.now())


# -- the rows, each run in a child process --------------------------------------------------


def inprocess_store(row: str):
    """The store of an in-process row: the site's (``site_store``: on PostgreSQL the
    async store with group commit), or, to compare in the same run, the Django store
    (every call through Django's thread-sensitive executor) or the async store
    without group commit."""
    from aaa_django.store import DjangoEventStore
    from aaa_django.store.postgres import PgEventStore, site_store

    if row == "inprocess-memory":  # no database: the engine's own work
        from aaa_django.events import InMemoryEventStore

        return InMemoryEventStore()
    if row == "inprocess-pg-django":
        return DjangoEventStore("postgres")
    if row == "inprocess-pg-nogroup":
        return PgEventStore("postgres", group_commit=False)
    return site_store("postgres" if row == "inprocess-pg" else "default")


async def inprocess(row: str, runs: int, turns: int, latency: float) -> dict:
    from bench_turn import noop_registry, scripted

    from aaa_django.algos import ToolLoop
    from aaa_django.llm import FakeLLMClient, LLMHandler
    from aaa_django.runtime import Engine
    from aaa_django.tools import ToolHandler

    registry = noop_registry()
    algo = ToolLoop(registry, max_turns=turns + 1)
    store = inprocess_store(row)
    hub = {}
    if os.environ.get("AAA_BENCH_SITE_WAKEUPS"):  # (not --own-hub) build_engine()'s hub
        from aaa_django.store import wakeups

        hub = {"wakeups": wakeups.for_database("default" if row == "inprocess-sqlite" else "postgres")}
    if os.environ.get("AAA_BENCH_WIDTH"):  # --width: deliveries running at once
        from aaa_django.runtime.turns import Turns

        hub["turns"] = Turns(int(os.environ["AAA_BENCH_WIDTH"]))
    async with Engine(store=store, close_timeout=30, **hub) as engine:
        LLMHandler(FakeLLMClient(scripted(turns, latency))).attach(engine)
        ToolHandler(registry).attach(engine)
        warm = [await engine.start(algo, {"task": "warm-up"}) for _ in range(3)]
        for run in warm:
            await run.result()
        await engine.drain()
        gc.collect()
        if os.environ.get("AAA_BENCH_GC") == "freeze":  # --gc: what the collector costs
            gc.freeze()
        elif os.environ.get("AAA_BENCH_GC") == "off":
            gc.disable()
        if os.environ.get("AAA_BENCH_GC_THRESHOLD"):  # --gc-threshold
            gc.set_threshold(*map(int, os.environ["AAA_BENCH_GC_THRESHOLD"].split(",")))
        census_on = bool(os.environ.get("AAA_BENCH_CENSUS"))
        # the collector's passes during the load, by generation: [count, seconds, collected]
        gcstats = {0: [0, 0.0, 0], 1: [0, 0.0, 0], 2: [0, 0.0, 0]}
        gcstart = [0.0]

        # --census: what the young collections promote (gen 1's objects as a collection
        # of it starts: they have survived one already), every 10th of them
        promoted: collections.Counter = collections.Counter()
        sampled = [0]

        def gcwatch(phase, info):
            if phase == "start":
                if census_on and info["generation"] == 1:
                    sampled[0] += 1
                    if sampled[0] % 10 == 0:
                        promoted.update(_kind(o) for o in gc.get_objects(generation=1))
                gcstart[0] = time.perf_counter()
            else:
                st = gcstats[info["generation"]]
                st[0] += 1
                st[1] += time.perf_counter() - gcstart[0]
                st[2] += info["collected"]

        gc.callbacks.append(gcwatch)

        async def one(i: int):
            t = time.perf_counter()
            run = await engine.start(algo, {"task": f"run {i} of {os.getpid()}"})
            return await run.result(), time.perf_counter() - t, run.run_id

        def _kind(o: object) -> str:  # (coroutines and functions by name: which ones outlive a turn)
            t = type(o).__name__
            if t == "coroutine":
                return f"coroutine {o.cr_code.co_qualname}"
            if t == "method":
                return f"method {o.__func__.__qualname__}"
            if t == "builtin_function_or_method":
                return f"builtin {o.__qualname__} of {type(o.__self__).__name__}"
            if t == "function":
                return f"function {o.__qualname__}"
            return type(o).__qualname__

        async def census() -> None:  # --census: what the collector traverses, during the load
            while True:
                await asyncio.sleep(latency * 2.5)
                kinds = collections.Counter(type(o).__qualname__ for o in gc.get_objects())
                total = sum(kinds.values())
                print(f"# census at {time.perf_counter() - t0:.0f} s: {total} tracked objects", file=sys.stderr)
                for kind, n in kinds.most_common(12):
                    print(f"#   {n / runs:8.1f} a run  {kind}", file=sys.stderr)

        if os.environ.get("AAA_BENCH_GO"):  # one of several engines (inprocess-pg-x2): all start together
            print("ready", flush=True)
            await asyncio.to_thread(sys.stdin.readline)
        with PeakRSS(lambda: [os.getpid()]) as mem, CPUWindow(**cpu_groups(row)) as machine:
            t0, c0 = time.perf_counter(), time.process_time()
            if census_on:
                counted = asyncio.ensure_future(census())
            done = await asyncio.gather(*(one(i) for i in range(runs)))
            wall, cpu = time.perf_counter() - t0, time.process_time() - c0
            if os.environ.get("AAA_BENCH_GO"):
                print("done", flush=True)
            if census_on:
                counted.cancel()
                every = sum(promoted.values()) * 10 / (runs * turns)
                print(f"# promoted by the young collections: about {every:.0f} objects a turn", file=sys.stderr)
                kinds = collections.Counter()
                for kind, n in promoted.items():
                    kinds[kind.split()[0]] += n
                for title, counts in (("by type", kinds), ("by type and name", promoted)):
                    print(f"# {title}:", file=sys.stderr)
                    for kind, n in counts.most_common(30):
                        print(f"#   {n * 10 / (runs * turns):8.1f} a turn  {kind}", file=sys.stderr)
        assert {o.outcome for o, *_ in done} == {"success"}, done
    gc.callbacks.remove(gcwatch)
    out = {
        "wall": wall,
        "cpu": cpu,
        "machine": machine.machine,
        "parts": machine.parts(),
        "memory": mem.peak - mem.base,
        "processes": 1,
        "store": repr(store),
        "runs": [t for _, t, _ in done],
        "gc": gcstats,
    }
    out["turns"] = {"queued": engine.turns.queued, "forfeited": engine.turns.forfeited}
    out["reliable wake-ups"] = engine.wakeups.reliable()  # (else every wait polls its run)
    polls = engine._reads.polls  # the waits' polls, in batches (aaa_django.runtime.reads.Polls)
    if polls is not None:
        out["polls"] = [polls.queries, polls.answered]
    if os.environ.get("AAA_BENCH_LAGS"):
        out["lags"] = await lags(engine.store, [r for _, _, r in done])
    group = getattr(store, "group", None)
    if group is not None:  # group commit: transactions of several appends, and their appends
        out["groups"], out["grouped"], out["rolled_back"] = group.groups, group.grouped, group.rolled_back
        out["connections"] = store.pg.opened
    return out


def cpu_groups(row: str, **more) -> dict:
    """The processes whose CPU a row counts apart (:class:`~common.CPUWindow`): this one
    (the engine, or the driver that starts the runs) and PostgreSQL's, and ``more``."""
    groups = {"this process": lambda: [os.getpid()], **more}
    if row != "inprocess-sqlite" and row != "inprocess-memory":
        pg = json.loads(os.environ["AAA_BENCH_PG"])
        groups["postgres"] = lambda: postgres_pids(pg)
    return groups


async def lags(store, run_ids: list[str]) -> dict:
    """Where the runs' time went, from their logs (each event's time is when the engine
    made it): for each stretch between two events, its median, 90th percentile and
    largest over the runs, in ms. ``model k`` is the k-th model call (request to
    result; the model's own latency included), ``turn k`` the work between the k-th
    result and the next request (the step, the tool call, the next step)."""
    from aaa_django.runtime.event_types import (
        LLM_COMPLETED,
        LLM_REQUESTED,
        RUN_COMPLETED,
        RUN_STARTED,
    )

    def at(events, type: str) -> list:
        return [e.time for e in events if e.type == type]

    stretches: dict[str, list[float]] = {}
    for run_id in run_ids:
        events = await store.read(run_id)
        asked, answered = at(events, LLM_REQUESTED), at(events, LLM_COMPLETED)
        marks = [("start", at(events, RUN_STARTED)[0], asked[0])]
        for k, (a, b) in enumerate(zip(asked, answered)):
            marks.append((f"model {k + 1}", a, b))
            if k + 1 < len(asked):
                marks.append((f"turn {k + 1}", b, asked[k + 1]))
        marks.append(("end", answered[-1], at(events, RUN_COMPLETED)[0]))
        for name, a, b in marks:
            stretches.setdefault(name, []).append((b - a).total_seconds() * 1000)
    out = {}
    for name, values in stretches.items():
        values.sort()
        out[name] = [values[len(values) // 2], values[len(values) * 9 // 10], values[-1]]
    return out


async def langgraph(pg: dict, runs: int, turns: int, latency: float, pool_size: int) -> dict:
    from bench_turn import langgraph_app, lg_config
    from langchain_core.messages import HumanMessage
    from langgraph.checkpoint.postgres.aio import AsyncPostgresSaver
    from psycopg.rows import dict_row
    from psycopg_pool import AsyncConnectionPool

    conninfo = f"host={pg['host']} port={pg['port']} user={pg['user']} dbname={PG_DB}"
    kwargs = dict(autocommit=True, row_factory=dict_row, prepare_threshold=0)
    async with AsyncConnectionPool(conninfo, kwargs=kwargs, min_size=pool_size, max_size=pool_size) as pool:
        saver = AsyncPostgresSaver(pool)
        await saver.setup()
        app = langgraph_app(turns, saver, latency)
        warm = langgraph_app(turns, saver)

        async def one(graph, i: int) -> tuple[str, float]:
            t = time.perf_counter()
            out = await graph.ainvoke({"messages": [HumanMessage(f"run {i}")]}, lg_config(turns), durability="sync")
            return out["messages"][-1].content, time.perf_counter() - t

        for i in range(3):
            await one(warm, i)
        gc.collect()
        with PeakRSS(lambda: [os.getpid()]) as mem, CPUWindow(**cpu_groups("langgraph")) as machine:
            t0, c0 = time.perf_counter(), time.process_time()
            done = await asyncio.gather(*(one(app, i) for i in range(runs)))
            wall, cpu = time.perf_counter() - t0, time.process_time() - c0
        assert {a for a, _ in done} == {"done"}, done
    return {
        "wall": wall,
        "cpu": cpu,
        "machine": machine.machine,
        "parts": machine.parts(),
        "memory": mem.peak - mem.base,
        "processes": 1,
        "runs": [t for _, t in done],
    }


def messages_sent(client) -> int:
    """The messages the broker (Redis) has been given so far: kombu's Redis transport
    sends each with an LPUSH to its queue's list (a delivery a worker takes on its own
    loop sends none)."""
    return int(client.info("commandstats").get("cmdstat_lpush", {}).get("calls", 0))


def celery_row(pg: dict, runs: int, turns: int, latency: float, concurrency: int, tmp: Path) -> dict:
    """Workers as the README starts them (one command, every queue), driven from here."""
    from bench_celery import redis_server, workers

    with redis_server(tmp) as broker:
        env = {
            **os.environ,
            "AAA_BENCH_PG_HOST": pg["host"],
            "AAA_BENCH_PG_PORT": str(pg["port"]),
            "AAA_BENCH_PG_NAME": PG_DB,
            "AAA_BENCH_REDIS": broker,
            "DJANGO_SETTINGS_MODULE": "celery_site",
            "PYTHONPATH": os.pathsep.join([str(HERE), str(ROOT)]),
        }
        os.environ.update(
            {
                k: env[k]
                for k in (
                    "AAA_BENCH_PG_HOST",
                    "AAA_BENCH_PG_PORT",
                    "AAA_BENCH_PG_NAME",
                    "AAA_BENCH_REDIS",
                    "DJANGO_SETTINGS_MODULE",
                )
            }
        )
        import django
        import redis
        from django.core.management import call_command

        django.setup()
        switches.apply()  # (the workers apply theirs in celery_site.setup)
        call_command("migrate", verbosity=0)
        from asgiref.sync import async_to_sync
        from celery_site import registry, script

        from aaa_django.algos import ToolLoop
        from aaa_django.site.engines import build_engine

        queues = "aaa.algorithms,aaa.llm,aaa.tools"
        with workers(1, env, tmp, concurrency=concurrency, queues=queues) as procs:
            pids = lambda: [p for w in procs for p in descendants(w.pid)]  # noqa: E731

            async def drive() -> dict:
                algo = ToolLoop(registry(), max_turns=turns + 1)
                # The waiters wake on the workers' run-ended notices: polling each run
                # every fraction of a second (200 reads at a time) would load the
                # machine the workers share more than the workers do.
                async with build_engine(poll_interval=30) as engine:
                    warm = [await engine.start(algo, {"task": script(turns)}) for _ in range(2 * concurrency)]
                    # (waited for together: a run that ended before its wait began is
                    # found by the wait's first poll, poll_interval (30 s) later)
                    await asyncio.gather(*(run.result(timeout=120) for run in warm))
                    task = script(turns, latency)
                    workers_then = pids()
                    c0 = cpu_seconds(workers_then)

                    async def one():
                        t = time.perf_counter()
                        run = await engine.start(algo, {"task": task})
                        started_at.append(time.perf_counter() - t0)
                        return await run.result(timeout=3600), time.perf_counter() - t, run.run_id

                    started_at: list[float] = []
                    broker_client = redis.Redis.from_url(broker)
                    redis_pid = broker_client.info("server")["process_id"]
                    groups = cpu_groups("celery", workers=pids, redis=lambda: [redis_pid])
                    sent0 = messages_sent(broker_client)
                    with PeakRSS(pids, every=0.1) as mem, CPUWindow(**groups) as machine:
                        t0 = time.perf_counter()
                        done = await asyncio.gather(*(one() for _ in range(runs)))
                        wall = time.perf_counter() - t0
                    sent = messages_sent(broker_client) - sent0
                    # the workers' CPU for the 200 runs (the same processes: prefork keeps its children)
                    cpu = cpu_seconds(workers_then) - c0
                    assert {o.outcome for o, *_ in done} == {"success"}, done
                    out = {
                        "wall": wall,
                        "cpu": cpu,
                        "machine": machine.machine,
                        "parts": machine.parts(),
                        "memory": mem.peak - mem.base,
                        "processes": len(pids()),
                        "runs": [t for _, t, _ in done],
                        "messages": sent,
                    }
                    if os.environ.get("AAA_BENCH_LAGS"):
                        out["lags"] = await lags(engine.store, [r for *_, r in done])
                        started_at.sort()
                        out["lags"]["(driver) start returned"] = [
                            1000 * started_at[len(started_at) // 2],
                            1000 * started_at[len(started_at) * 9 // 10],
                            1000 * started_at[-1],
                        ]
                    return out

            return async_to_sync(drive)()


def engines(args, n: int) -> dict:
    """The ``inprocess-pg`` row's engine in each of ``n`` processes of its own (the web
    processes of the embedded default, one a core), each starting ``runs / n`` of the
    runs, all at once once every one has warmed up; the machine's CPU and the wall time
    from that moment to the last run's end."""
    cmd = [
        sys.executable,
        __file__,
        "--child",
        "inprocess-pg",
        "--turns",
        str(args.turns),
        "--latency",
        str(args.latency),
    ]
    share = [args.runs // n + (k < args.runs % n) for k in range(n)]
    tmp = Path(os.environ["AAA_BENCH_TMP"])
    setup_django(tmp, json.loads(os.environ["AAA_BENCH_PG"]))  # (migrated once, not by each at once)
    for k in range(n):
        (tmp / f"engine-{k}").mkdir()
    procs = [
        subprocess.Popen(
            [*cmd, "--runs", str(share[k])],
            env={**os.environ, "AAA_BENCH_GO": "1", "AAA_BENCH_TMP": str(tmp / f"engine-{k}")},
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        for k in range(n)
    ]
    try:
        for p in procs:
            assert p.stdout.readline().strip() == "ready", p.poll()
        pids = [p.pid for p in procs]
        with CPUWindow(**cpu_groups("inprocess-pg", engines=lambda: pids)) as machine:
            t0 = time.perf_counter()
            for p in procs:
                p.stdin.write("go\n")
                p.stdin.flush()
            for p in procs:  # (the window ends with the loads, the processes and their backends alive)
                assert p.stdout.readline().strip() == "done", p.poll()
            wall = time.perf_counter() - t0
        outs = []
        for p in procs:  # (read through the same buffer as the lines above: communicate() would skip it)
            p.stdin.close()
            outs.append(p.stdout.read())
            p.wait()
    finally:  # one that failed: the others are not left to start their loads when stdin closes
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    assert all(p.returncode == 0 for p in procs), [p.returncode for p in procs]
    rows = [json.loads(o.strip().splitlines()[-1]) for o in outs]
    return {
        "wall": wall,
        "cpu": sum(r["cpu"] for r in rows),
        "machine": machine.machine,
        "parts": machine.parts(),  # ("this process": the driver, which only waits)
        "memory": sum(r["memory"] for r in rows),  # (each engine's peak during its load)
        "processes": n,
        "runs": [t for r in rows for t in r["runs"]],
        "gc": {g: [sum(r["gc"][str(g)][i] for r in rows) for i in range(3)] for g in (0, 1, 2)},
        "walls": [r["wall"] for r in rows],
    }


def child(args) -> None:
    """One row, in this process; prints its result as JSON on the last line."""
    pg = json.loads(os.environ["AAA_BENCH_PG"])
    tmp = Path(os.environ["AAA_BENCH_TMP"])
    load = os.getloadavg()[0]
    if args.child == "celery":
        out = celery_row(pg, args.runs, args.turns, args.latency, args.celery_concurrency, tmp)
    elif args.child == "inprocess-pg-x2":
        out = engines(args, 2)
    elif args.child == "langgraph":
        out = asyncio.run(langgraph(pg, args.runs, args.turns, args.latency, args.pool))
    else:
        setup_django(tmp, pg)
        switches.apply()
        if os.environ.get("AAA_BENCH_PROFILE"):  # a deterministic profile of the row, to a file
            import cProfile

            with cProfile.Profile() as prof:
                out = asyncio.run(inprocess(args.child, args.runs, args.turns, args.latency))
            prof.dump_stats(os.environ["AAA_BENCH_PROFILE"])
        else:
            out = asyncio.run(inprocess(args.child, args.runs, args.turns, args.latency))
    out["load"] = [load, os.getloadavg()[0]]  # the 1-minute load average before and after
    out["without"] = switches.names()
    out["applied in"] = len(switches.applied())  # processes (the driver, each worker process)
    print(json.dumps(out))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--runs", type=int, default=200)
    ap.add_argument("--turns", type=int, default=3)
    ap.add_argument("--latency", type=float, default=1.0, help="seconds of each model call")
    ap.add_argument("--only", default=",".join(ROWS), help=f"rows to run, of {','.join(ROWS)}")
    ap.add_argument("--celery-concurrency", type=int, default=2, help="worker processes (prefork -c)")
    ap.add_argument("--pool", type=int, default=10, help="LangGraph's PostgreSQL pool size")
    ap.add_argument(
        "--own-hub",
        action="store_true",
        help="in-process rows: the engine waits on a wake-ups hub of its own (as an "
        "Engine built by hand does), not on the site's, which build_engine() "
        "gives (on PostgreSQL, the LISTENing connection's; the default)",
    )
    ap.add_argument("--site-wakeups", action="store_true", help=argparse.SUPPRESS)  # (the default now)
    ap.add_argument(
        "--width",
        type=int,
        help="in-process rows: the engine's turns' width "
        "(deliveries running at once; default aaa_django.runtime.turns.WIDTH)",
    )
    ap.add_argument(
        "--gc",
        choices=["default", "freeze", "off", "site"],
        default="default",
        help="the garbage collector as it is; gc.freeze() after the warm-up (and in the "
        "Celery row's pool processes once started); off during the in-process rows' load "
        "(to see what it costs); site: as the example site sets its web and worker "
        "processes (project/collector.py: its thresholds, and gc.freeze() once started), "
        "in the in-process rows and the Celery row's pool processes",
    )
    ap.add_argument(
        "--gc-threshold",
        metavar="G0,G1,G2",
        help="in-process rows, and the Celery row's worker processes: "
        "gc.set_threshold(G0, G1, G2) for the load, as a site that carries many runs "
        "in one process may (docs/engine.md: many runs in one process)",
    )
    ap.add_argument(
        "--lags",
        action="store_true",
        help="in-process and Celery rows: where the runs' time went, stretch by stretch, from their logs",
    )
    ap.add_argument(
        "--census",
        action="store_true",
        help="in-process rows: count the objects the garbage collector tracks, by type, "
        "halfway through the second model call, to standard error",
    )
    ap.add_argument(
        "--profile",
        metavar="DIR",
        help="in-process rows: a cProfile of each row (its warm-up and load), to "
        "DIR/<row>-<repetition>.prof (pstats; it slows the row, so its figures are not the row's)",
    )
    ap.add_argument(
        "--repeat",
        type=int,
        default=1,
        help="run every row this many times, the rows in turn, and print medians "
        "(this machine's noise: one run of a row moved by 20-40%%)",
    )
    ap.add_argument(
        "--without",
        action="append",
        default=[],
        metavar="NAME",
        choices=sorted(switches.SWITCHES),
        help="also run every row without one private internal of a dependency, the "
        "public API in its place (benchmarks/switches.py), in the same repetitions, "
        "in alternating order; repeatable",
    )
    ap.add_argument("--child", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.gc == "site":  # the example site's collector (project/collector.py)
        from project.collector import THRESHOLD

        args.gc, args.gc_threshold = "freeze", args.gc_threshold or ",".join(map(str, THRESHOLD))
    if args.child:
        child(args)
        return
    rows = [r for r in args.only.split(",") if r]
    unknown = set(rows) - set(ROWS)
    if unknown:
        ap.error(f"unknown rows {sorted(unknown)}; choose from {ROWS}")
    ideal = args.turns * args.latency
    started = time.perf_counter()
    results = {}
    if args.profile:
        os.makedirs(args.profile, exist_ok=True)
    with workdir() as tmp, postgres(tmp) as pg:
        variants = [None, *args.without]  # as shipped, then without each switch
        for repetition in range(args.repeat):  # the rows in turn, each time (the machine's noise spread)
            # the variants in turn, each repetition starting from another one
            turn = variants[repetition % len(variants) :] + variants[: repetition % len(variants)]
            for row, without in [(row, w) for row in rows for w in turn]:
                name = row if without is None else f"{row} without {without}"
                sub = tmp / f"{row}-{without or 'shipped'}-{repetition}"
                sub.mkdir()
                os.chmod(sub, 0o777)
                cmd = [
                    sys.executable,
                    __file__,
                    "--child",
                    row,
                    "--runs",
                    str(args.runs),
                    "--turns",
                    str(args.turns),
                    "--latency",
                    str(args.latency),
                    "--celery-concurrency",
                    str(args.celery_concurrency),
                    "--pool",
                    str(args.pool),
                ]
                env = {
                    **os.environ,
                    "AAA_BENCH_PG": json.dumps(pg),
                    "AAA_BENCH_TMP": str(sub),
                    **({} if args.own_hub else {"AAA_BENCH_SITE_WAKEUPS": "1"}),
                    **({"AAA_BENCH_WIDTH": str(args.width)} if args.width else {}),
                    "AAA_BENCH_GC": args.gc,
                    **({"AAA_BENCH_LAGS": "1"} if args.lags else {}),
                    **({"AAA_BENCH_CENSUS": "1"} if args.census else {}),
                    **(
                        {
                            "AAA_BENCH_PROFILE": os.path.join(
                                os.path.abspath(args.profile), f"{name.replace(' ', '-')}-{repetition}.prof"
                            )
                        }
                        if args.profile
                        else {}
                    ),
                    **({"AAA_BENCH_GC_THRESHOLD": args.gc_threshold} if args.gc_threshold else {}),
                    "PYTHONPATH": os.pathsep.join([str(HERE), str(ROOT)]),
                }
                env.pop(switches.ENV, None)
                if without is not None:
                    env[switches.ENV] = without
                proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
                if proc.returncode:
                    print(f"# {row} failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}", file=sys.stderr)
                    continue
                for line in proc.stderr.splitlines():  # (--census)
                    if line.startswith("#"):
                        print(line, file=sys.stderr)
                result = json.loads(proc.stdout.strip().splitlines()[-1])
                result["repetition"] = repetition
                results.setdefault(name, []).append(result)
                print(f"# {name}: { {k: v for k, v in result.items() if k not in ('runs', 'lags')} }", flush=True)
    print(
        f"\n# bench_concurrency: Python {platform.python_version()}, {os.cpu_count()} CPUs; "
        f"{args.runs} runs x {args.turns} turns x {args.latency:g} s model latency, started "
        f"together; durable PostgreSQL 15 and SQLite; each row {args.repeat} time(s), medians"
        f"{' (min-max)' if args.repeat > 1 else ''}"
    )
    out = []
    labels = {
        "inprocess-sqlite": "in-process bus, SQLite",
        "inprocess-pg-django": "in-process bus, PostgreSQL, Django store (before)",
        "inprocess-pg-nogroup": "in-process bus, PostgreSQL, async store, no group commit",
        "inprocess-pg": "in-process bus, PostgreSQL (async store, group commit)",
        "inprocess-pg-x2": "in-process bus, PostgreSQL, an engine in each of two processes, half the runs each",
        "inprocess-memory": "in-process bus, the memory store (no database: the engine's own work)",
        "celery": f"Celery, one worker -c {args.celery_concurrency} (prefork), PostgreSQL",
        "langgraph": f"LangGraph, AsyncPostgresSaver (pool {args.pool}), durability=sync",
    }

    def med(values: list[float]) -> float:
        return statistics.median(values)

    def spread(values: list[float], fmt: str) -> str:
        return f"{fmt.format(med(values))}" + (
            f" ({fmt.format(min(values))}-{fmt.format(max(values))})" if len(values) > 1 else ""
        )

    def percentile(r: dict, q: float) -> float:
        each = sorted(r["runs"])
        return each[min(int(len(each) * q), len(each) - 1)] / ideal

    def label(name: str) -> str:
        row, _, without = name.partition(" without ")
        return labels[row] + (f", without {without} (benchmarks/switches.py)" if without else "")

    turns_done = args.runs * args.turns  # model calls: a turn each
    for row, rs in results.items():
        out.append(
            [
                label(row),
                spread([r["wall"] for r in rs], "{:.2f} s"),
                f"{ideal:g} s",
                spread([r["wall"] / ideal for r in rs], "{:.2f}x"),
                f"{med([percentile(r, 0.5) for r in rs]):.2f}x / {med([percentile(r, 0.9) for r in rs]):.2f}x",
                f"{med([r['memory'] for r in rs]) / args.runs / 1024:.0f} KB",
                str(rs[0]["processes"]),
                f"{med([r['cpu'] for r in rs]):.1f} s" if "cpu" in rs[0] else "",
                f"{med([r['machine'] for r in rs]) / turns_done * 1000:.2f} ms",
            ]
        )
    print(
        table(
            [
                "row",
                "wall",
                "T x L",
                "wall / ideal",
                "a run / ideal (p50 / p90)",
                "memory per in-flight run",
                "processes",
                "process CPU",
                "machine CPU a turn",
            ],
            out,
        )
    )
    for row, rs in results.items():
        r = sorted(rs, key=lambda r: r["wall"])[len(rs) // 2]  # the repetition of the median wall
        parts = {k: med([x["parts"][k] / turns_done * 1000 for x in rs]) for k in r["parts"]}
        print(
            f"# {label(row)}: the machine's CPU a turn by process (ms, medians): "
            + ", ".join(f"{k} {v:.2f}" for k, v in parts.items())
        )
        if "gc" in r:
            gcs = [{int(k): v for k, v in x["gc"].items()} for x in rs]  # generation -> [passes, s, collected]
            print(
                f"# {label(row)}: the garbage collector {med([sum(v[1] for v in g.values()) for g in gcs]):.2f} s "
                f"during the load; {med([g[2][0] for g in gcs]):g} full collections, "
                f"{med([g[2][1] for g in gcs]):.2f} s (--gc {args.gc}"
                f"{', --gc-threshold ' + args.gc_threshold if args.gc_threshold else ''})"
            )
        if "lags" in r:
            print(
                f"# {label(row)}: where a run's time went (ms: median / p90 / max over the runs; "
                f"the median repetition):"
            )
            for name, (p50, p90, most) in r["lags"].items():
                print(f"#   {name:8s} {p50:8.1f} {p90:8.1f} {most:8.1f}")
        if "polls" in r:
            queries, answered = r["polls"]
            print(
                f"# {label(row)}: the waits' polls: {answered} in {queries} queries of which runs still go "
                f"(the median repetition)"
            )
        if "messages" in r:
            print(
                f"# {label(row)}: {med([x['messages'] / turns_done for x in rs]):.2f} messages through the "
                f"broker a turn (medians; the others delivered on the loop of the worker that appended them)"
            )
        if "groups" in r:
            print(
                f"# {label(row)}: {r['grouped']} appends in {r['groups']} group commits "
                f"(the others alone; {r['rolled_back']} groups rolled back and made again "
                f"alone); {r['connections']} connections opened (the median repetition)"
            )
    lg = {r["repetition"]: r for r in results.get("langgraph", [])}
    if lg:
        for row, rs in results.items():
            if row != "langgraph":
                pairs = [r["wall"] / lg[r["repetition"]]["wall"] for r in rs if r["repetition"] in lg]
                if pairs:
                    print(
                        f"# {label(row)}: {spread(pairs, '{:.2f}x')} LangGraph's wall time "
                        f"(each repetition against LangGraph's in the same one)"
                    )
    for name, rs in results.items():
        row, _, without = name.partition(" without ")
        shipped = {r["repetition"]: r for r in results.get(row, [])}
        if without and shipped:
            pairs = [r["wall"] / shipped[r["repetition"]]["wall"] for r in rs if r["repetition"] in shipped]
            cpus = [r["cpu"] / shipped[r["repetition"]]["cpu"] for r in rs if r["repetition"] in shipped]
            print(
                f"# {label(row)}: without {without} / as shipped, paired by repetition ({len(pairs)}): "
                f"wall {spread(pairs, '{:.3f}x')}, process CPU {spread(cpus, '{:.3f}x')}"
            )
    loads = [x for rs in results.values() for r in rs for x in r.get("load", [])]
    if loads:
        print(
            f"# load average (1 min) at the rows' starts and ends: median {med(loads):.1f}, "
            f"{min(loads):.1f}-{max(loads):.1f}, on {os.cpu_count()} CPUs"
        )
    print(f"# total {time.perf_counter() - started:.0f} s")


if __name__ == "__main__":
    main()
