"""The event table at 100 thousand and 10 million events, and a retention sweep of half.

    .venv/bin/python benchmarks/bench_scale.py                  # 100k and 10M events (~40 min)
    .venv/bin/python benchmarks/bench_scale.py --events 100000,1000000   # a quicker look

On one durable PostgreSQL (fsync on; ``benchmarks/common.py``), one database per
size, side by side:

1. **Fill** each database's ``aaa_event`` with runs of 100 events (tool-loop event types, ~320-byte
   JSON data, uuid event ids) and their ``aaa_run`` rows, in server-side SQL
   (``INSERT ... SELECT ... FROM generate_series``): the indexes are built after the
   load and the dense-seq trigger is off during it (the rows are dense by
   construction), then ``VACUUM (ANALYZE)``. Odd runs ended ``success`` 40 days ago,
   every tenth run is still running, the others ended ``failed`` today: a policy of
   ``{"success": 30}`` makes exactly half of the events due.
2. **Measure** (medians, the sizes taken in turns, so that what else the machine does
   weighs on both alike): an *append* (``DjangoEventStore.append_sync`` of one event to
   a random running run: its transaction, its index row); a run's *projection read*
   (``RUNMETA.load`` of a random run with a cold in-process holder: its snapshot and the
   events after it, as another process reads it); the *run list* (the newest 50 runs,
   as the admin and the API page them), the API's *run count*, and the sweeper's
   question (``unfinished``: every running run and its newest event's time, asked of
   the run index; beside it, once, the same asked of the log, the baseline).
3. **Sweep** each: ``apply_retention(policy={"success": 30})`` (batched erases
   through ``Engine.erase_runs``), then ``VACUUM (ANALYZE)``; the time of each and the
   table's size (heap, indexes) before and after; then the same measurements again.

Ratios to compare: each figure at 10M over the same at 100k, measured in the same
rounds (flat: near 1), and after the sweep over before it.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import ms, postgres, table, workdir

EVENTS_PER_RUN = 100
POLICY_DAYS = {"success": 30}
#: measurements of each figure per size and round; the sizes take turns each round
PER_ROUND = 10

# The body of one run's events, by seq: 1 started, 2 input validated, then model and
# tool requests and results in turn, 100 completed (a running run stops at 99).
FILL_EVENTS = """
INSERT INTO aaa_event (id, stream, seq, type, data, causation, time, blobs, tenant)
SELECT
  CASE WHEN s = %(per_run)s THEN completion_id(r) ELSE md5(r::text || ':' || s)::uuid::text END,
  run_id(r),
  s,
  CASE WHEN s = 1 THEN 'aaa.run.started'
       WHEN s = 2 THEN 'aaa.input.validated'
       WHEN s = %(per_run)s THEN 'aaa.run.completed'
       ELSE (ARRAY['aaa.llm.requested', 'aaa.llm.completed',
                   'aaa.tool.requested', 'aaa.tool.completed'])[(s - 3) %% 4 + 1] END,
  CASE WHEN s = 1 THEN '{"algorithm":"aaa.algos.ToolLoop","config":{"max_turns":50,"system":null,"tools":[],"model":null},"input":{"task":"How many people live in Lyon and Porto together? Look both up."},"budget":null,"deadline":null,"parent":null,"owner":null}'
       WHEN s = 2 THEN '{}'
       WHEN s = %(per_run)s THEN '{"outcome":"' || outcome(r) || '","value":{"text":"About 754,000 people live in Lyon and Porto together."}}'
       WHEN (s - 3) %% 4 = 0 THEN '{"messages":[{"role":"tool","content":"' || repeat('r', 150) || '","tool_call_id":"call_' || s || '","name":"population"}],"thread":"main","tag":"turn-' || s || '","tools":[]}'
       WHEN (s - 3) %% 4 = 1 THEN '{"request_id":"' || md5(r::text || ':' || (s - 1))::uuid || '","tag":"turn-' || s || '","thread":"main","response":{"message":{"role":"assistant","content":"' || repeat('a', 120) || '"},"finish_reason":"stop"},"usage":{"input_tokens":420,"output_tokens":60},"cost":0.000123,"model":"fake"}'
       WHEN (s - 3) %% 4 = 2 THEN '{"call_id":"call_' || s || '","name":"population","args":{"city":"' || repeat('L', 200) || '"}}'
       ELSE '{"request_id":"' || md5(r::text || ':' || (s - 1))::uuid || '","call_id":"call_' || s || '","name":"population","result":"' || repeat('5', 200) || '","ok":true}' END,
  CASE WHEN s = 1 THEN NULL ELSE md5(r::text || ':' || (s - 1))::uuid::text END,
  ended(r) - interval '1 second' * (%(per_run)s - s) / 10,
  '[]'::jsonb,
  NULL
