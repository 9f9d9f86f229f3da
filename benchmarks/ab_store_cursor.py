"""A/B: the Django store's append of one event to a run's stream on PostgreSQL, its
statement on the store's cursor (``rows.StoreCursor``: Django's error translation, no
wrapper chain) against the same statement through Django's cursor wrapper (what it was
sent through before, and still is where the site logs queries or wraps them), on the
same connection, in the same run.

    .venv/bin/python benchmarks/ab_store_cursor.py [--blocks 30] [--block 200]

Blocks of ``--block`` appends (``append_sync``, one event each, every one from the
store's hint: the append function's call, one round trip), the two cursors alternated
and the order rotated and swapped every block, each on a run of its own; and raw
psycopg's transaction per event (BEGIN, INSERT, COMMIT: ``bench_eventlog.py``'s "raw
driver, sync") in the same rotation. Django's wrapper is chosen by monkeypatching
``aaa_django.store.appends.cursor`` for its blocks. Prints the medians per append, the
store cursor's time over the wrapper's (the median of the blocks' pairs) and each
against raw (rate over rate, as bench_eventlog's "vs raw").
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import postgres, setup_django, workdir  # noqa: E402

import bench_eventlog as be  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--blocks", type=int, default=30)
    ap.add_argument("--block", type=int, default=200)
    args = ap.parse_args()
    with workdir() as tmp, postgres(tmp) as pg:
        setup_django(tmp, pg)
        from django.db.backends.postgresql.base import ServerBindingCursor

        from aaa_django.store import DjangoEventStore, appends

        store = DjangoEventStore(using="postgres")
        real = appends.cursor

        def wrapped(conn):
            """``rows.cursor`` as it was: the server-binding cursor in Django's wrapper."""
            conn.ensure_connection()
            conn.validate_thread_sharing()
            return conn.make_cursor(ServerBindingCursor(conn.connection))

        made = [0]

        def block(shape: str, n: int) -> float:
            """``n`` appends on ``shape``'s cursor; seconds per append."""
            if shape == "raw":
                rows = be.rows_of(be.events_for(f"raw-{time.perf_counter_ns()}", 0, n, plain=True))
                return be.raw_postgres(pg, rows, 1) / n
            made[0] += 1
            stream = f"run-{shape}-{made[0]}"
            store.append_sync([be.run_started(stream)])
            events = be.events_for(stream, 1, n)
            appends.cursor = wrapped if shape == "django" else real
            try:
                store.append_sync(events[:1])  # (the hint: from here one statement each)
                t0 = time.perf_counter()
                for e in events[1:]:
                    store.append_sync([e])
                return (time.perf_counter() - t0) / (n - 1)
            finally:
                appends.cursor = real

        shapes = ["store", "django", "raw"]
        times: dict[str, list[float]] = {s: [] for s in shapes}
        block("store", 50), block("django", 50)  # warm: connections, plans
        for i in range(args.blocks):
            order = shapes[i % 3:] + shapes[:i % 3]
            for shape in (order if i % 2 == 0 else order[::-1]):
                times[shape].append(block(shape, args.block))
        for shape in shapes:
            print(f"{shape:7s} {statistics.median(times[shape]) * 1000:.3f} ms an append "
                  f"(p25 {statistics.quantiles(times[shape], n=4)[0] * 1000:.3f})")
        ratio = statistics.median(s / d for s, d in zip(times["store"], times["django"]))
        print(f"store cursor / Django's wrapper: {ratio:.3f}x (median of {args.blocks} blocks' pairs)")
        for shape in ("store", "django"):
            r = statistics.median(raw / t for raw, t in zip(times["raw"], times[shape]))
            print(f"{shape} vs raw (bench_eventlog's 'vs raw', rate over rate): {r:.2f}x")


if __name__ == "__main__":
    main()
