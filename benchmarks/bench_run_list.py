"""The admin's run list at a million runs: its date drill-down asked of every run
(Django's ``QuerySet.datetimes``) against the probes of ``aaa_django.admin.dates``, in
the same rounds on the same rows, and the page as a staff user gets it.

    .venv/bin/python benchmarks/bench_run_list.py                 # 1,000,000 runs (~2 min)
    .venv/bin/python benchmarks/bench_run_list.py --runs 100000 --rounds 5

On one durable PostgreSQL (``benchmarks/common.py``), the example site's settings
(``project.settings``, ``AAA_DEBUG=0``): ``aaa_run`` filled with ``--runs`` rows in
server-side SQL, their starts spread evenly over the last 430 days (two calendar years
at least, every day of them holding runs), then ``VACUUM (ANALYZE)``. Each round, in
turn (so a busy moment of this VM weighs on both alike), for the three levels of the
drill-down (the years of every run; the months of this year; the days of this month):

- Django's: ``RunRecord.objects....datetimes("started_at", kind)`` (``SELECT DISTINCT``
  of the truncated start of every run the level keeps);
- the probes: ``ProbedDates(...).datetimes(...)`` over the same filters (a query a
  period that holds runs, and one);

and the run list's page (the admin's changelist as a superuser, Django's test client),
at the top and at each level, with its queries' times as Django records them: the
drill-down's probes, the spend chart's aggregate (``GROUP BY`` of every run the list
keeps: not changed here), and the rest. Printed: medians, and the probes over Django's
query (the median of the rounds' ratios).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from datetime import timedelta
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))
from common import PG_DB, postgres, table, workdir  # noqa: E402

FILL = """
INSERT INTO aaa_run (run_id, algorithm, status, outcome, owner_id, parent, tokens_in, tokens_out,
                     cost, model_calls, tool_calls, started_at, ended_at, updated_at, last_seq,
                     request_hash, redrives)
SELECT 'run-' || lpad(to_hex(r), 12, '0') || '-' || substr(md5(r::text), 1, 20),
       'aaa.algos.ToolLoop', 'completed', CASE WHEN r %% 7 = 0 THEN 'failed' ELSE 'success' END,
       NULL, NULL, 420 * 24, 60 * 24, 0.000123 * 24, 24, 24,
       now() - interval '430 days' * (1 - r::float / %(runs)s),
       now() - interval '430 days' * (1 - r::float / %(runs)s) + interval '30 seconds',
       now() - interval '430 days' * (1 - r::float / %(runs)s) + interval '30 seconds', 97, '', 0
