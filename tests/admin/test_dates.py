"""The run list's date drill-down (aaa_django.admin.dates): the periods that hold runs
found by probing the date's index period by period, the same periods as Django's
``QuerySet.datetimes`` finds with ``SELECT DISTINCT`` over every run, in any time zone;
the page's drill-down is Django's, its queries none of them a DISTINCT."""

from __future__ import annotations

import html
from datetime import datetime, timedelta, timezone
from zoneinfo import ZoneInfo

import pytest
from django.db import connections
from django.test import override_settings
from django.test.utils import CaptureQueriesContext
from django.urls import reverse
from django.utils import timezone as dj_timezone

from aaa_django.admin.dates import ProbedDates, period_start
from aaa_django.models import RunRecord

LIST = "admin:aaa_runrecord_changelist"

#: times either side of year, month and day boundaries in UTC and in New York (UTC-5
#: in winter, UTC-4 in summer): 2025-12-31 23:30 UTC is still the 31st there, 2026-01-01
#: 03:00 UTC is still 2025 there; runs in 2024, none in 2023 (a gap a probe crosses)
TIMES = [
    datetime(*t, tzinfo=timezone.utc)
    for t in (
        (2024, 2, 29, 12),
        (2024, 11, 3, 5, 30),
        (2025, 12, 31, 23, 30),
        (2026, 1, 1, 3),
        (2026, 1, 1, 6),
        (2026, 3, 8, 6, 59),
        (2026, 3, 8, 7, 1),
        (2026, 3, 31, 23, 59),
        (2026, 4, 1, 4),
        (2026, 11, 30, 12),
        (2026, 11, 30, 12, 1),
        (2026, 12, 1, 0, 0),
    )
]


def runs_at(alias: str, times: list[datetime], outcome=lambda i: "success") -> None:
    RunRecord.objects.using(alias).bulk_create(
        [
            RunRecord(
                run_id=f"run-dates-{i}",
                algorithm="tests.dates",
                status="completed",
                outcome=outcome(i),
                started_at=t,
                updated_at=t,
                last_seq=1,
            )
            for i, t in enumerate(times)
        ]
    )


def both(alias: str, kind: str, **filters) -> tuple[list, list]:
    """Django's periods and the probed ones, of the runs ``filters`` keep."""
    django = list(RunRecord.objects.using(alias).filter(**filters).datetimes("started_at", kind))
    probed = ProbedDates(RunRecord, using=alias).filter(**filters).datetimes("started_at", kind)
    return django, probed


@pytest.mark.django_db(databases="__all__")
@pytest.mark.parametrize("zone", ["UTC", "America/New_York", "Asia/Kolkata"])
def test_the_probed_periods_are_djangos_in_every_time_zone(db_alias, zone):
    runs_at(db_alias, TIMES, outcome=lambda i: "failed" if i % 3 == 0 else "success")
    with override_settings(TIME_ZONE=zone), dj_timezone.override(zone):
        for kind in ("year", "month", "day"):
            django, probed = both(db_alias, kind)
            assert probed == django and len(probed) >= 2, (kind, probed)
            assert all(p.tzinfo is not None and str(dj_timezone.localtime(p).tzinfo) == zone for p in probed)
            # the list's filters and its drill-down's own lookups are followed
            assert both(db_alias, kind, outcome="failed")[1] == both(db_alias, kind, outcome="failed")[0]
            assert both(db_alias, kind, started_at__year=2026)[1] == both(db_alias, kind, started_at__year=2026)[0]
            assert both(db_alias, kind, outcome="timeout") == ([], [])


@pytest.mark.django_db(databases="__all__")
def test_one_probe_a_period_found_and_one_more_whatever_the_runs(db_alias):
    runs_at(db_alias, [TIMES[0] + timedelta(minutes=i) for i in range(200)] + TIMES[1:])
    with CaptureQueriesContext(connections[db_alias]) as queries:
        years = ProbedDates(RunRecord, using=db_alias).datetimes("started_at", "year")
    assert [y.year for y in years] == [2024, 2025, 2026]
    assert len(queries) == 4
    assert not [q["sql"] for q in queries if "DISTINCT" in q["sql"].upper()]


def test_a_period_starts_where_truncation_starts_it():
    utc = timezone.utc
    at = datetime(2026, 3, 8, 6, 59, tzinfo=utc)  # 01:59 in New York, before the clocks move
    ny = ZoneInfo("America/New_York")
    assert period_start(at, "day", ny) == datetime(2026, 3, 8, tzinfo=ny)
    assert period_start(at, "month", utc) == datetime(2026, 3, 1, tzinfo=utc)
    assert period_start(datetime(2026, 1, 1, 3, tzinfo=utc), "year", ny) == datetime(2025, 1, 1, tzinfo=ny)
    assert period_start(datetime(2026, 5, 17, 9), "month", None) == datetime(2026, 5, 1)  # naive


def test_other_kinds_and_orders_are_djangos_query():
    queryset = ProbedDates(RunRecord)
    assert hasattr(queryset.datetimes("started_at", "hour"), "query")
    assert hasattr(queryset.datetimes("started_at", "year", order="DESC"), "query")


def drilldown(page: str) -> list[str]:
    """The drill-down's links and titles, as the page shows them (Django 6.1's nav has an
    ``aria-labelledby`` and a label, not a link, before them)."""
    import re

    nav = re.search(r'<nav class="toplinks"[^>]*>(.*?)</nav>', page, re.S)
    return re.findall(r"<a href=\"([^\"]*)\"[^>]*>([^<]*)</a>", nav.group(1)) if nav else []


@pytest.mark.django_db
def test_the_run_lists_drill_down_is_djangos_without_a_distinct_query(client, admin_user):
    runs_at("default", TIMES)
    client.force_login(admin_user)
    for params, titles in (
        ({}, ["2024", "2025", "2026"]),
        (
            {"started_at__year": 2026},
            ["All dates", "January 2026", "March 2026", "April 2026", "November 2026", "December 2026"],
        ),
        ({"started_at__year": 2026, "started_at__month": 3}, ["2026", "March 8", "March 31"]),
    ):
        with CaptureQueriesContext(connections["default"]) as queries:
            page = client.get(reverse(LIST), params).content.decode()
        assert [html.unescape(title).strip().lstrip("‹").strip() for _, title in drilldown(page)] == titles, params
        assert not [q["sql"] for q in queries if "DISTINCT" in q["sql"].upper()], params
