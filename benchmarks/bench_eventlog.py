"""Event log benchmark: projection reads at 1k/10k/50k events, and appends/s vs raw.

    .venv/bin/python benchmarks/bench_eventlog.py            # the reported run (~2-3 min)
    .venv/bin/python benchmarks/bench_eventlog.py --quick    # 1k and 5k, fewer repeats
    .venv/bin/python benchmarks/bench_eventlog.py --no-postgres
    .venv/bin/python benchmarks/bench_eventlog.py --only snapshot   # one part (reads, appends, snapshot)

Reads: one stream of N events (tool-loop event types, ~320-byte JSON data each), a
tool-loop projection with snapshots every 64 events, read through
``DjangoEventStore`` from inside an asyncio loop as the engine does:

- raw read:       the floor of a whole-log read: the raw driver (psycopg, sqlite3) reads
                  the stream's rows in one query and ``json.loads`` each row's data;
- whole log:      ``fold(projection, store, stream)``, the reference (no snapshot, no holder),
                  each right after a raw read of the same stream (whole/raw: the median of
                  those pairs' ratios; goal: close to 1);
- snapshot+tail:  ``Projection.load`` from a snapshot 32 events (every/2) behind the head;
- warm holder:    ``Projection.load`` with a warm ``FoldCache``, 3 events new since the
                  previous read (the steady state of a running run);
- self-check:     what one self-check costs (a whole-log fold of the same view), measured
                  inline; by default it runs in a background task beside the read
                  that makes it due, so no read waits for it.

Appends: events/s, 1 event per call and batches of 50, one transaction per call, of
the same rows into the same table (its triggers included), four ways:

- raw driver, sync:   psycopg / sqlite3 called directly: json.dumps of each row's data
                      (writing an event means serialising it), BEGIN, INSERT, COMMIT,
                      nothing else: no validation, no head read, no id check, no retry;
- raw driver, async:  the same from async code, as async code calls the driver: psycopg's
                      ``AsyncConnection`` on the event loop; sqlite3 on a thread of its
                      own (as aiosqlite does), one hop per transaction;
- append_sync:        ``DjangoEventStore.append_sync`` (as a Celery task calls it),
                      compared with raw driver, sync;
- append (async):     ``DjangoEventStore.append`` awaited (a hop to Django's
                      thread-sensitive executor), compared with raw driver, async;
- PgEventStore append (PostgreSQL): ``PgEventStore.append`` awaited, the engine's
                      store on PostgreSQL (psycopg's async connections, no hop);
- SqliteEventStore append (SQLite): ``SqliteEventStore.append`` awaited, the
                      engine's store on SQLite (its own sqlite3 connection on a
                      thread of its own, as raw driver, async).

The store's common append on PostgreSQL is one autocommit statement (it remembers the
stream's head from its previous append), where raw psycopg's transaction per call is
three round trips (BEGIN, INSERT, COMMIT); so the table can show the store ahead of
"raw". The line under it compares append_sync with raw psycopg's fewest round trips
(autocommit, one INSERT statement per call) for information.

Goal: every store row >= 0.5x its raw row. The rows above append to streams that are
not runs' (``bench.`` types: no run index row). The same appends on a run's stream (it
starts with ``aaa.run.started``, untimed, so every append also folds its events into
the run's index row, as an agent run's appends do) are rows more; goal >= 0.5x raw too.

Snapshot + 50 events: a state loaded from its snapshot and the 50 events after it
(``Projection.load``, no holder) against eventsourcing's ``repository.get`` of an
aggregate with a snapshot 50 events behind, on the same server (when eventsourcing
is installed: ``requirements/bench.txt``), each read right before a peer read. Ours
through the store the engine uses there (``site_store``: ``PgEventStore`` on
PostgreSQL), and on PostgreSQL through ``DjangoEventStore`` too. Goal: <= 0.5x its
time, both databases.

Durability: PostgreSQL with fsync, synchronous_commit and full_page_writes on (a
cluster this script starts, or AAA_BENCH_PG_PORT); SQLite in WAL mode with
synchronous=FULL. Medians of repeats; compare ratios within one run, not across
machines.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import platform
import sqlite3
import statistics
import sys
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import (
    PG_UNPREPARED,
    SQLITE_PRAGMAS,
    ms,
    postgres,
    setup_django,
    table,
    wal_lsn,
    workdir,
)

EVERY = 64
TAIL = EVERY // 2
NEW_PER_READ = 3
TYPES = ["aaa.llm.requested", "aaa.llm.completed", "aaa.tool.requested", "aaa.tool.completed"]


def payload(i: int) -> dict:
    """~320 bytes of JSON, shaped like a tool-loop event's data."""
    return {
        "call_id": f"call_{i:08d}",
        "name": "search_documents",
        "tag": f"turn-{i // 4}",
        "usage": {"input_tokens": 1200 + i % 97, "output_tokens": 80 + i % 13, "cached": 1024},
        "cost": round(0.000123 * (i % 50 + 1), 6),
        "model": "gpt-4o-mini-2024-07-18",
        "args": {"query": "quarterly revenue by region", "top_k": 8, "filters": ["2026", "emea"]},
        "status": "ok",
        "note": "x" * 52,
    }


