"""Events and snapshots in the admin: read-only for everyone, superusers included.

They are the log and its derived snapshots; the only writers are the event store
and the projections. These pages let staff search them (by run, type, id) and jump
to the run page, where the timeline reads them in order.
"""

from __future__ import annotations

import json

from django.contrib import admin
from django.contrib.admin.utils import quote
from django.core.paginator import Paginator
from django.db import connections
from django.db.models import Model, QuerySet
from django.http import HttpRequest
from django.urls import reverse
from django.utils.functional import cached_property
from django.utils.html import format_html

from aaa_django import access
from aaa_django.models import EventRecord, RunRecord, SnapshotRecord
from aaa_django.store import rows

from . import timeline


class ReadOnlyAdmin(admin.ModelAdmin):
    """No add, change or delete, whatever the user's permissions (superusers too)."""

    actions = None
    show_full_result_count = False  # a COUNT(*) of the whole log on every page: no

    def has_add_permission(self, request: HttpRequest, obj: Model | None = None) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Model | None = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Model | None = None) -> bool:
        return False

    def get_queryset(self, request: HttpRequest) -> QuerySet:
        qs = super().get_queryset(request)
        if access.sees_all(request.user):
            return qs
        own = access.visible(request.user, RunRecord.objects.all()).values("run_id")
        return qs.filter(stream__in=own)


def _run_link(site: admin.AdminSite, run_id: str, suffix: str = "") -> str:
    """A link to the run's page on ``site``: the admin site serving this page, which
    need not be Django's default one."""
    url = reverse(f"{site.name}:aaa_runrecord_change", args=(quote(run_id),)) + suffix
    return format_html('<a href="{}">{}</a>', url, run_id)


#: an event list PostgreSQL's planner expects to hold more rows than this is counted
#: by that estimate, and says so ("about")
ESTIMATE_ABOVE = 100_000


class EstimatingPaginator(Paginator):
    """The event list's pages, and the run list's. Django's admin counts the list for
    its pages: on a long log a ``COUNT(*)`` of every event at every page (64-78 ms at 2
    million events, growing with the log; the estimate 0.7 ms; a million runs 47 ms,
    measured on ``benchmarks/bench_scale.py``'s tables).
    On PostgreSQL, a list the planner expects to exceed
    :data:`ESTIMATE_ABOVE` rows is counted by that estimate instead
    (``QuerySet.explain``: no row read), and the page says "about"; a shorter list
    (a run's events, a filter on a rare type) is counted exactly."""

    #: the count is the planner's estimate (the pagination template says "about")
    estimated = False

    @cached_property
    def count(self) -> int:
        queryset = self.object_list
        if isinstance(queryset, QuerySet) and connections[queryset.db].vendor == "postgresql":
            expected = int(json.loads(queryset.explain(format="json"))[0]["Plan"]["Plan Rows"])
            if expected > ESTIMATE_ABOVE:
                self.estimated = True
                return expected
        return super().count


def indexed_values(field: str, table: str) -> type[admin.SimpleListFilter]:
    """A list filter by ``field`` (a column of ``table`` that leads an index) whose
    choices are its values found one index probe a value (``rows.distinct``), where
    Django's filter of a field's values reads every row (``SELECT DISTINCT``) at every
    page: 77 ms for a million runs' outcomes, 77 ms for 2 million events' types. Its URL
    is Django's (``?outcome=...``). A user who sees only some runs gets the values of
    what they see (their rows are few); NULL is not offered (a run's outcome is NULL
    until it ends: the status filter finds those)."""

    class IndexedValuesFilter(admin.SimpleListFilter):
        title = field
        parameter_name = field

        def lookups(self, request: HttpRequest, model_admin: admin.ModelAdmin) -> list[tuple[str, str]]:
            queryset = model_admin.get_queryset(request)
            if access.sees_all(request.user):
                values = rows.distinct(connections[queryset.db], field, table)
            else:
                values = list(
                    queryset.exclude(**{f"{field}__isnull": True})
                    .order_by(field)
                    .values_list(field, flat=True)
                    .distinct()
                )
            return [(v, v or "(none)") for v in values]

        def queryset(self, request: HttpRequest, queryset: QuerySet) -> QuerySet:
            value = self.value()
            return queryset.filter(**{field: value}) if value else queryset

    IndexedValuesFilter.__name__ = IndexedValuesFilter.__qualname__ = f"{field.title()}Filter"
    return IndexedValuesFilter


#: the event list's filter by type
EventTypeFilter = indexed_values("type", "aaa_event")


class EventAdmin(ReadOnlyAdmin):
    list_display = ("seq", "run", "type", "time", "summary_col")
    list_filter = (EventTypeFilter,)
    paginator = EstimatingPaginator
    search_fields = ("=stream", "=id", "=causation")
    readonly_fields = ("id", "run", "seq", "type", "time", "causation", "tenant", "data", "blobs")
    fields = readonly_fields
    list_per_page = 50

    @admin.display(description="run", ordering="stream")
    def run(self, e: EventRecord) -> str:
        page = timeline.page_of(e.seq, timeline.PAGE_SIZE)
        return _run_link(self.admin_site, e.stream, f"?page={page}#e{e.seq}")

    @admin.display(description="summary")
    def summary_col(self, e: EventRecord) -> str:
        try:
            data = json.loads(e.data)
        except ValueError:
            data = {}
        claimed = isinstance(data, dict) and data.get("$claim") is True
        return timeline.summarize(
            e.type, data if isinstance(data, dict) else {"value": data}, claimed=claimed, blobs=e.blobs or []
        )


class SnapshotAdmin(ReadOnlyAdmin):
    list_display = ("stream_link", "name", "version", "seq", "saved_at")
    list_filter = ("name",)
    search_fields = ("=stream",)
    readonly_fields = ("stream_link", "name", "version", "seq", "event_id", "saved_at", "state")
    fields = readonly_fields

    @admin.display(description="run", ordering="stream")
    def stream_link(self, s: SnapshotRecord) -> str:
        return _run_link(self.admin_site, s.stream)
