"""Cluster benchmark: ToolLoop runs delivered by Celery workers, against bare Celery.

    .venv/bin/python benchmarks/bench_celery.py             # the reported run (a few minutes)
    .venv/bin/python benchmarks/bench_celery.py --quick     # 40 runs, shorter chains (~1 min when the machine is quiet)

It starts a durable PostgreSQL 15 (fsync on; or AAA_BENCH_PG_PORT, see common.py), a
Redis (the broker and the bus's coordination) and twice N Celery worker processes
(``-c 1`` prefork each, every queue; N with tracing on), all on loopback, and stops
them by PID.

Measured in the same run, on the same workers and broker:

- **bare hop**: a chain of no-op Celery tasks, each enqueueing the next (receive,
  do nothing, send) the way the engine sends its deliveries (the bus's
  ``FastPublisher``): the latency floor of one delivery, like with like. The same
  chain sent by ``app.send_task`` is printed for information.
- **engine hop**: 5-turn ToolLoop runs (fake model, no-op tool), one at a time on an
  idle cluster; the time from each run's ``aaa.run.started`` to its
  ``aaa.run.completed`` divided by the hops on its causal chain (every event of a
  ToolLoop run is on it: 20 hops for 5 turns). A round runs as many of them one
  after another as make the bare chain's length (100 hops: 5 runs), so both sides
  are measured over the same number of hops; the first run of a round, right after
  the bare chain (colder caches), is also shown on its own. One hop = read what is new
  in the run's log (the message carries it), fold, decide or call the handler, append
  (one durable PostgreSQL commit), enqueue after commit.
- **engine hop, tracing on**: the same runs on a second set of N workers
  (queues of their own) whose site has ``AAA["OTEL"]`` on and sets up the
  OpenTelemetry SDK in each pool process (``celery_site.trace_exports``: a
  ``BatchSpanProcessor`` and a ``PeriodicExportingMetricReader`` with the OTLP/HTTP
  exporters, to ``otlp_sink.py``, a receiver in a process of its own that reads every
  export and keeps only counts), started by an engine of this process with the same
  observer, so a run's trace context travels in its messages. A round's runs go in
  pairs, tracing off and on one right after the other, each first in turn; the on/off
  ratio is the median of the pairs'. Also the workers' CPU per engine hop of each set
  (the CPU-time clocks of the worker processes and their pools, less what the set
  spends idle meanwhile; on/off again the median of the pairs'), which a loaded
  machine moves less than wall time. The
  run fails unless every traced run arrived at the receiver as one trace. Tracing off
  is the engine every site builds (``build_engine``: the Django signals' observer,
  no receiver; no OpenTelemetry imported).
- **durable commit**: a one-row INSERT in autocommit on the same server: the fsync
  every engine hop waits for and a no-op task does not (the floor the disk sets).
- **throughput**: R runs of T turns started at once (runs/s, deliveries/s), next to
  the same number of bare no-op tasks enqueued at once (tasks/s).

The idle measurements are taken in rounds (a bare chain, the engine runs, a few
commits, again), so a machine that is busier at one moment than another moves them
all alike; a ratio is the median of the rounds' ratios.

Goals: the engine's hop within 2x the bare hop; tracing on within 1.2x of tracing off.
"""

from __future__ import annotations

import argparse
import asyncio
import ctypes
import os
import platform
import socket
import statistics
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from common import ROOT, descendants, free_port, ms, postgres, table, workdir  # noqa: E402

QUEUES = "aaa.algorithms,aaa.llm,aaa.tools,bench.hop"


@contextmanager
def redis_server(tmp: Path) -> Iterator[str]:
    port = free_port()
    proc = subprocess.Popen(
        [
            "redis-server",
            "--port",
            str(port),
            "--bind",
            "127.0.0.1",
            "--save",
            "",
            "--appendonly",
            "no",
            "--dir",
            str(tmp),
        ],
        stdout=subprocess.DEVNULL,
    )
    import redis

    url = f"redis://127.0.0.1:{port}/0"
    client = redis.Redis.from_url(url)
    for _ in range(200):
        try:
            client.ping()
            break
        except redis.ConnectionError:
            time.sleep(0.02)
    try:
        yield url
    finally:
        proc.terminate()
        proc.wait(10)