FROM generate_series(%(first)s, %(last)s) AS r,
     generate_series(1, %(per_run)s) AS s
WHERE s < %(per_run)s OR outcome(r) <> 'running'
"""

FILL_RUNS = """
INSERT INTO aaa_run (run_id, algorithm, status, outcome, owner_id, parent, tokens_in, tokens_out,
                     cost, model_calls, tool_calls, started_at, ended_at, updated_at, last_seq,
                     request_hash)
SELECT run_id(r), 'aaa.algos.ToolLoop',
       CASE WHEN outcome(r) = 'running' THEN 'running' ELSE 'completed' END,
       NULLIF(outcome(r), 'running'), NULL, NULL, 420 * 24, 60 * 24, 0.000123 * 24, 24, 24,
       ended(r) - interval '1 second' * %(per_run)s / 10,
       CASE WHEN outcome(r) = 'running' THEN NULL ELSE ended(r) END,
       ended(r),
       CASE WHEN outcome(r) = 'running' THEN %(per_run)s - 1 ELSE %(per_run)s END,
       ''
FROM generate_series(%(first)s, %(last)s) AS r
"""

# Time-ordered run ids, as the engine's uuid7 ones: "run-" + 8-4-4-4-12 hex; a run's
# completion has the engine's id for it (``types.completion_id``: a uuid5), which is
# what retention looks up to know a run has ended.
FUNCTIONS = """
CREATE EXTENSION IF NOT EXISTS "uuid-ossp";
CREATE OR REPLACE FUNCTION run_id(r bigint) RETURNS text IMMUTABLE LANGUAGE sql AS $$
  SELECT 'run-' || (lpad(to_hex(r), 12, '0') || substr(md5(r::text), 1, 20))::uuid::text $$;
CREATE OR REPLACE FUNCTION completion_id(r bigint) RETURNS text IMMUTABLE LANGUAGE sql AS $$
  SELECT uuid_generate_v5('6f3f1c8e-7d0b-4c55-9a6e-2b8f0b5a1d11', run_id(r) || chr(31)
                          || 'aaa.run.completed')::text $$;
CREATE OR REPLACE FUNCTION outcome(r bigint) RETURNS text IMMUTABLE LANGUAGE sql AS $$
  SELECT CASE WHEN r % 2 = 1 THEN 'success' WHEN r % 10 = 0 THEN 'running' ELSE 'failed' END $$;
CREATE OR REPLACE FUNCTION ended(r bigint) RETURNS timestamptz STABLE LANGUAGE sql AS $$
  SELECT CASE WHEN r % 2 = 1 THEN now() - interval '40 days' ELSE now() END
         + interval '1 millisecond' * r $$;