def events_for(stream: str, start: int, n: int, *, plain: bool = False):
    """Events ``start`` to ``start + n`` of a run's stream (the runtime's types; the
    first, at 0, its start: the store refuses anything else first), or (``plain``)
    of a stream that is not a run's (the same with ``bench.`` types, no start)."""
    from aaa_django.events import Event

    if plain:
        return [
            Event.new(stream, "bench." + TYPES[i % 4].removeprefix("aaa."), payload(i)) for i in range(start, start + n)
        ]
    return [
        Event.new(stream, "aaa.run.started" if i == 0 else TYPES[i % 4], payload(i)) for i in range(start, start + n)
    ]


def loop_projection():
    from pydantic import BaseModel, Field

    from aaa_django.events import Projection

    class Loop(BaseModel):
        request_id: str = ""
        turns: int = 0
        tool_calls: int = 0
        pending: list[str] = Field(default_factory=list)
        tokens: int = 0
        cost: float = 0.0

    def apply(s: Loop, e) -> Loop:
        t = e.type
        if t == "aaa.llm.requested":
            s.request_id = e.id
        elif t == "aaa.llm.completed":
            s.turns += 1
            u = e.data.get("usage", {})
            s.tokens += u.get("input_tokens", 0) + u.get("output_tokens", 0)
            s.cost += e.data.get("cost", 0.0)
        elif t == "aaa.tool.requested":
            s.pending.append(e.data["call_id"])
        elif t == "aaa.tool.completed":
            s.tool_calls += 1
            s.pending = s.pending[-8:]
        return s

    return Projection(Loop, apply, name="bench.loop", version=1, state_type=Loop, every=EVERY)


# --- reads --------------------------------------------------------------------------


RAW_READ = (
    "SELECT id, stream, seq, type, data, causation, time, blobs, tenant FROM aaa_event WHERE stream = {p} ORDER BY seq"
)


def raw_reader(label: str, pg: dict | None, sqlite_path: str) -> Callable[[str], int]:
    """The floor of a whole-log read: the raw driver's rows of a stream in one query
    (its own types: psycopg parses the times and the blobs' jsonb, sqlite3 leaves
    text) and ``json.loads`` of each row's data; returns the number of rows."""
    if label == "PostgreSQL":
        import psycopg

        conn = psycopg.connect(**pg, dbname="aaa_bench", autocommit=True)
        sql = RAW_READ.format(p="%s")
    else:
        conn = sqlite3.connect(sqlite_path)
        sql = RAW_READ.format(p="?")

    def read(stream: str) -> int:
        rows = conn.execute(sql, [stream]).fetchall()
        loads = json.loads
        for r in rows:
            loads(r[4])
        return len(rows)

    return read