@contextmanager
def otlp_sink(tmp: Path) -> Iterator[dict]:
    """``otlp_sink.py`` on a free port, the OTLP/HTTP endpoint of the traced workers:
    ``{"url": ..., "taken": {"requests": ..., "bytes": ..., "spans": ..., "traces": ...}}``
    (what it took: once stopped)."""
    port = free_port()
    out_path = tmp / "otlp_sink.out"
    out = open(out_path, "wb")
    proc = subprocess.Popen([sys.executable, str(HERE / "otlp_sink.py"), str(port)], stdout=out)
    sink: dict = {"url": f"http://127.0.0.1:{port}", "taken": None}
    end = time.monotonic() + 30
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            break
        except OSError:
            if proc.poll() is not None or time.monotonic() > end:
                raise RuntimeError(f"otlp_sink.py did not start ({proc.poll()})") from None
            time.sleep(0.02)
    try:
        yield sink
    finally:
        proc.terminate()
        proc.wait(10)
        out.close()
        sink["taken"] = dict(zip(("requests", "bytes", "spans", "traces"), map(int, out_path.read_text().split())))


@contextmanager
def workers(
    count: int, env: dict, tmp: Path, *, concurrency: int = 1, queues: str = QUEUES, name: str = "bench"
) -> Iterator[list[subprocess.Popen]]:
    """``count`` worker commands (prefork, ``-c concurrency`` each) taking ``queues``,
    named ``name0@host``, ..."""
    procs = []
    for i in range(count):
        ready = tmp / f"{name}{i}.ready"
        log = open(tmp / f"{name}{i}.log", "wb")
        procs.append(
            (
                subprocess.Popen(
                    [
                        sys.executable,
                        "-m",
                        "celery",
                        "-A",
                        "celery_site",
                        "worker",
                        "-n",
                        f"{name}{i}@%h",
                        "-Q",
                        queues,
                        "-c",
                        str(concurrency),
                        "-P",
                        "prefork",
                        "-l",
                        "warning",
                        "--without-gossip",
                        "--without-mingle",
                        "--without-heartbeat",
                    ],
                    cwd=HERE,
                    env={**env, "AAA_BENCH_READY": str(ready)},
                    stdout=log,
                    stderr=subprocess.STDOUT,
                ),
                ready,
            )
        )
    try:
        for p, ready in procs:
            end = time.monotonic() + 60
            while not ready.exists():
                if p.poll() is not None or time.monotonic() > end:
                    raise RuntimeError((tmp / f"{name}0.log").read_text())
                time.sleep(0.05)
        yield [p for p, _ in procs]
    finally:
        for p, _ in procs:
            p.terminate()
        for p, _ in procs:
            try:
                p.wait(30)
            except subprocess.TimeoutExpired:
                p.kill()


# -- measurements ------------------------------------------------------------------------------


def bare_hop(app, r, hops: int, fast: bool | str = True) -> float:
    """Seconds per hop of a chain of ``hops`` no-op tasks, each sending the next as the
    engine sends (``fast``: the bus's ``FastPublisher``) or by ``send_task``."""
    key = f"hop-{uuid.uuid4().hex}"
    t0 = time.time()
    app.send_task("bench.hop", (hops - 1, key, fast), queue="bench.hop")
    while (end := r.get(key)) is None:
        time.sleep(0.002)
    return (float(end) - t0) / hops