"""


def connection(alias: str):
    from django.db import connections

    return connections[alias]


def scalar(alias: str, sql: str):
    with connection(alias).cursor() as cur:
        cur.execute(sql)
        return cur.fetchone()[0]


def setup(pg: dict, aliases: list[str]) -> None:
    """Django configured with one PostgreSQL database per alias, migrated."""
    import django
    import psycopg
    from django.conf import settings
    from django.core.management import call_command

    with psycopg.connect(**pg, dbname="postgres", autocommit=True) as conn:
        for alias in aliases:
            conn.execute(f"DROP DATABASE IF EXISTS aaa_scale_{alias}")
            conn.execute(f"CREATE DATABASE aaa_scale_{alias}")
    settings.configure(
        INSTALLED_APPS=["django.contrib.contenttypes", "django.contrib.auth", "aaa_django"],
        DATABASES={
            "default": {"ENGINE": "django.db.backends.sqlite3", "NAME": ":memory:"},
            **{
                alias: {
                    "ENGINE": "django.db.backends.postgresql",
                    "HOST": pg["host"],
                    "PORT": str(pg["port"]),
                    "USER": pg["user"],
                    "PASSWORD": "",
                    "NAME": f"aaa_scale_{alias}",
                }
                for alias in aliases
            },
        },
        USE_TZ=True,
        TIME_ZONE="UTC",
        DEFAULT_AUTO_FIELD="django.db.models.BigAutoField",
        AAA={},
        LOGGING_CONFIG=None,
    )
    django.setup()
    for alias in aliases:
        call_command("migrate", database=alias, verbosity=0)


def fill(alias: str, runs: int) -> float:
    """Empty the tables and fill them with ``runs`` runs; seconds it took."""
    from aaa_django.runtime.event_types import completion_id

    t0 = time.perf_counter()
    with connection(alias).cursor() as cur:
        cur.execute(FUNCTIONS)
        cur.execute(
            "SELECT indexdef FROM pg_indexes WHERE tablename = 'aaa_event' AND indexname "
            "NOT IN (SELECT conname FROM pg_constraint WHERE conrelid = 'aaa_event'::regclass)"
        )
        indexes = [row[0] for row in cur.fetchall()]
        cur.execute(
            "SELECT conname, pg_get_constraintdef(oid) FROM pg_constraint "
            "WHERE conrelid = 'aaa_event'::regclass AND contype IN ('p', 'u')"
        )
        constraints = cur.fetchall()
        for name, _ in constraints:
            cur.execute(f"ALTER TABLE aaa_event DROP CONSTRAINT {name}")
        for sql in indexes:
            cur.execute(f"DROP INDEX {sql.split(' INDEX ', 1)[1].split(' ON ', 1)[0]}")
        cur.execute("ALTER TABLE aaa_event DISABLE TRIGGER aaa_event_dense_seq")
        cur.execute("SET maintenance_work_mem = '1GB'")
        step = 20_000  # runs per statement: a few seconds each, progress shown
        for first in range(1, runs + 1, step):
            last = min(first + step - 1, runs)
            params = {"first": first, "last": last, "per_run": EVENTS_PER_RUN}
            cur.execute(FILL_EVENTS, params)
            cur.execute(FILL_RUNS, params)
            print(f"  {alias}: filled {last:,} of {runs:,} runs ({time.perf_counter() - t0:.0f} s)", flush=True)
        for name, definition in constraints:
            cur.execute(f"ALTER TABLE aaa_event ADD CONSTRAINT {name} {definition}")
        for sql in indexes:
            cur.execute(sql)
        cur.execute("ALTER TABLE aaa_event ENABLE TRIGGER aaa_event_dense_seq")
        cur.execute("VACUUM (ANALYZE) aaa_event, aaa_run")
        cur.execute("SELECT run_id(1), completion_id(1)")
        run, completion = cur.fetchone()
    assert completion == completion_id(run), "the SQL completion id is the engine's"
    return time.perf_counter() - t0


def sizes(alias: str) -> dict[str, int]:
    with connection(alias).cursor() as cur:
        cur.execute("SELECT count(*) FROM aaa_event")
        events = cur.fetchone()[0]
        cur.execute(
            "SELECT pg_relation_size('aaa_event'), pg_indexes_size('aaa_event'), "
            "pg_total_relation_size('aaa_event'), pg_total_relation_size('aaa_run')"
        )
        heap, index, total, runs = cur.fetchone()
    return {"events": events, "heap": heap, "indexes": index, "total": total, "runs": runs}


class Probe:
    """One database's figures, measured a few at a time (the sizes take turns)."""

    def __init__(self, alias: str) -> None:
        from aaa_django.models import RunRecord
        from aaa_django.store import DjangoEventStore

        self.alias = alias
        self.store = DjangoEventStore(alias)
        self.rows = RunRecord.objects.using(alias)
        self.running = list(self.rows.filter(status="running").values_list("run_id", flat=True))
        self.runs = list(self.rows.values_list("run_id", flat=True))
        self.rng = random.Random(7)
        self.loop = asyncio.new_event_loop()
        self.samples: dict[str, list[float]] = {"append": [], "read": [], "list": [], "count": [], "unfinished": []}

    def round(self, n: int) -> None:
        from aaa_django.events import Event, FoldCache, new_id
        from aaa_django.runtime import RUNMETA

        s = self.samples
        for _ in range(n):
            e = Event(
                id=new_id(),
                stream=self.rng.choice(self.running),
                type="aaa.llm.completed",
                data={
                    "request_id": new_id(),
                    "tag": "turn-x",
                    "usage": {"input_tokens": 420, "output_tokens": 60},
                    "cost": 0.000123,
                    "response": {"message": {"role": "assistant", "content": "a" * 120}},
                },
            )
            t0 = time.perf_counter()
            self.store.append_sync([e])
            s["append"].append(time.perf_counter() - t0)
        for _ in range(n):
            run = self.rng.choice(self.runs)
            # the first read of a run folds it whole and saves its snapshot; the second is
            # what another process pays: the snapshot and the events after it
            self.loop.run_until_complete(RUNMETA.load(self.store, run, cache=FoldCache(check_every=0)))
            t0 = time.perf_counter()
            self.loop.run_until_complete(RUNMETA.load(self.store, run, cache=FoldCache(check_every=0)))
            s["read"].append(time.perf_counter() - t0)
        for _ in range(n):
            t0 = time.perf_counter()
            page = list(
                self.rows.order_by("-started_at", "-run_id").values_list("run_id", "status", "outcome", "started_at")[
                    :50
                ]
            )
            s["list"].append(time.perf_counter() - t0)
            assert len(page) == 50
            t0 = time.perf_counter()
            self.rows.count()
            s["count"].append(time.perf_counter() - t0)
        for _ in range(max(n // 5, 1)):
            t0 = time.perf_counter()
            found = self.store.unfinished_sync()
            s["unfinished"].append(time.perf_counter() - t0)
            assert len(found) == len(self.running)

    def medians(self) -> dict[str, float]:
        return {k: statistics.median(v) for k, v in self.samples.items()}

    def close(self) -> None:
        self.loop.close()


def unfinished_from_the_log(alias: str) -> dict[str, float]:
    """The sweeper's question asked of the log (the
    streams with a start and no completion, each one's newest event time): the
    baseline of ``unfinished``, which asks the run index."""
    from django.db.models import Max

    from aaa_django.models import EventRecord

    events = EventRecord.objects.using(alias)
    started = events.filter(type="aaa.run.started").values("stream")
    completed = events.filter(type="aaa.run.completed").values("stream")
    rows = (
        events.filter(stream__in=started)
        .exclude(stream__in=completed)
        .values("stream")
        .annotate(last=Max("time"))
        .values_list("stream", "last")
    )
    return {stream: last.timestamp() for stream, last in rows}


def measure(aliases: list[str], samples: int) -> dict[str, dict[str, float]]:
    """Each database's medians, the databases measured in turns; and the sweeper's
    question asked of the log once each (``unfinished, of the log``: seconds at 10M)."""
    probes = [Probe(alias) for alias in aliases]
    for _ in range(max(samples // PER_ROUND, 1)):
        for probe in probes:
            probe.round(PER_ROUND)
    out = {p.alias: p.medians() for p in probes}
    for p in probes:
        t0 = time.perf_counter()
        of_the_log = unfinished_from_the_log(p.alias)
        out[p.alias]["unfinished, of the log"] = time.perf_counter() - t0
        assert of_the_log == p.store.unfinished_sync()
    for p in probes:
        p.close()
    return out


def sweep(alias: str) -> dict[str, float]:
    from asgiref.sync import async_to_sync

    from aaa_django.runtime import InProcessBus
    from aaa_django.site.engines import build_engine
    from aaa_django.site.retention import Policy, apply_retention
    from aaa_django.store.retention import vacuum_tables

    async def erase():
        async with build_engine(using=alias, bus=InProcessBus()) as engine:
            return await apply_retention(engine, policy=Policy(POLICY_DAYS), orphans=False, vacuum=False)

    t0 = time.perf_counter()
    report = async_to_sync(erase)()
    erased = time.perf_counter() - t0
    t0 = time.perf_counter()
    vacuum_tables(alias)
    vacuumed = time.perf_counter() - t0
    return {"runs": len(report.runs), "events": report.events, "erase": erased, "vacuum": vacuumed}


def mb(n: int) -> str:
    return f"{n / 2**20:,.0f} MB"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--events", default="100000,10000000", help="comma-separated table sizes (default 100000,10000000)"
    )
    parser.add_argument("--samples", type=int, default=200, help="measurements per figure")
    args = parser.parse_args(argv)
    totals = [int(x) for x in args.events.split(",")]
    aliases = [f"e{total}" for total in totals]
    with workdir() as tmp, postgres(tmp) as pg:
        setup(pg, aliases)
        first = aliases[0]
        print(
            "server:",
            scalar(first, "SELECT version()").split(",")[0],
            "| fsync",
            scalar(first, "SHOW fsync"),
            "| synchronous_commit",
            scalar(first, "SHOW synchronous_commit"),
            "| shared_buffers",
            scalar(first, "SHOW shared_buffers"),
            flush=True,
        )
        before: dict[str, dict] = {}
        for alias, total in zip(aliases, totals):
            filled = fill(alias, total // EVENTS_PER_RUN)
            before[alias] = sizes(alias)
            b = before[alias]
            print(
                f"{alias}: filled in {filled:.0f} s: {b['events']:,} events; aaa_event "
                f"{mb(b['total'])} (heap {mb(b['heap'])}, indexes {mb(b['indexes'])})",
                flush=True,
            )
        m_before = measure(aliases, args.samples)
        swept, after = {}, {}
        for alias in aliases:
            swept[alias] = sweep(alias)
            after[alias] = sizes(alias)
            s, a = swept[alias], after[alias]
            print(
                f"{alias}: swept {s['runs']:,} runs, {s['events']:,} events in "
                f"{s['erase']:.1f} s, VACUUM (ANALYZE) {s['vacuum']:.1f} s; "
                f"{a['events']:,} events left; aaa_event {mb(a['total'])} "
                f"(heap {mb(a['heap'])}, indexes {mb(a['indexes'])})",
                flush=True,
            )
        m_after = measure(aliases, args.samples)

    figures = ("append", "read", "list", "count", "unfinished", "unfinished, of the log")
    print()
    rows = []
    for alias, total in zip(aliases, totals):
        rows.append([f"{total:,}", *(ms(m_before[alias][k]) for k in figures)])
        rows.append([f"{total:,}, half swept", *(ms(m_after[alias][k]) for k in figures)])
    print(
        table(
            [
                "events",
                "append",
                "projection read",
                "run list (50)",
                "run count",
                "sweeper's question",
                "the same of the log (before)",
            ],
            rows,
        )
    )
    small, big = aliases[0], aliases[-1]
    if big != small:
        for label, m in (("before the sweep", m_before), ("after the sweep", m_after)):
            print(
                f"{totals[-1]:,} over {totals[0]:,}, {label}: "
                + ", ".join(f"{k} {m[big][k] / m[small][k]:.2f}x" for k in figures)
            )
    for alias, total in zip(aliases, totals):
        print(
            f"{total:,}, after the sweep over before: "
            + ", ".join(f"{k} {m_after[alias][k] / m_before[alias][k]:.2f}x" for k in figures)
        )
    print()
    print(
        table(
            ["events", "erased", "erase", "VACUUM", "size before", "size after"],
            [
                [
                    f"{t:,}",
                    f"{swept[a]['events']:,}",
                    f"{swept[a]['erase']:.1f} s",
                    f"{swept[a]['vacuum']:.1f} s",
                    mb(before[a]["total"]),
                    mb(after[a]["total"]),
                ]
                for a, t in zip(aliases, totals)
            ],
        )
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
