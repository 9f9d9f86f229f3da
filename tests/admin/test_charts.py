"""Tokens and cost per day over the run list (aaa_django.admin.charts): one aggregate
query over the run index, following the list's filters, drawn as inline SVG."""

from __future__ import annotations

import re
from datetime import date, datetime, timedelta, timezone

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.urls import reverse

from aaa_django.admin.charts import MAX_BARS, Spend, buckets, spend_chart
from aaa_django.events import Event
from aaa_django.runtime.event_types import (
    LLM_COMPLETED,
    LLM_REQUESTED,
    RUN_COMPLETED,
    RUN_STARTED,
    completion_id,
    result_id,
    started_id,
)
from aaa_django.store import DjangoEventStore

from .conftest import make_staff

LIST = "admin:aaa_runrecord_changelist"


def a_run(
    run_id: str, when: datetime, tokens_in: int, tokens_out: int, cost: float, outcome: str = "success", owner=None
) -> None:
    """A run's log as the engine writes it: started, one model call with its usage and
    cost, ended; indexed by the store's append as any run is."""
    asked = Event(id=f"{run_id}-ask", stream=run_id, type=LLM_REQUESTED, data={"tag": "t"}, time=when)
    DjangoEventStore().append_sync(
        [
            Event(
                id=started_id(run_id),
                stream=run_id,
                type=RUN_STARTED,
                time=when,
                data={"algorithm": "tests.chart", "config": {}, "input": {}, "owner": str(owner.pk) if owner else None},
            ),
            asked,
            Event(
                id=result_id(asked.id),
                stream=run_id,
                type=LLM_COMPLETED,
                causation=asked.id,
                time=when + timedelta(seconds=1),
                data={"usage": {"input_tokens": tokens_in, "output_tokens": tokens_out}, "cost": cost},
            ),
            Event(
                id=completion_id(run_id),
                stream=run_id,
                type=RUN_COMPLETED,
                time=when + timedelta(seconds=2),
                data={"outcome": outcome, "value": None},
            ),
        ]
    )


def chart(page: str) -> str:
    return re.search(r'<svg class="aaa-spend".*?</svg>', page, re.S).group(0)


def periods(svg: str) -> dict[str, tuple[int, int, float]]:
    """start -> (runs, tokens, cost) of each bar."""
    return {
        start: (int(runs), int(tokens), float(cost))
        for start, runs, tokens, cost in re.findall(
            r'<g class="aaa-period" data-start="([\d-]+)" data-runs="(\d+)" data-tokens="(\d+)" '
            r'data-cost="([\d.]+)">',
            svg,
        )
    }


# -- the picture, pure ---------------------------------------------------------------------


def test_days_without_runs_are_drawn_as_zeros_and_long_ranges_go_by_week_then_month():
    d = date(2026, 11, 2)  # a Monday
    unit, bars = buckets([Spend(d, 2, 10, 5, 0.5), Spend(d + timedelta(days=3), 1, 1, 1, 0.25)])
    assert unit == "day" and [b.start for b in bars] == [d + timedelta(days=i) for i in range(4)]
    assert [b.runs for b in bars] == [2, 0, 0, 1]

    # 63 days: too many bars; the last two days are a Saturday and a Sunday
    long = [
        Spend(d, 1, 1, 0, 0.1),
        Spend(d + timedelta(days=MAX_BARS - 1), 1, 2, 0, 0.2),
        Spend(d + timedelta(days=MAX_BARS), 1, 3, 0, 0.3),
    ]
    unit, bars = buckets(long)
    assert unit == "week" and bars[0].start == d and bars[-1].start.weekday() == 0
    assert (bars[-1].runs, bars[-1].tokens_in) == (2, 5)  # the last two days share a week
    assert sum(b.runs for b in bars) == 3

    unit, bars = buckets([Spend(date(2020, 1, 31), 1), Spend(date(2026, 12, 1), 4)])
    assert unit == "month" and len(bars) == 7 * 12 and bars[1].start == date(2020, 2, 1)
    assert (bars[0].runs, bars[-1].runs) == (1, 4)