async def bench_reads(alias: str, sizes: list[int], repeats: dict, raw: Callable[[str], int]) -> dict[int, dict]:
    """Read timings per stream size. The fast reads go round-robin over the sizes, so
    load from elsewhere on the machine hits every size alike (the goals are ratios).
    Each whole-log fold comes right after a raw read of the same stream (``raw``)."""
    from aaa_django.events import FoldCache, Snapshot, fold
    from aaa_django.store import DjangoEventStore

    store = DjangoEventStore(using=alias)
    p = loop_projection()
    out: dict[int, dict] = {n: {} for n in sizes}
    states = {}
    for n in sizes:
        stream = f"read-{n}"
        for start in range(0, n, 1000):
            await store.append(events_for(stream, start, min(1000, n - start)))
        times, raws = [], []
        for _ in range(repeats["whole"]):
            t0 = time.perf_counter()
            assert raw(stream) == n
            raws.append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            states[n] = await fold(p, store, stream)
            times.append(time.perf_counter() - t0)
        out[n]["whole"] = statistics.median(times)
        out[n]["raw"] = statistics.median(raws)
        out[n]["whole/raw"] = statistics.median(w / r for w, r in zip(times, raws))
        # A snapshot every/2 events behind the head, as a reader finds one on average.
        events = await store.read(stream)
        base = events[n - TAIL - 1]
        await store.save_snapshot(
            Snapshot(stream, p.name, p.version, base.seq, base.id, p.dump(p.fold(events[: n - TAIL])))
        )

    snap: dict[int, list[float]] = {n: [] for n in sizes}
    for _ in range(repeats["fast"]):
        for n in sizes:
            t0 = time.perf_counter()
            info = await p.load_info(store, f"read-{n}")
            snap[n].append(time.perf_counter() - t0)
            assert (info.source, info.folded) == ("snapshot", TAIL), info
            assert p.same(info.state, states[n])

    caches = {n: FoldCache(check_every=0) for n in sizes}  # steady state: no self-check
    for n in sizes:
        await p.load_info(store, f"read-{n}", cache=caches[n])
    holder: dict[int, list[float]] = {n: [] for n in sizes}
    for i in range(repeats["fast"]):
        for n in sizes:
            await store.append(events_for(f"read-{n}", n + i * NEW_PER_READ, NEW_PER_READ))
            t0 = time.perf_counter()
            info = await p.load_info(store, f"read-{n}", cache=caches[n])
            holder[n].append(time.perf_counter() - t0)
            assert (info.source, info.folded) == ("cache", NEW_PER_READ), info

    for n in sizes:
        # The cost of one self-check, measured inline (by default it runs in a task
        # beside the read, so the read that triggers it costs what a holder read costs).
        check_cache = FoldCache(check_every=1, background=False)
        checks = []
        for _ in range(repeats["check"]):
            check_cache.reset()
            await p.load_info(store, f"read-{n}", cache=check_cache)
            t0 = time.perf_counter()
            await p.load_info(store, f"read-{n}", cache=check_cache)
            checks.append(time.perf_counter() - t0)
        assert check_cache.checks == repeats["check"] and check_cache.resets == 0
        out[n].update(
            snapshot=statistics.median(snap[n]), holder=statistics.median(holder[n]), check=statistics.median(checks)
        )
    return out


# --- appends -----------------------------------------------------------------------------


def rows_of(events) -> list[tuple]:
    # The data stays a dict: serialising it is part of writing an event, so the raw
    # side encodes it (plain json.dumps, no checks) inside its timed loop.
    return [(e.id, e.stream, i, e.type, e.data, None, e.time, "[]", None) for i, e in enumerate(events, start=1)]


def encoded(rows: list[tuple]) -> list[tuple]:
    return [r[:4] + (json.dumps(r[4]),) + r[5:] for r in rows]


INSERT = (
    "INSERT INTO aaa_event (id, stream, seq, type, data, causation, time, blobs, tenant) "
    "VALUES ({p}, {p}, {p}, {p}, {p}, {p}, {p}, {p}, {p})"
)
SQLITE_INSERT = INSERT.format(p="?")


def raw_postgres(pg: dict, rows: list[tuple], batch: int) -> float:
    import psycopg

    with psycopg.connect(**pg, dbname="aaa_bench") as conn, conn.cursor() as cur:
        sql = INSERT.format(p="%s")
        t0 = time.perf_counter()
        for i in range(0, len(rows), batch):
            if batch == 1:
                cur.execute(sql, encoded(rows[i : i + 1])[0])
            else:
                cur.executemany(sql, encoded(rows[i : i + batch]))
            conn.commit()
        return time.perf_counter() - t0


def raw_postgres_floor(pg: dict, rows: list[tuple], batch: int) -> float:
    """The fewest round trips raw psycopg can take: autocommit, one INSERT statement
    per call (several rows in one VALUES list), so each call is one round trip and
    one commit. Information: the goal's baseline is a transaction per call."""
    import psycopg

    with psycopg.connect(**pg, dbname="aaa_bench", autocommit=True) as conn, conn.cursor() as cur:
        row = "(" + ", ".join(["%s"] * 9) + ")"
        t0 = time.perf_counter()
        for i in range(0, len(rows), batch):
            chunk = encoded(rows[i : i + batch])
            cur.execute(
                INSERT.split(" VALUES ")[0] + " VALUES " + ", ".join([row] * len(chunk)), [v for r in chunk for v in r]
            )
        return time.perf_counter() - t0


async def raw_postgres_async(pg: dict, rows: list[tuple], batch: int) -> float:
    """``raw_postgres`` as async code writes it: psycopg's ``AsyncConnection``, on the
    event loop (no thread)."""
    import psycopg

    async with await psycopg.AsyncConnection.connect(**pg, dbname="aaa_bench") as conn, conn.cursor() as cur:
        sql = INSERT.format(p="%s")
        t0 = time.perf_counter()
        for i in range(0, len(rows), batch):
            if batch == 1:
                await cur.execute(sql, encoded(rows[i : i + 1])[0])
            else:
                await cur.executemany(sql, encoded(rows[i : i + batch]))
            await conn.commit()
        return time.perf_counter() - t0