def bare_throughput(app, r, tasks: int) -> float:
    """No-op tasks per second, ``tasks`` enqueued at once."""
    key = f"noop-{uuid.uuid4().hex}"
    t0 = time.time()
    with app.producer_or_acquire() as producer:
        for _ in range(tasks):
            app.send_task("bench.noop", (key,), queue="aaa.algorithms", producer=producer)
    while int(r.get(key) or 0) < tasks:
        time.sleep(0.005)
    return tasks / (time.time() - t0)


_libc = ctypes.CDLL(None, use_errno=True)


def cpu_seconds(pids: list[int]) -> float:
    """CPU time (user + system, all threads, to the nanosecond: each process's CPU-time
    clock, ``clock_getcpuclockid``) of processes ``pids`` and every process under them
    (a prefork worker's pool). Linux."""
    total, clock = 0.0, ctypes.c_int()
    for pid in (p for top in pids for p in descendants(top)):
        if _libc.clock_getcpuclockid(pid, ctypes.byref(clock)) != 0:
            continue  # gone
        try:
            total += time.clock_gettime(clock.value)
        except OSError:  # gone meanwhile
            continue
    return total


def chain_hops(events) -> int:
    """Hops on the causal chain from the completion back to the start."""
    by_id = {e.id: e for e in events}
    e, hops = events[-1], 0
    while e.causation in by_id:
        e, hops = by_id[e.causation], hops + 1
    return hops


async def start_runs(engine, count: int, turns: int):
    from celery_site import registry, script

    from aaa_django.algos import ToolLoop

    algo = ToolLoop(registry(), max_turns=turns + 1)
    return [await engine.start(algo, {"task": script(turns)}) for _ in range(count)]


async def engine_hop(engine, turns: int) -> tuple[float, int]:
    """Seconds of one run on an idle cluster, and the hops of its causal chain."""
    (run,) = await start_runs(engine, 1, turns)
    outcome = await run.result(timeout=60)
    assert outcome.outcome == "success", outcome
    events = await run.events()
    return (events[-1].time - events[0].time).total_seconds(), chain_hops(events)


def commit_latency(conn, count: int) -> float:
    """Median seconds of a durable one-row commit."""
    times = []
    for _ in range(count):
        t0 = time.perf_counter()
        conn.execute("INSERT INTO bench_commit (at) VALUES (now())")
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


async def load(engine, runs: int, turns: int) -> dict:
    started = await start_runs(engine, runs, turns)
    outcomes = await asyncio.gather(*(r.result(timeout=600) for r in started))
    assert {o.outcome for o in outcomes} == {"success"}, outcomes
    logs = [await r.events() for r in started]
    t0 = min(log[0].time for log in logs)
    t1 = max(log[-1].time for log in logs)
    seconds = (t1 - t0).total_seconds()
    events = sum(len(log) for log in logs)
    per_hop = [(log[-1].time - log[0].time).total_seconds() / chain_hops(log) for log in logs]
    return {
        "seconds": seconds,
        "runs/s": runs / seconds,
        "deliveries/s": events / seconds,
        "events": events,
        "hop_under_load": statistics.median(per_hop),
    }


