"""A/B: the Django store's append of one event to a run's stream on PostgreSQL, as the
append function's call (migration 0009, what a connection that prepares nothing sends)
against the ``WITH stored AS (INSERT ...) UPDATE`` statement (what a connection that
prepares sends), on the same connection, in the same run.

    .venv/bin/python benchmarks/ab_append_call.py [--blocks 30] [--block 200]

Blocks of ``--block`` appends (``append_sync``, one event each, every one from the
store's hint: one statement, no query), the two shapes alternated and the order swapped
every block, each on a run of its own; and raw psycopg's transaction per event (BEGIN,
INSERT, COMMIT: ``bench_eventlog.py``'s "raw driver, sync") in the same rotation. The
statement shape is chosen by monkeypatching ``aaa_django.store.appends.prepares`` for
the statement's blocks (Django's connection prepares nothing either way, so its
statement goes unprepared). Prints the medians per append and
the call's time over the statement's (the median of the blocks' pairs).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_eventlog as be
from common import postgres, setup_django, workdir


def ab_appends(pg: dict, shapes: dict[str, dict[str, object]], blocks: int, size: int) -> None:
    """The harness of this A/B: ``append_sync`` of one event
    of a run's stream on Django's connection, in blocks of ``size``, for each of the two
    ``shapes`` (name -> the attributes of ``aaa_django.store.appends`` patched for its
    blocks: what the shape changes) and raw psycopg's transaction per event, the order
    rotated and swapped every block. Prints the medians per append, the first shape's
    time over the second's (the median of the blocks' pairs) and each against raw (rate
    over rate, as bench_eventlog's "vs raw")."""
    from aaa_django.store import DjangoEventStore, appends

    store = DjangoEventStore(using="postgres")
    made = [0]

    def block(shape: str, n: int) -> float:
        """``n`` appends of ``shape``; seconds per append."""
        if shape == "raw":
            rows = be.rows_of(be.events_for(f"raw-{time.perf_counter_ns()}", 0, n, plain=True))
            return be.raw_postgres(pg, rows, 1) / n
        made[0] += 1
        stream = f"run-{shape}-{made[0]}"
        store.append_sync([be.run_started(stream)])
        events = be.events_for(stream, 1, n)
        real = {name: getattr(appends, name) for name in shapes[shape]}
        for name, value in shapes[shape].items():
            setattr(appends, name, value)
        try:
            store.append_sync(events[:1])  # (the hint: from here one statement each)
            t0 = time.perf_counter()
            for e in events[1:]:
                store.append_sync([e])
            return (time.perf_counter() - t0) / (n - 1)
        finally:
            for name, value in real.items():
                setattr(appends, name, value)

    first, second = shapes
    names = [first, second, "raw"]
    times: dict[str, list[float]] = {s: [] for s in names}
    block(first, 50), block(second, 50)  # warm: connections, plans
    for i in range(blocks):
        order = names[i % 3 :] + names[: i % 3]
        for shape in order if i % 2 == 0 else order[::-1]:
            times[shape].append(block(shape, size))
    for shape in names:
        print(
            f"{shape:10s} {statistics.median(times[shape]) * 1000:.3f} ms an append "
            f"(p25 {statistics.quantiles(times[shape], n=4)[0] * 1000:.3f})"
        )
    ratio = statistics.median(a / b for a, b in zip(times[first], times[second]))
    print(f"{first} / {second}: {ratio:.3f}x (median of {blocks} blocks' pairs)")
    for shape in (first, second):
        r = statistics.median(raw / t for raw, t in zip(times["raw"], times[shape]))
        print(f"{shape} vs raw (bench_eventlog's 'vs raw', rate over rate): {r:.2f}x")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--blocks", type=int, default=30)
    ap.add_argument("--block", type=int, default=200)
    args = ap.parse_args()
    with workdir() as tmp, postgres(tmp) as pg:
        setup_django(tmp, pg)
        # Django's connection prepares nothing: the call as is; the statement's blocks
        # are told the connection prepares (its statement then goes, unprepared)
        ab_appends(pg, {"call": {}, "statement": {"prepares": lambda raw: True}}, args.blocks, args.block)


if __name__ == "__main__":
    main()