def sqlite_rows(rows: list[tuple]) -> list[tuple]:
    # Django's SQLite backend stores an aware datetime as naive UTC text.
    return [r[:6] + (r[6].astimezone(UTC).replace(tzinfo=None).isoformat(" "),) + r[7:] for r in rows]


def sqlite_connect(path: str) -> sqlite3.Connection:
    conn = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    conn.executescript(SQLITE_PRAGMAS)
    return conn


def sqlite_insert(conn: sqlite3.Connection, rows: list[tuple]) -> None:
    """One transaction: the rows' data encoded, inserted, committed."""
    conn.execute("BEGIN IMMEDIATE")
    if len(rows) == 1:
        conn.execute(SQLITE_INSERT, encoded(rows)[0])
    else:
        conn.executemany(SQLITE_INSERT, encoded(rows))
    conn.execute("COMMIT")


def raw_sqlite(path: str, rows: list[tuple], batch: int) -> float:
    rows = sqlite_rows(rows)
    conn = sqlite_connect(path)
    try:
        t0 = time.perf_counter()
        for i in range(0, len(rows), batch):
            sqlite_insert(conn, rows[i : i + batch])
        return time.perf_counter() - t0
    finally:
        conn.close()


async def raw_sqlite_async(path: str, rows: list[tuple], batch: int) -> float:
    """``raw_sqlite`` as async code calls a blocking driver: on a thread of its own (as
    aiosqlite does, one per connection), here one hop per transaction (aiosqlite makes
    one per statement)."""
    rows = sqlite_rows(rows)
    loop = asyncio.get_running_loop()
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="raw-sqlite") as thread:
        conn = await loop.run_in_executor(thread, sqlite_connect, path)
        try:
            t0 = time.perf_counter()
            for i in range(0, len(rows), batch):
                await loop.run_in_executor(thread, sqlite_insert, conn, rows[i : i + batch])
            return time.perf_counter() - t0
        finally:
            await loop.run_in_executor(thread, conn.close)


#: the rows of the append table: (how, the raw row it is compared with)
#: PostgreSQL: batch -> append_sync / the one-statement floor (raw_postgres_floor)
FLOOR: dict[int, float] = {}

HOWS = {
    "raw driver, sync": None,
    "raw driver, async": None,
    "append_sync": "raw driver, sync",
    "append (async)": "raw driver, async",
    # a run's stream: every append also folds the events into the run's index row
    "append_sync, a run's stream": "raw driver, sync",
    "append (async), a run's stream": "raw driver, async",
    # the site's store (``site_store``, what the engine awaits): on PostgreSQL
    # PgEventStore (its own psycopg connections), on SQLite SqliteEventStore (its own
    # sqlite3 connection, on a thread of its own)
    "PgEventStore append": "raw driver, async",
    "PgEventStore append, a run's stream": "raw driver, async",
    "SqliteEventStore append": "raw driver, async",
    "SqliteEventStore append, a run's stream": "raw driver, async",
}


def run_started(stream: str):
    """A run's first event (its index row is made with it)."""
    from aaa_django.events import Event

    return Event.new(
        stream,
        "aaa.run.started",
        {
            "algorithm": "aaa.algos.ToolLoop",
            "config": {},
            "input": {"task": "bench"},
            "budget": None,
            "deadline": None,
            "parent": None,
            "owner": None,
        },
    )