def traced_engine(queues: dict[str, str]):
    """The engine this process starts the traced runs with: the site's engine on the
    traced workers' queues, with the OpenTelemetry observer as ``AAA["OTEL"]`` gives
    it (the process's SDK set up first), so a run's messages carry its trace."""
    from aaa_django.celery.bus import DistributedBus
    from aaa_django.observe.otel import OtelObserver
    from aaa_django.site.engines import build_engine

    engine = build_engine(bus=DistributedBus(queues=queues), poll_interval=0.25)
    engine.bus.carry(engine.observe(OtelObserver(engine)))
    return engine


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--runs", type=int, default=200)
    parser.add_argument("--turns", type=int, default=5)
    parser.add_argument("--workers", type=int, default=2, help="worker processes of each set")
    parser.add_argument(
        "--trace",
        metavar="FILE",
        help="timestamps inside the workers (tracing off) to FILE, and their breakdown (trace_hops.py)",
    )
    args = parser.parse_args()
    runs = 40 if args.quick else args.runs
    idle_rounds, chain = (8, 60) if args.quick else (25, 100)

    load_before = os.getloadavg()[0]
    os.environ.pop("AAA_BENCH_OTLP", None)  # this process's site: tracing off (see traced_engine)
    with workdir() as tmp, postgres(tmp) as pg, redis_server(tmp) as broker, otlp_sink(tmp) as sink:
        env = {
            **os.environ,
            "AAA_BENCH_PG_HOST": pg["host"],
            "AAA_BENCH_PG_PORT": str(pg["port"]),
            "AAA_BENCH_PG_NAME": "aaa_bench",
            "AAA_BENCH_REDIS": broker,
            "DJANGO_SETTINGS_MODULE": "celery_site",
            "PYTHONPATH": os.pathsep.join([str(HERE), str(ROOT)]),
        }
        traced_env = {**env, "AAA_BENCH_OTLP": sink["url"]}  # the second set: tracing on
        if args.trace:
            Path(args.trace).unlink(missing_ok=True)
            env["AAA_BENCH_TRACE"] = str(Path(args.trace).resolve())
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
        from django.core.management import call_command

        django.setup()
        call_command("migrate", verbosity=0)
        import redis
        from asgiref.sync import async_to_sync
        from celery_site import OTEL_QUEUES, app, trace_exports

        from aaa_django.site.engines import build_engine

        r = redis.Redis.from_url(broker)
        import psycopg

        probe = psycopg.connect(**pg, dbname="aaa_bench", autocommit=True)
        probe.execute("CREATE TABLE bench_commit (at timestamptz)")
        stop_tracing = trace_exports(sink["url"])  # this process starts the traced runs: its SDK too
        with (
            workers(args.workers, env, tmp) as off_procs,
            workers(args.workers, traced_env, tmp, name="traced", queues=",".join(OTEL_QUEUES.values())) as on_procs,
        ):
            pids = {"off": [p.pid for p in off_procs], "on": [p.pid for p in on_procs]}
            # each set's CPU seconds and wall seconds while its engine runs (busy) and while
            # the other set's does (idle: what the set spends doing nothing, to take off)
            cpu = {(kind, state): [0.0, 0.0] for kind in ("off", "on") for state in ("busy", "idle")}
            rounds: list[tuple[float, float, float]] = []  # bare hop, engine hop (tracing off), commit
            traced: list[float] = []  # the engine hop with tracing on, one a round
            pairs: list[float] = []  # a run's hop with tracing on / the one's beside it with tracing off
            cpu_pairs: list[dict] = []  # and each one's workers' CPU seconds, wall seconds and hops
            # the first run of the engine that went right after the bare chain, and that chain's hop
            firsts: dict[str, list[tuple[float, float]]] = {"off": [], "on": []}
            slow: list[float] = []  # bare chains sent by send_task (information)

            async def cluster_part():
                async with build_engine(poll_interval=0.25) as engine, traced_engine(OTEL_QUEUES) as on:
                    assert type(engine.bus).__name__ == "DistributedBus"
                    engines = {"off": engine, "on": on}
                    for _ in range(3):  # warm up every worker
                        await engine_hop(engine, args.turns)
                        await engine_hop(on, args.turns)
                    bare_hop(app, r, 50)
                    bare_hop(app, r, 50, fast=False)

                    async def timed_run(kind: str) -> tuple[float, int, float, float]:
                        """One run of ``kind``'s engine: its seconds and hops, and its workers'
                        CPU seconds and the wall seconds they were taken in."""
                        other = "on" if kind == "off" else "off"
                        t0, before = time.monotonic(), {k: cpu_seconds(p) for k, p in pids.items()}
                        seconds, hops = await engine_hop(engines[kind], args.turns)
                        wall = time.monotonic() - t0
                        used = {k: cpu_seconds(pids[k]) - before[k] for k in pids}
                        for k, state in ((kind, "busy"), (other, "idle")):
                            cpu[k, state][0] += used[k]
                            cpu[k, state][1] += wall
                        return seconds, hops, used[kind], wall

                    hops = 0
                    for i in range(idle_rounds):
                        bare = bare_hop(app, r, chain)
                        total = {"off": [0.0, 0], "on": [0.0, 0]}  # seconds and hops of the round's runs
                        j = 0
                        while total["off"][1] < chain:  # pairs of runs, until each made a bare chain's hops
                            order = ("off", "on") if (i + j) % 2 == 0 else ("on", "off")
                            j += 1
                            per_hop, used = {}, {}
                            for kind in order:  # one right after the other, each first in turn
                                seconds, hops, *used[kind] = await timed_run(kind)
                                per_hop[kind] = seconds / hops
                                used[kind].append(hops)
                                if not total["off"][1] and not total["on"][1]:  # right after the bare chain
                                    firsts[kind].append((per_hop[kind], bare))
                                total[kind][0] += seconds
                                total[kind][1] += hops
                            pairs.append(per_hop["on"] / per_hop["off"])
                            cpu_pairs.append(used)
                        rounds.append((bare, total["off"][0] / total["off"][1], commit_latency(probe, 20)))
                        traced.append(total["on"][0] / total["on"][1])
                        slow.append(bare_hop(app, r, chain, fast=False))
                    loaded = await load(engine, runs, args.turns)
                    return hops, loaded

            hops, loaded = async_to_sync(cluster_part)()
            stop_tracing()  # while the sink still takes the last export
            bare_tps = bare_throughput(app, r, loaded["events"])
        bare_hop_s = statistics.median(b for b, *_ in rounds)
        idle_hop_s = statistics.median(e for _, e, *_ in rounds)
        traced_s = statistics.median(traced)
        commit_s = statistics.median(c for *_, c in rounds)
        ratio = statistics.median(e / b for b, e, *_ in rounds)
        traced_ratio = statistics.median(t / b for t, (b, *_) in zip(traced, rounds))
        on_off = statistics.median(pairs)
        first_s = {kind: statistics.median(f for f, _ in fs) for kind, fs in firsts.items()}
        first_ratio = {kind: statistics.median(f / b for f, b in fs) for kind, fs in firsts.items()}
        own_ratio = statistics.median((e - c) / b for b, e, c in rounds)
        durability = ", ".join(
            f"{k}={probe.execute(f'SHOW {k}').fetchone()[0]}" for k in ("fsync", "synchronous_commit")
        )
        probe.close()
    traced_runs = 3 + idle_rounds * -(-chain // hops)  # the warm-up's and the rounds'
    if sink["taken"]["traces"] != traced_runs:
        raise RuntimeError(f"{traced_runs} runs with tracing on, {sink['taken']['traces']} traces exported")

    print(
        f"bench_celery: {platform.python_version()}, {os.cpu_count()} cores, "
        f"{args.workers} + {args.workers} worker processes (-c 1 prefork; tracing off + on), "
        f"PostgreSQL ({durability}), Redis broker; load average {load_before:.1f} before, "
        f"{os.getloadavg()[0]:.1f} after"
    )
    print()
    per_run = -(-chain // hops) * hops
    cpu_hop, idle_rate = {}, {}  # the workers' CPU per hop, less what they spend idle in the same time
    for kind in ("off", "on"):
        (busy, busy_wall), (idle, idle_wall) = cpu[kind, "busy"], cpu[kind, "idle"]
        idle_rate[kind] = idle / idle_wall
        cpu_hop[kind] = (busy - idle_rate[kind] * busy_wall) / (idle_rounds * per_run)

    def pair_cpu(used: dict, kind: str) -> float:
        seconds, wall, hops = used[kind]
        return (seconds - idle_rate[kind] * wall) / hops

    cpu_on_off = statistics.median(pair_cpu(u, "on") / pair_cpu(u, "off") for u in cpu_pairs)
    print(
        table(
            [f"per hop (idle cluster, {idle_rounds} rounds)", "median", "ratio"],
            [
                [
                    f"bare Celery no-op hop (chains of {chain}; sent as the engine sends: FastPublisher)",
                    ms(bare_hop_s),
                    "1.00x",
                ],
                [
                    "  the same chain sent by send_task (information)",
                    ms(statistics.median(slow)),
                    f"{statistics.median(s / b for s, (b, *_) in zip(slow, rounds)):.2f}x",
                ],
                [
                    f"engine hop, tracing off (ToolLoop, {args.turns} turns = {hops} hops; runs one after another, "
                    f"{per_run} hops a round)",
                    ms(idle_hop_s),
                    f"{ratio:.2f}x",
                ],
                [
                    "  the first run of a round alone (rounds where it went right after the bare chain)",
                    ms(first_s["off"]),
                    f"{first_ratio['off']:.2f}x",
                ],
                [
                    "engine hop, tracing on (OpenTelemetry SDK, batched OTLP/HTTP export; its own workers)",
                    ms(traced_s),
                    f"{traced_ratio:.2f}x",
                ],
                [
                    "  the first run of a round alone (rounds where it went right after the bare chain)",
                    ms(first_s["on"]),
                    f"{first_ratio['on']:.2f}x",
                ],
                [
                    f"  tracing on / tracing off (median of {len(pairs)} pairs of runs, one right after the other)",
                    "",
                    f"{on_off:.2f}x",
                ],
                [
                    f"workers' CPU per engine hop, tracing off (all rounds; process and pool, less idle: "
                    f"{idle_rate['off'] * 1e3:.0f} ms/s)",
                    ms(cpu_hop["off"]),
                    "",
                ],
                [
                    f"  tracing on (less idle: {idle_rate['on'] * 1e3:.0f} ms/s); on / off: median of the pairs' ratios",
                    ms(cpu_hop["on"]),
                    f"{cpu_on_off:.2f}x",
                ],
                ["PostgreSQL durable commit (one per engine hop)", ms(commit_s), f"{commit_s / bare_hop_s:.2f}x"],
                [
                    "engine hop less its commit (the engine's own cost; tracing off)",
                    ms(idle_hop_s - commit_s),
                    f"{own_ratio:.2f}x",
                ],
            ],
        )
    )
    print()
    print(
        table(
            ["throughput (tracing off)", "value"],
            [
                [f"{runs} runs of {args.turns} turns started at once", f"{loaded['seconds']:.2f} s"],
                ["runs/s", f"{loaded['runs/s']:.1f}"],
                ["engine deliveries/s (one per event)", f"{loaded['deliveries/s']:.0f}"],
                [f"bare no-op tasks/s ({loaded['events']} at once)", f"{bare_tps:.0f}"],
                ["engine hop under that load (median per run)", ms(loaded["hop_under_load"])],
            ],
        )
    )
    print()
    if args.trace:
        from trace_hops import report

        print(report(args.trace))
        print()
    print(
        f"tracing on: {traced_runs} runs, {sink['taken']['traces']} traces of {sink['taken']['spans']} spans "
        f"exported in {sink['taken']['requests']} OTLP/HTTP requests ({sink['taken']['bytes'] / 1e6:.1f} MB)"
    )
    print(
        f"goal: engine hop <= 2x bare hop: {ratio:.2f}x -> {'met' if ratio <= 2 else 'NOT met'}"
        f" (less the durable commit: {own_ratio:.2f}x)"
    )
    print(
        f"goal: tracing on <= 1.2x tracing off: {on_off:.2f}x ({on_off - 1:+.1%}) -> "
        f"{'met' if on_off <= 1.2 else 'NOT met'} (the workers' CPU per hop: "
        f"{cpu_on_off:.2f}x); tracing off is the engine every site builds "
        "(the signals' observer alone): against no observer at all see bench_observe.py"
    )


if __name__ == "__main__":
    main()
