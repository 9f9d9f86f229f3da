"""Where a Celery hop's time goes: timestamps inside the workers, and their breakdown.

    .venv/bin/python benchmarks/bench_celery.py --quick --trace /tmp/hops.jsonl
    .venv/bin/python benchmarks/trace_hops.py /tmp/hops.jsonl      # the breakdown again

With ``AAA_BENCH_TRACE=FILE`` in a worker's environment, ``celery_site`` imports this
module, which wraps a few functions of the worker (the delivery, the engine's
reaction and dispatch, the PostgreSQL append statement, the send) and Celery's task
signals with a timestamp each, appended to FILE as JSON lines (pid, label, time).
Wrapping costs a few microseconds per mark. The report takes the idle part of a
``bench_celery.py`` run (from the first bare hop to just after the last one: one
engine run at a time) and prints, for the bare no-op task and for ``aaa.deliver``:
the median of each segment between consecutive marks of one task, and the gap from
a task's send to the next task's start (the broker and the next worker's receipt).
"""

from __future__ import annotations

import collections
import functools
import json
import os
import statistics
import sys
import time

# -- in the workers ------------------------------------------------------------------------

_buf: list[tuple[int, str, float]] = []


def mark(label: str) -> None:
    _buf.append((os.getpid(), label, time.time()))
    if len(_buf) >= 200:
        flush()


def flush() -> None:
    with open(os.environ["AAA_BENCH_TRACE"], "a") as f:
        f.writelines(json.dumps(r) + "\n" for r in _buf)
    _buf.clear()


def _timed(owner, name: str, label: str) -> None:
    fn = getattr(owner, name)
    if hasattr(fn, "__wrapped__"):
        return
    if asyncio_iscoroutinefunction(fn):

        async def wrapper(*args, **kwargs):
            mark(f"{label}_start")
            try:
                return await fn(*args, **kwargs)
            finally:
                mark(f"{label}_end")
    else:

        def wrapper(*args, **kwargs):
            mark(f"{label}_start")
            try:
                return fn(*args, **kwargs)
            finally:
                mark(f"{label}_end")

    setattr(owner, name, functools.wraps(fn)(wrapper))


def asyncio_iscoroutinefunction(fn) -> bool:
    import inspect

    return inspect.iscoroutinefunction(fn)


def install() -> None:
    """Wrap the worker's functions (in a worker child, after the fork)."""
    import atexit

    from aaa_django.celery import bus, worker
    from aaa_django.runtime.engine import Engine
    from aaa_django.runtime.steps import Steps
    from aaa_django.store import appends

    if os.environ.get("AAA_BENCH_PROFILE"):  # cProfile of the deliveries, per worker child
        import cProfile

        profiler = cProfile.Profile()
        inner = worker.deliver_event

        count = [0]

        async def deliver_event(*args, **kwargs):
            profiler.enable()
            try:
                return await inner(*args, **kwargs)
            finally:
                profiler.disable()
                count[0] += 1
                if count[0] % 100 == 0:  # (a prefork child ends without atexit)
                    profiler.dump_stats(f"{os.environ['AAA_BENCH_PROFILE']}.{os.getpid()}")

        worker.deliver_event = deliver_event
    _timed(worker, "deliver_event", "loop")
    _timed(Engine, "react", "react")
    _timed(Engine, "dispatch", "disp")
    _timed(appends.StatementAppends, "_write_pg", "pg")
    _timed(bus.DistributedBus, "_send", "send")
    if os.environ.get("AAA_BENCH_TRACE_SQL"):
        from django.db.backends.utils import CursorWrapper

        _timed(CursorWrapper, "execute", "sql")
    if os.environ.get("AAA_BENCH_TRACE_FINE"):  # more marks, more overhead
        from aaa_django.llm.handler import LLMHandler
        from aaa_django.store import database as store
        from aaa_django.tools.handler import ToolHandler

        _timed(worker, "_accept", "accept")
        _timed(Steps, "algorithm_step", "algo")
        _timed(Engine, "append", "eappend")
        _timed(store.DjangoEventStore, "append_sync", "sappend")
        _timed(bus.DistributedBus, "publish", "publish")
        _timed(LLMHandler, "_handle", "llm")
        _timed(ToolHandler, "on_request", "tool")
    atexit.register(flush)