def bench_appends(alias: str, label: str, pg: dict | None, sqlite_path: str, plan: dict, runs: int) -> list:
    from aaa_django.store import DjangoEventStore
    from aaa_django.store.postgres import PgEventStore
    from aaa_django.store.sqlite import SqliteEventStore

    store = DjangoEventStore(using=alias)
    site = "PgEventStore" if label == "PostgreSQL" else "SqliteEventStore"
    sitestore = PgEventStore(using=alias) if label == "PostgreSQL" else SqliteEventStore(alias)
    hows = [h for h in HOWS if not h.endswith("Store append") and "Store append," not in h or h.startswith(site)]
    results = []
    counter = iter(range(10**6))
    for batch, total in plan.items():
        rates: dict[str, list[float]] = {how: [] for how in hows}
        for _ in range(runs):
            # Each store row right after its raw row.
            rows = rows_of(events_for(f"raw-{next(counter)}", 0, total, plain=True))
            secs = raw_postgres(pg, rows, batch) if label == "PostgreSQL" else raw_sqlite(sqlite_path, rows, batch)
            rates["raw driver, sync"].append(total / secs)

            events = events_for(f"sync-{next(counter)}", 0, total, plain=True)
            t0 = time.perf_counter()
            for i in range(0, total, batch):
                store.append_sync(events[i : i + batch])
            secs = time.perf_counter() - t0
            rates["append_sync"].append(total / secs)

            rows = rows_of(events_for(f"raw-async-{next(counter)}", 0, total, plain=True))
            raw_async = (
                raw_postgres_async(pg, rows, batch)
                if label == "PostgreSQL"
                else raw_sqlite_async(sqlite_path, rows, batch)
            )
            rates["raw driver, async"].append(total / asyncio.run(raw_async))

            events = events_for(f"async-{next(counter)}", 0, total, plain=True)

            async def go(events=events, store=store, total=total, batch=batch):
                t0 = time.perf_counter()
                for i in range(0, total, batch):
                    await store.append(events[i : i + batch])
                return time.perf_counter() - t0

            rates["append (async)"].append(total / asyncio.run(go()))

            # A run's stream: started (untimed), then the same appends.
            stream = f"run-sync-{next(counter)}"
            store.append_sync([run_started(stream)])
            events = events_for(stream, 1, total)
            t0 = time.perf_counter()
            for i in range(0, total, batch):
                store.append_sync(events[i : i + batch])
            rates["append_sync, a run's stream"].append(total / (time.perf_counter() - t0))

            stream = f"run-async-{next(counter)}"
            store.append_sync([run_started(stream)])
            events = events_for(stream, 1, total)
            rates["append (async), a run's stream"].append(total / asyncio.run(go(events)))
            events = events_for(f"site-{next(counter)}", 0, total, plain=True)
            rates[f"{site} append"].append(total / asyncio.run(go(events, sitestore)))
            stream = f"run-site-{next(counter)}"
            store.append_sync([run_started(stream)])
            events = events_for(stream, 1, total)
            rates[f"{site} append, a run's stream"].append(total / asyncio.run(go(events, sitestore)))
        if label == "PostgreSQL":
            floor = []
            for _ in range(runs):
                rows = rows_of(events_for(f"floor-{next(counter)}", 0, total, plain=True))
                floor.append(total / raw_postgres_floor(pg, rows, batch))
            FLOOR[batch] = statistics.median(s / f for s, f in zip(rates["append_sync"], floor))
        for how in hows:
            baseline = HOWS[how]
            rate = statistics.median(rates[how])
            # The median of each run's own ratio: a busy moment of the machine moves
            # both sides of it alike.
            ratio = (
                ""
                if baseline is None
                else f"{statistics.median(store / raw for store, raw in zip(rates[how], rates[baseline])):.2f}x"
            )
            results.append(
                [
                    label,
                    f"{batch}/call",
                    how,
                    f"{rate:,.0f} ev/s",
                    f"{1000 * batch / rate:.3f} ms",
                    ratio,
                    "" if baseline is None else baseline.removeprefix("raw driver, "),
                ]
            )
    return results


def wal_per_event(alias: str, pg: dict, n: int = 400) -> list:
    """PostgreSQL's WAL bytes per appended event, one event a call: what the server
    writes and syncs for an append, counted by the server (``pg_current_wal_insert_lsn``
    before and after ``n`` appends), so not moved by a busy moment of the machine as a
    time is. The raw INSERT's and the stores'; a run's stream folds each event into the
    run's index row too (an UPDATE of it in the same commit)."""
    import psycopg

    from aaa_django.store import DjangoEventStore
    from aaa_django.store.postgres import PgEventStore

    store, site = DjangoEventStore(using=alias), PgEventStore(using=alias)
    counter = iter(range(10**6))

    def raw(conn, stream):
        rows = encoded(rows_of(events_for(stream, 0, n, plain=True)))
        for row in rows:
            conn.execute(INSERT.format(p="%s"), row)

    def sync(stream, run):
        if run:
            store.append_sync([run_started(stream)])
        for e in events_for(stream, 1 if run else 0, n, plain=not run):
            store.append_sync([e])

    def site_append(stream, run):
        if run:
            store.append_sync([run_started(stream)])

        async def go():
            for e in events_for(stream, 1 if run else 0, n, plain=not run):
                await site.append([e])

        asyncio.run(go())

    hows = [
        ("raw INSERT (autocommit)", lambda c, s: raw(c, s)),
        ("append_sync", lambda c, s: sync(s, False)),
        ("append_sync, a run's stream", lambda c, s: sync(s, True)),
        ("PgEventStore append", lambda c, s: site_append(s, False)),
        ("PgEventStore append, a run's stream", lambda c, s: site_append(s, True)),
    ]
    out = []
    with psycopg.connect(**pg, dbname="aaa_bench", autocommit=True) as conn:
        for how, append in hows:
            append(conn, f"wal-warm-{next(counter)}")  # (a run's start, first pages: not counted)
            before = wal_lsn(conn)
            append(conn, f"wal-{next(counter)}")
            # the run's start (one event, a new index row) is in the count: small over n
            out.append(["PostgreSQL", how, f"{(wal_lsn(conn) - before) / n:,.0f} B"])
    return out


