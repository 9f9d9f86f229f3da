"""The admin's event list on a long log: its type filter's choices found one index probe
a type, not by reading every event; its page count on PostgreSQL the planner's estimate
when the list is long (and the page says "about")."""

from __future__ import annotations

import pytest
from django.db import connection, connections
from django.test.utils import CaptureQueriesContext
from django.urls import reverse

from aaa_django.admin import records
from aaa_django.events import Event
from aaa_django.models import EventRecord
from aaa_django.store import DjangoEventStore, rows
from tests.api.test_runindex import log_of

from .conftest import make_staff
from .test_run_pages import text

LIST = "admin:aaa_eventrecord_changelist"
RUNS = "admin:aaa_runrecord_changelist"


def fill(using: str = "default", owner: str | None = None, *runs: str) -> None:
    store = DjangoEventStore(using)
    for run_id in runs:
        store.append_sync(log_of(run_id, owner))


@pytest.mark.django_db
def test_the_type_filter_offers_the_logs_types_without_reading_every_event(admin_client):
    fill("default", None, "run-a", "run-b")
    DjangoEventStore("default").append_sync([Event.new("notes", "zeta.only.here", {})])
    types = set(EventRecord.objects.values_list("type", flat=True))
    with CaptureQueriesContext(connection) as queries:
        page = text(admin_client.get(reverse(LIST)))
    for t in types:
        assert f"?type={t}" in page, t
    assert not [q["sql"] for q in queries if "DISTINCT" in q["sql"].upper()], queries.captured_queries
    filtered = text(admin_client.get(reverse(LIST) + "?type=zeta.only.here"))
    assert "notes" in filtered and "run-a" not in filtered


@pytest.mark.django_db
def test_staff_who_see_only_their_runs_are_offered_only_their_events_types(client, django_user_model):
    dana = make_staff(django_user_model, "dana", "view_runrecord", "view_eventrecord")
    fill("default", str(dana.pk), "run-dana")
    fill("default", None, "run-other")
    DjangoEventStore("default").append_sync([Event.new("notes", "zeta.only.here", {})])
    client.force_login(dana)
    page = text(client.get(reverse(LIST)))
    assert "?type=aaa.llm.completed" in page
    assert "zeta.only.here" not in page and "run-other" not in page


@pytest.mark.django_db
def test_an_estimated_count_says_about(admin_client, monkeypatch):
    fill("default", None, "run-a")
    monkeypatch.setattr(records.EstimatingPaginator, "estimated", True)
    assert "about 10 events" in " ".join(text(admin_client.get(reverse(LIST))).split())
    assert "about 1 run" in " ".join(text(admin_client.get(reverse(RUNS))).split())
    monkeypatch.setattr(records.EstimatingPaginator, "estimated", False)
    page = " ".join(text(admin_client.get(reverse(LIST))).split())
    assert "10 events" in page and "about 10" not in page


@pytest.mark.django_db(databases="__all__", transaction=True)
def test_distinct_values_of_the_log_are_select_distincts(db_alias):
    conn = connections[db_alias]
    assert rows.distinct(conn, "type") == [] and rows.streams(conn) == []
    fill(db_alias, None, "run-b", "run-a")
    DjangoEventStore(db_alias).append_sync([Event.new("a-notes", "zeta.only.here", {})])
    events = EventRecord.objects.using(db_alias)
    assert rows.distinct(conn, "type") == sorted(set(events.values_list("type", flat=True)))
    assert rows.streams(conn) == ["a-notes", "run-a", "run-b"]
    with pytest.raises(ValueError):
        rows.distinct(conn, "data")


@pytest.mark.postgres
@pytest.mark.django_db(databases=["postgres"], transaction=True)
def test_a_long_list_is_counted_by_the_planners_estimate_on_postgresql(pg_alias, monkeypatch):
    fill(pg_alias, None, *(f"run-{i}" for i in range(30)))  # 300 events
    with connections[pg_alias].cursor() as cur:
        cur.execute("ANALYZE aaa_event")
    events = EventRecord.objects.using(pg_alias).order_by("-pk")
    monkeypatch.setattr(records, "ESTIMATE_ABOVE", 100)
    long = records.EstimatingPaginator(events, 50)
    with CaptureQueriesContext(connections[pg_alias]) as queries:
        assert 150 <= long.count <= 600
    assert long.estimated
    assert not [q for q in queries if "COUNT(" in q["sql"].upper()]
    short = records.EstimatingPaginator(events.filter(stream="run-3"), 50)
    assert short.count == 10 and not short.estimated  # (estimated 10: under the bar)
    monkeypatch.setattr(records, "ESTIMATE_ABOVE", 100_000)
    exact = records.EstimatingPaginator(events, 50)
    assert exact.count == 300 and not exact.estimated


@pytest.mark.django_db
def test_the_run_lists_filters_offer_the_indexs_values_without_reading_every_row(admin_client):
    """The run list's outcome and algorithm filters, the same way (``?outcome=`` as
    Django's); a run in flight (no outcome yet) is found by its status."""
    fill("default", None, "run-a", "run-b")
    DjangoEventStore("default").append_sync(log_of("run-c", None)[:3])
    with CaptureQueriesContext(connection) as queries:
        page = text(admin_client.get(reverse(RUNS)))
    assert "?outcome=success" in page and "?algorithm=tests.api.echo" in page
    distinct = [
        q["sql"]
        for q in queries
        if "DISTINCT" in q["sql"].upper() and ('"outcome"' in q["sql"] or '"algorithm"' in q["sql"])
    ]
    assert not distinct, distinct
    assert "run-c" not in text(admin_client.get(reverse(RUNS) + "?outcome=success"))
    assert "run-c" in text(admin_client.get(reverse(RUNS) + "?status__exact=running"))


@pytest.mark.django_db(databases="__all__", transaction=True)
def test_distinct_values_of_the_run_index_leave_null_out(db_alias):
    fill(db_alias, None, "run-a")
    DjangoEventStore(db_alias).append_sync(log_of("run-b", None)[:3])  # no outcome yet
    conn = connections[db_alias]
    assert rows.distinct(conn, "outcome", "aaa_run") == ["success"]
    assert rows.distinct(conn, "status", "aaa_run") == ["completed", "running"]
    with pytest.raises(ValueError):
        rows.distinct(conn, "owner_id", "aaa_run")