def connect() -> None:
    from celery.signals import (
        task_postrun,
        task_prerun,
        worker_process_init,
        worker_process_shutdown,
    )

    task_prerun.connect(lambda task=None, **kw: mark("pre:" + task.name), weak=False)
    task_postrun.connect(lambda task=None, **kw: mark("post:" + task.name), weak=False)
    worker_process_init.connect(lambda **kw: install(), weak=False)
    worker_process_shutdown.connect(lambda **kw: flush(), weak=False)


# -- the report ----------------------------------------------------------------------------


def report(path: str) -> str:
    recs = sorted((json.loads(line) for line in open(path)), key=lambda r: r[2])
    bare = [t for _, label, t in recs if label == "pre:bench.hop"]
    if not bare:
        return "trace: no bare hops recorded"
    start, end = min(bare) - 0.01, max(bare) + 0.15
    tasks, open_ = [], {}
    for pid, label, t in recs:
        if label.startswith("pre:"):
            open_[pid] = {"name": label[4:], "marks": [("pre", t)]}
        elif pid in open_:
            open_[pid]["marks"].append((label, t))
            if label.startswith("post:"):
                tasks.append(open_.pop(pid))
    idle = [k for k in tasks if start < k["marks"][0][1] < end]
    lines = []
    for name, sent in (("bench.hop", "post:bench.hop"), ("aaa.deliver", "send_end")):
        ks = sorted((k for k in idle if k["name"] == name), key=lambda k: k["marks"][0][1])
        segments = collections.defaultdict(list)
        for k in ks:
            m = k["marks"]
            for (a, ta), (b, tb) in zip(m, m[1:]):
                segments[f"{a} -> {b}".replace(":" + name, "")].append((tb - ta) * 1e3)
        lines.append(f"{name}: {len(ks)} tasks (idle part of the run)")
        for seg, values in sorted(segments.items(), key=lambda kv: -sum(kv[1])):
            lines.append(f"  {seg:28s} n={len(values):4d}  median {statistics.median(values):.3f} ms")
        gaps, hops = [], []
        for a, b in zip(ks, ks[1:]):
            begins = b["marks"][0][1]
            ends = [t for label, t in a["marks"] if label == sent]
            if ends and 0 < begins - ends[-1] < 0.01:
                gaps.append((begins - ends[-1]) * 1e3)
            if begins - a["marks"][0][1] < 0.01:
                hops.append((begins - a["marks"][0][1]) * 1e3)
        if gaps:
            lines.append(f"  {'send -> next task':28s} n={len(gaps):4d}  median {statistics.median(gaps):.3f} ms")
        if hops:
            lines.append(
                f"  {'task -> next task (a hop)':28s} n={len(hops):4d}  median {statistics.median(hops):.3f} ms"
            )
    return "\n".join(lines)


def delivery_report(path: str) -> str:
    """Per delivery (from ``loop_start`` to ``loop_end`` of one process, as
    ``profile_delivery.py --trace`` records them): the median of each segment between
    consecutive marks."""
    recs = sorted((json.loads(line) for line in open(path)), key=lambda r: r[2])
    segments = collections.defaultdict(list)
    marks: list[tuple[str, float]] = []
    for _, label, t in recs:
        if label == "loop_start":
            marks = []
        marks.append((label, t))
        if label == "loop_end":
            for (a, ta), (b, tb) in zip(marks, marks[1:]):
                segments[f"{a} -> {b}"].append((tb - ta) * 1e3)
    lines = ["parts of a delivery (median, ms)"]
    for seg, values in sorted(segments.items(), key=lambda kv: -sum(kv[1])):
        lines.append(f"  {seg:28s} n={len(values):5d}  {statistics.median(values):.3f}")
    return "\n".join(lines)


if __name__ == "__main__":
    print(report(sys.argv[1]))