# --- snapshot + 50 events, against eventsourcing -------------------------------------------

SNAP_TAIL = 50
SNAP_EVENTS = 1_000


_AGGREGATE: list = []


def loop_aggregate():
    """The bench's tool-loop fold as an eventsourcing aggregate (one class: eventsourcing
    registers each aggregate class under its topic)."""
    if _AGGREGATE:
        return _AGGREGATE[0]
    from eventsourcing.domain import Aggregate, event

    class LoopAggregate(Aggregate):
        """The bench's tool-loop fold as an eventsourcing aggregate."""

        def __init__(self) -> None:
            self.request_id = ""
            self.turns = 0
            self.tool_calls = 0
            self.pending: list[str] = []
            self.tokens = 0
            self.cost = 0.0

        @event("Recorded")
        def record(self, kind: str, data: dict) -> None:
            if kind == "aaa.llm.requested":
                self.request_id = data["call_id"]
            elif kind == "aaa.llm.completed":
                self.turns += 1
                u = data.get("usage", {})
                self.tokens += u.get("input_tokens", 0) + u.get("output_tokens", 0)
                self.cost += data.get("cost", 0.0)
            elif kind == "aaa.tool.requested":
                self.pending.append(data["call_id"])
            elif kind == "aaa.tool.completed":
                self.tool_calls += 1
                self.pending = self.pending[-8:]

    _AGGREGATE.append(LoopAggregate)
    return LoopAggregate


def eventsourcing_app(label: str, pg: dict | None, tmp):
    """An eventsourcing Application (snapshotting on) on the same database server."""
    from eventsourcing.application import Application

    if label == "PostgreSQL":
        env = {
            "PERSISTENCE_MODULE": "eventsourcing.postgres",
            "POSTGRES_DBNAME": "aaa_bench",
            "POSTGRES_HOST": pg["host"],
            "POSTGRES_PORT": str(pg["port"]),
            "POSTGRES_USER": pg["user"],
            "POSTGRES_PASSWORD": "",
        }
    else:
        env = {"PERSISTENCE_MODULE": "eventsourcing.sqlite", "SQLITE_DBNAME": str(tmp / "eventsourcing.sqlite3")}
    app = Application(env={**env, "IS_SNAPSHOTTING_ENABLED": "y"})
    return app, loop_aggregate()


def bench_snapshot_reads(label: str, alias: str, pg: dict | None, tmp, rounds: int) -> list:
    """Load a state from its snapshot and the 50 events after it: ours (awaited
    ``Projection.load``, no holder) against eventsourcing's ``repository.get`` on the
    same server, in alternating rounds; ours through the store the engine uses on this
    database (``site_store``: ``PgEventStore`` on PostgreSQL) and, on PostgreSQL, through
    ``DjangoEventStore`` too, and through ``PgEventStore`` on connections that prepare no
    statements (``OPTIONS`` ``prepare_threshold`` None: as behind a transaction-mode
    pooler; by default they prepare when nothing pools them, as here, and eventsourcing
    prepares its own, ``execute(prepare=True)``)."""
    from aaa_django.events import Snapshot
    from aaa_django.store import DjangoEventStore
    from aaa_django.store.postgres import site_store

    try:
        app, LoopAggregate = eventsourcing_app(label, pg, tmp)
    except ImportError:
        return []
    agg = LoopAggregate()
    for i in range(SNAP_EVENTS):
        agg.record(kind=TYPES[i % 4], data=payload(i))
        if i % 100 == 99:
            app.save(agg)
    app.save(agg)
    app.take_snapshot(agg.id, version=agg.version - SNAP_TAIL)

    stores = {}
    for store in (site_store(alias), DjangoEventStore(using=alias)):
        stores.setdefault(type(store).__name__, store)
    if label == "PostgreSQL":
        stores["PgEventStore, unprepared"] = site_store(PG_UNPREPARED)
    p = loop_projection()
    stream = f"snap-{label}"

    async def ours_setup(store):
        for start in range(0, SNAP_EVENTS, 100):
            await store.append(events_for(stream, start, 100))
        events = await store.read(stream)
        base = events[SNAP_EVENTS - SNAP_TAIL - 1]
        await store.save_snapshot(
            Snapshot(stream, p.name, p.version, base.seq, base.id, p.dump(p.fold(events[: SNAP_EVENTS - SNAP_TAIL])))
        )

    async def ours_once(store) -> float:
        t0 = time.perf_counter()
        info = await p.load_info(store, stream)
        took = time.perf_counter() - t0
        assert (info.source, info.folded) == ("snapshot", SNAP_TAIL), info
        return took

    def theirs_once() -> float:
        t0 = time.perf_counter()
        got = app.repository.get(agg.id)
        took = time.perf_counter() - t0
        assert got.version == agg.version and got.turns == agg.turns
        return took

    async def go():
        await ours_setup(next(iter(stores.values())))
        for _ in range(5):  # warm up every side
            for store in stores.values():
                await ours_once(store)
            theirs_once()
        ours: dict[str, list[float]] = {name: [] for name in stores}
        theirs: dict[str, list[float]] = {name: [] for name in stores}
        for _ in range(rounds):
            for name, store in stores.items():  # each right before its own peer read
                ours[name].append(await ours_once(store))
                theirs[name].append(theirs_once())
        return ours, theirs

    ours, theirs = asyncio.run(go())
    app.close()
    rows = []
    for name in stores:
        ratio = statistics.median(o / t for o, t in zip(ours[name], theirs[name]))
        rows.append(
            [label, name, ms(statistics.median(ours[name])), ms(statistics.median(theirs[name])), f"{ratio:.2f}x"]
        )
    return rows