def test_each_bar_says_what_its_day_spent_and_no_runs_is_drawn_too():
    d = date(2026, 11, 2)
    svg = str(spend_chart([Spend(d, 3, 1200, 300, 0.0123), Spend(d + timedelta(days=2), 1, 0, 0, 0.0)]))
    assert periods(svg) == {"2026-11-02": (3, 1500, 0.0123), "2026-11-03": (0, 0, 0.0), "2026-11-04": (1, 0, 0.0)}
    assert "<title>2026-11-02: 3 runs, 1,500 tokens (1,200 in / 300 out), $0.0123</title>" in svg
    # the busiest day's tokens reach the top of their panel: 1.5k is the scale
    assert ">1.5k</text>" in svg and ">$0.0123</text>" in svg
    empty = str(spend_chart([]))
    assert 'data-bars="0"' in empty and "No runs match" in empty and "aaa-period" not in empty


# -- on the run list -------------------------------------------------------------------------


@pytest.fixture
def spread(db, django_user_model):
    """Runs over three days of November 2026, one of them another owner's."""
    other = make_staff(django_user_model, "other", "view_runrecord")
    day = datetime(2026, 11, 10, 9, tzinfo=timezone.utc)
    a_run("run-a", day, 100, 20, 0.01)
    a_run("run-b", day + timedelta(hours=3), 50, 10, 0.02, outcome="failed")
    a_run("run-c", day + timedelta(days=2), 7, 3, 0.5, owner=other)
    return other


def test_the_run_list_charts_the_runs_its_filters_keep(client, admin_user, spread):
    client.force_login(admin_user)
    page = client.get(reverse(LIST)).content.decode()
    assert periods(chart(page)) == {"2026-11-10": (2, 180, 0.03), "2026-11-11": (0, 0, 0.0), "2026-11-12": (1, 10, 0.5)}
    # a filter, the date drill-down and the search are followed
    failed = chart(client.get(reverse(LIST), {"outcome": "failed"}).content.decode())
    assert periods(failed) == {"2026-11-10": (1, 60, 0.02)}
    day = chart(
        client.get(
            reverse(LIST), {"started_at__year": 2026, "started_at__month": 11, "started_at__day": 12}
        ).content.decode()
    )
    assert periods(day) == {"2026-11-12": (1, 10, 0.5)}
    assert periods(chart(client.get(reverse(LIST), {"q": "run-a"}).content.decode())) == {"2026-11-10": (1, 120, 0.01)}
    # nothing matches: the empty picture
    none = chart(client.get(reverse(LIST), {"outcome": "timeout"}).content.decode())
    assert 'data-bars="0"' in none and "No runs match" in none


def test_staff_who_see_only_their_runs_see_only_their_spend(client, spread):
    client.force_login(spread)
    assert periods(chart(client.get(reverse(LIST)).content.decode())) == {"2026-11-12": (1, 10, 0.5)}


def test_the_chart_is_one_query_whatever_the_number_of_runs(client, admin_user, spread):
    client.force_login(admin_user)
    with CaptureQueriesContext(connection) as three:
        client.get(reverse(LIST))
    for i in range(20):
        a_run(f"run-more-{i}", datetime(2026, 11, 1 + i, tzinfo=timezone.utc), 1, 1, 0.001)
    with CaptureQueriesContext(connection) as more:
        page = client.get(reverse(LIST)).content.decode()

    # (the date drill-down asks a query a day that holds runs, and one more: its probes,
    # aaa_django.admin.dates; the rest of the page's queries do not grow)
    def probes(queries) -> int:
        return sum(
            1
            for q in queries
            if q["sql"].endswith("ASC LIMIT 1")
            and q["sql"].startswith('SELECT "aaa_run"."started_at" AS "started_at" FROM')
        )

    assert (probes(three), probes(more)) == (2 + 1, 20 + 1)
    assert len(periods(chart(page))) == 20 and len(more) - probes(more) == len(three) - probes(three)
    grouped = [q["sql"] for q in more if "GROUP BY" in q["sql"] and "aaa_run" in q["sql"]]
    assert len(grouped) == 1 and 'SUM("aaa_run"."cost")' in grouped[0]
