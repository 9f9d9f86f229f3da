"""What waking event streams costs an append: no NOTIFY, a NOTIFY
trigger on the event table, and the store's NOTIFY after the commit from a thread (what ships).

    .venv/bin/python benchmarks/bench_notify.py             # the reported run (~3-6 minutes)
    .venv/bin/python benchmarks/bench_notify.py --quick     # fewer rounds (~1 minute)

On one durable PostgreSQL (fsync on; ``benchmarks/common.py``), migrated, the same
appends through ``DjangoEventStore.append_sync`` (~320-byte JSON data, a stream per
appender), one connection LISTENing and draining its notifications on a thread (what
a web process serving event streams has), with

- *none*: nothing notifies (``wakeups.notify`` replaced by a no-op): the baseline;
- *trigger*: a statement-level ``AFTER INSERT`` trigger calls ``pg_notify`` once per
  stream inside the appending transaction (the design the store avoids);
- *notifier*: the store's ``wakeups.notify`` (what ships): after the append's commit
  it hands the stream to the process's notifier thread, which sends what came in
  meanwhile in one statement, its own transaction, which does not wait for the disk,

taken in turns each round (so what else the machine does weighs on all three alike):

1. *1 event*: one event per append, one after another: median latency of an append.
2. *50 events*: a batch of 50 in one append (one notification).
3. *N appenders*: N threads, each appending one event per transaction to its own
   stream at once: appends per second. NOTIFY takes a database-wide lock from its
   queueing until the end of its transaction's commit, so appends that notify inside
   their transaction queue behind one another's fsync: this is where a trigger costs.

Ratios: each mode over *none*, the medians of the rounds (latency: > 1 is slower;
throughput: < 1 is slower).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import PG_DB, postgres, setup_django, table, workdir

MODES = ("none", "trigger", "notifier")
TRIGGER = """
    CREATE FUNCTION bench_notify() RETURNS trigger AS $$
    BEGIN
        PERFORM pg_notify('aaa_events', s.stream) FROM (SELECT DISTINCT stream FROM touched) AS s;
        RETURN NULL;
    END $$ LANGUAGE plpgsql;
    CREATE TRIGGER bench_notify AFTER INSERT ON aaa_event REFERENCING NEW TABLE AS touched
        FOR EACH STATEMENT EXECUTE FUNCTION bench_notify();
    ALTER TABLE aaa_event DISABLE TRIGGER bench_notify"""
DATA = {"text": "x" * 280, "n": 1}  # ~320 bytes as JSON


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--appenders", type=int, default=8)
    args = parser.parse_args()
    rounds, per_round, batches, each = (3, 50, 5, 20) if args.quick else (7, 200, 20, 50)

    with workdir() as tmp, postgres(tmp) as pg:
        setup_django(tmp, pg)
        import psycopg
        from django.db import connections

        from aaa_django.events import Event, new_id
        from aaa_django.store import DjangoEventStore, wakeups

        store = DjangoEventStore("postgres")
        admin = psycopg.connect(**pg, dbname=PG_DB, autocommit=True)
        settings = dict(
            admin.execute(
                "SELECT name, setting FROM pg_settings WHERE name IN ('fsync', 'synchronous_commit', 'server_version')"
            ).fetchall()
        )
        admin.execute(TRIGGER)
        shipped = wakeups.notify
        print(
            f"PostgreSQL {settings['server_version']}, fsync={settings['fsync']}, "
            f"synchronous_commit={settings['synchronous_commit']}; "
            f"{rounds} rounds, {args.appenders} concurrent appenders"
        )
        counter = iter(range(10**9))

        def events(stream: str, n: int) -> list[Event]:
            return [Event(id=new_id(), stream=stream, type="bench.e", data=DATA) for _ in range(n)]

        def one_by_one() -> float:
            stream = f"s{next(counter)}"
            times = []
            for _ in range(per_round):
                batch = events(stream, 1)
                t0 = time.perf_counter()
                store.append_sync(batch)
                times.append(time.perf_counter() - t0)
            return statistics.median(times)

        def fifty() -> float:
            stream = f"s{next(counter)}"
            times = []
            for _ in range(batches):
                batch = events(stream, 50)
                t0 = time.perf_counter()
                store.append_sync(batch)
                times.append(time.perf_counter() - t0)
            return statistics.median(times)

        def concurrent() -> float:
            streams = [f"s{next(counter)}" for _ in range(args.appenders)]
            start = threading.Barrier(args.appenders + 1)

            def work(stream: str) -> None:
                batches = [events(stream, 1) for _ in range(each)]
                store.append_sync(batches.pop())  # open the connection before the clock
                start.wait()
                for batch in batches:
                    store.append_sync(batch)
                connections.close_all()

            threads = [threading.Thread(target=work, args=(s,)) for s in streams]
            for t in threads:
                t.start()
            start.wait()
            t0 = time.perf_counter()
            for t in threads:
                t.join()
            return args.appenders * (each - 1) / (time.perf_counter() - t0)

        def set_mode(mode: str) -> None:
            verb = "ENABLE" if mode == "trigger" else "DISABLE"
            admin.execute(f"ALTER TABLE aaa_event {verb} TRIGGER bench_notify")
            wakeups.notify = shipped if mode == "notifier" else (lambda using, streams: None)

        results: dict[str, dict[str, list[float]]] = {m: {"1": [], "50": [], "N": []} for m in MODES}
        listening = Listening(pg)
        try:
            for r in range(rounds):
                for mode in MODES if r % 2 == 0 else tuple(reversed(MODES)):
                    set_mode(mode)
                    results[mode]["1"].append(one_by_one())
                    results[mode]["50"].append(fifty())
                    results[mode]["N"].append(concurrent())
                print(f"  round {r + 1}/{rounds} done", flush=True)
        finally:
            heard = listening.stop()
            set_mode("notifier")
            admin.close()

        med = {m: {k: statistics.median(v) for k, v in results[m].items()} for m in MODES}
        rows = []
        for mode in MODES:
            rows.append(
                [mode, f"{med[mode]['1'] * 1000:.3f} ms", f"{med[mode]['50'] * 1000:.2f} ms", f"{med[mode]['N']:.0f}/s"]
            )
        for mode in MODES[1:]:
            rows.append(
                [
                    f"{mode} / none",
                    f"{med[mode]['1'] / med['none']['1']:.2f}x",
                    f"{med[mode]['50'] / med['none']['50']:.2f}x",
                    f"{med[mode]['N'] / med['none']['N']:.2f}x",
                ]
            )
        print()
        print(
            table(
                ["notify", "1 event (latency)", "50 events (latency)", f"{args.appenders} appenders (appends/s)"], rows
            )
        )
        print(f"\nnotifications the listener heard: {heard}")


class Listening:
    """A connection LISTENing on the events' channel, draining on a thread."""

    def __init__(self, pg: dict) -> None:
        import psycopg

        from aaa_django.store.wakeups import CHANNEL

        self.conn = psycopg.connect(**pg, dbname=PG_DB, autocommit=True)
        self.conn.execute(f"LISTEN {CHANNEL}")
        self.count = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._drain, daemon=True)
        self._thread.start()

    def _drain(self) -> None:
        while not self._stop.is_set():
            for _ in self.conn.notifies(timeout=0.2):
                self.count += 1

    def stop(self) -> int:
        self._stop.set()
        self._thread.join()
        self.conn.close()
        return self.count


if __name__ == "__main__":
    main()