def durability(alias: str) -> str:
    from django.db import connections

    with connections[alias].cursor() as cur:
        if connections[alias].vendor == "postgresql":
            out = []
            for name in ("fsync", "synchronous_commit", "full_page_writes"):
                cur.execute(f"SHOW {name}")
                out.append(f"{name}={cur.fetchone()[0]}")
            cur.execute("SHOW server_version")
            return f"PostgreSQL {cur.fetchone()[0].split()[0]}: " + ", ".join(out)
        cur.execute("PRAGMA journal_mode")
        mode = cur.fetchone()[0]
        cur.execute("PRAGMA synchronous")
        sync = {0: "OFF", 1: "NORMAL", 2: "FULL", 3: "EXTRA"}[cur.fetchone()[0]]
        return f"SQLite {sqlite3.sqlite_version}: journal_mode={mode}, synchronous={sync}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="1k and 5k events, fewer repeats")
    ap.add_argument("--no-postgres", action="store_true", help="SQLite only")
    ap.add_argument(
        "--only",
        choices=["reads", "appends", "snapshot"],
        action="append",
        help="measure only this part (repeatable); default: all three",
    )
    args = ap.parse_args()
    parts = set(args.only or ["reads", "appends", "snapshot"])
    sizes = [1_000, 5_000] if args.quick else [1_000, 10_000, 50_000]
    repeats = dict(whole=3, fast=15, check=3) if args.quick else dict(whole=5, fast=41, check=3)
    plan = {1: 200, 50: 1000} if args.quick else {1: 500, 50: 2500}
    runs = 3 if args.quick else 5
    started = time.perf_counter()

    from contextlib import nullcontext

    with workdir() as tmp, nullcontext(None) if args.no_postgres else postgres(tmp) as pg:
        backends = setup_django(tmp, pg)
        print(
            f"# aaa_django event log benchmark — Python {platform.python_version()}, "
            f"{platform.machine()}, {__import__('os').cpu_count()} CPUs"
        )
        for label, alias in backends.items():
            print(f"#   {label}: {durability(alias)}")
        print(
            f"#   projection: tool loop, snapshots every {EVERY}; snapshot read tail = {TAIL} "
            f"events; holder reads see {NEW_PER_READ} new events; ~{len(json.dumps(payload(1234), separators=(',', ':')))}-byte data\n"
        )

        if "reads" in parts:
            reads = {}
            for label, alias in backends.items():
                raw = raw_reader(label, pg, str(tmp / "bench.sqlite3"))
                for n, r in asyncio.run(bench_reads(alias, sizes, repeats, raw)).items():
                    reads[label, n] = r
            rows = []
            for (label, n), r in reads.items():
                rows.append(
                    [
                        label,
                        f"{n:,}",
                        ms(r["raw"]),
                        ms(r["whole"]),
                        f"{r['whole/raw']:.2f}x",
                        ms(r["snapshot"]),
                        ms(r["holder"]),
                        ms(r["check"]),
                        f"{r['whole'] / r['snapshot']:,.0f}x",
                        f"{r['whole'] / r['holder']:,.0f}x",
                    ]
                )
            print(
                "Reading a projection's state (median; whole/raw: the median of each whole-log "
                "fold over the raw read just before it)"
            )
            print(
                table(
                    [
                        "backend",
                        "events",
                        "raw read",
                        "whole log",
                        "whole/raw",
                        "snapshot+tail",
                        "warm holder",
                        "holder+self-check",
                        "whole/snap",
                        "whole/holder",
                    ],
                    rows,
                )
            )
            big, small = sizes[-1], sizes[0]
            print()
            for label in backends:
                growth = reads[label, big]["snapshot"] / reads[label, small]["snapshot"]
                speedup = reads[label, big]["whole"] / reads[label, big]["snapshot"]
                print(
                    f"{label}: snapshot read at {big:,} / at {small:,} = {growth:.2f}x "
                    f"(goal <= 2x: {'met' if growth <= 2 else 'MISSED'}); "
                    f"whole log / snapshot at {big:,} = {speedup:,.0f}x "
                    f"(goal >= 100x: {'met' if speedup >= 100 else 'MISSED'}); "
                    f"whole log / raw read at {big:,} = {reads[label, big]['whole/raw']:.2f}x "
                    "(goal: close to 1)"
                )

        if "appends" in parts:
            print(
                f"\nAppending (median of {runs} runs; vs raw = the median of the runs' store rate / "
                "the raw driver's in the same run, sync with sync, async with async)"
            )
            rows = []
            for label, alias in backends.items():
                rows += bench_appends(alias, label, pg, str(tmp / "bench.sqlite3"), plan, runs)
            print(table(["backend", "batch", "how", "rate", "per call", "vs raw", "raw"], rows))
            runs_rows = [r for r in rows if "a run's stream" in r[2]]
            if runs_rows:
                low = min(float(r[5][:-1]) for r in runs_rows)
                print(
                    f"\nappends on a run's stream, lowest store/raw: {low:.2f}x "
                    f"(goal >= 0.5x: {'met' if low >= 0.5 else 'MISSED'})"
                )
                site_rows = [r for r in runs_rows if "Store append" in r[2]]
                print(
                    "  of them, the site's stores' (what the engine awaits: PgEventStore, "
                    "SqliteEventStore): lowest "
                    f"{min(float(r[5][:-1]) for r in site_rows):.2f}x; the Django store's sync "
                    f"path: lowest {min(float(r[5][:-1]) for r in runs_rows if 'append_sync' in r[2]):.2f}x"
                )
            worst = min(rows, key=lambda r: float(r[5][:-1]) if r[5] else float("inf"))
            ratio = float(worst[5][:-1])
            print(
                f"\nlowest store/raw ratio, over every store row: {ratio:.2f}x ({worst[0]}, "
                f"{worst[1]}, {worst[2]}) (goal >= 0.5x: {'met' if ratio >= 0.5 else 'MISSED'})"
            )
            if FLOOR:
                print(
                    "PostgreSQL append_sync vs raw psycopg's fewest round trips (autocommit, one "
                    "INSERT per call; information, not the goal's baseline): "
                    + ", ".join(f"{b}/call {r:.2f}x" for b, r in FLOOR.items())
                )
            if pg is not None:
                print(
                    "\nPostgreSQL's WAL per appended event, one event a call (counted by the "
                    "server: what an append writes and syncs, not a time)"
                )
                print(table(["backend", "how", "WAL per event"], wal_per_event(backends["PostgreSQL"], pg)))

        if "snapshot" in parts:
            snap_rows = []
            for label, alias in backends.items():
                snap_rows += bench_snapshot_reads(label, alias, pg, tmp, 15 if args.quick else 41)
            if snap_rows:
                print(
                    f"\nA snapshot + {SNAP_TAIL} events ({SNAP_EVENTS}-event stream), median; "
                    "ratio = the median of the rounds' own ratios"
                )
                print(table(["backend", "store", "aaa_django", "eventsourcing", "ratio"], snap_rows))
                for r in snap_rows:
                    ratio = float(r[4][:-1])
                    print(
                        f"{r[0]}, {r[1]}: snapshot + {SNAP_TAIL} events {ratio:.2f}x eventsourcing's "
                        f"(goal <= 0.5x: {'met' if ratio <= 0.5 else 'MISSED'})"
                    )
            else:
                print(
                    "\n(snapshot + 50 events against eventsourcing: not measured, eventsourcing is "
                    "not installed: see requirements/bench.txt)"
                )
        print(f"# total {time.perf_counter() - started:.0f} s")


if __name__ == "__main__":
    main()