FROM generate_series(%(first)s, %(last)s) AS r
"""


def ms(seconds: float) -> str:
    return f"{seconds * 1e3:.1f} ms"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=1_000_000)
    ap.add_argument("--rounds", type=int, default=9)
    args = ap.parse_args()
    with workdir() as tmp, postgres(tmp) as pg:
        os.environ.update(
            AAA_DB="postgres",
            AAA_PG_HOST=pg["host"],
            AAA_PG_PORT=str(pg["port"]),
            AAA_PG_NAME=PG_DB,
            AAA_PG_USER=pg["user"],
            AAA_DEBUG="0",
            DJANGO_SETTINGS_MODULE="project.settings",
        )
        import django

        django.setup()
        from django.core.management import call_command
        from django.db import connection
        from django.test.utils import setup_test_environment

        setup_test_environment()  # (the test client's host)
        call_command("migrate", verbosity=0)
        t0 = time.perf_counter()
        with connection.cursor() as cur:
            step = 100_000
            for first in range(1, args.runs + 1, step):
                cur.execute(FILL, {"first": first, "last": min(first + step - 1, args.runs), "runs": args.runs})
        connection.cursor().execute("VACUUM (ANALYZE) aaa_run")
        print(f"# {args.runs:,} runs in {time.perf_counter() - t0:.0f} s; {args.rounds} rounds", flush=True)
        return measure(args.rounds)


def measure(rounds: int) -> int:
    from django.contrib.auth import get_user_model
    from django.db import connection
    from django.test import Client
    from django.test.utils import CaptureQueriesContext
    from django.urls import reverse
    from django.utils import timezone

    from aaa_django.admin.dates import ProbedDates
    from aaa_django.models import RunRecord

    now = timezone.localtime()
    year, month = (
        now.replace(month=1, day=1, hour=0, minute=0, second=0, microsecond=0),
        now.replace(day=1, hour=0, minute=0, second=0, microsecond=0),
    )
    # (bounded as the admin's ChangeList bounds its drill-down's year and month)
    levels = {
        "years": ("year", {}),
        "months of this year": ("month", {"started_at__gte": year, "started_at__lt": year.replace(year=year.year + 1)}),
        "days of this month": (
            "day",
            {"started_at__gte": month, "started_at__lt": (month.replace(day=28) + timedelta(days=4)).replace(day=1)},
        ),
    }
    user = get_user_model().objects.create_superuser("bench", "bench@example.com", "bench")
    client = Client()
    client.force_login(user)
    url = reverse("admin:aaa_runrecord_changelist")
    pages = {
        "the list (top)": {},
        "this year": {"started_at__year": now.year},
        "this month": {"started_at__year": now.year, "started_at__month": now.month},
    }
    times: dict[str, list[float]] = {}
    ratios: dict[str, list[float]] = {name: [] for name in levels}
    parts: dict[str, dict[str, list[float]]] = {
        name: {"probes": [], "chart": [], "other": [], "whole": []} for name in pages
    }
    found: dict[str, int] = {}

    def timed(key: str, fn) -> float:
        t0 = time.perf_counter()
        out = fn()
        took = time.perf_counter() - t0
        times.setdefault(key, []).append(took)
        found[key] = len(out)
        return took

    for rnd in range(rounds + 1):
        for name, (kind, filters) in levels.items():
            pair = [
                ("django", lambda f=filters, k=kind: list(RunRecord.objects.filter(**f).datetimes("started_at", k))),
                ("probed", lambda f=filters, k=kind: ProbedDates(RunRecord).filter(**f).datetimes("started_at", k)),
            ]
            took = {}
            for side, fn in pair if rnd % 2 else pair[::-1]:
                took[side] = timed(f"{name}: {side}", fn)
            assert found[f"{name}: django"] == found[f"{name}: probed"]
            if rnd:
                ratios[name].append(took["probed"] / took["django"])
        for name, params in pages.items():
            with CaptureQueriesContext(connection) as queries:
                t0 = time.perf_counter()
                response = client.get(url, params)
                whole = time.perf_counter() - t0
            assert response.status_code == 200, response.status_code
            if not rnd:
                continue  # (warm-up)
            probe = sum(
                float(q["time"])
                for q in queries
                if q["sql"].endswith("ASC LIMIT 1")
                and q["sql"].startswith('SELECT "aaa_run"."started_at" AS "started_at"')
            )
            chart = sum(float(q["time"]) for q in queries if "GROUP BY" in q["sql"])
            rest = sum(float(q["time"]) for q in queries) - probe - chart
            for key, value in (("probes", probe), ("chart", chart), ("other", rest), ("whole", whole)):
                parts[name][key].append(value)
    med = statistics.median
    rows = [
        [
            name,
            str(found[f"{name}: probed"]),
            ms(med(times[f"{name}: django"][1:])),
            ms(med(times[f"{name}: probed"][1:])),
            f"{med(ratios[name]):.3f}x",
        ]
        for name in levels
    ]
    print(table(["drill-down level", "periods", "Django (DISTINCT)", "probes", "probes / Django"], rows))
    rows = [
        [name, ms(med(p["whole"])), ms(med(p["probes"])), ms(med(p["chart"])), ms(med(p["other"]))]
        for name, p in parts.items()
    ]
    print()
    print(table(["the run list's page", "whole (client)", "drill-down probes", "spend chart", "other queries"], rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
