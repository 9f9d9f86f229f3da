"""Events and snapshots in the admin: read-only for everyone, superusers included.

They are the log and its derived snapshots; the only writers are the event store
and the projections. These pages let staff search them (by run, type, id) and jump
to the run page, where the timeline reads them in order.
"""

from __future__ import annotations

import json
from typing import Any

from django.contrib import admin
from django.contrib.admin.utils import quote
from django.http import HttpRequest
from django.urls import reverse
from django.utils.html import format_html

from aaa_django import access
from aaa_django.models import RunRecord

from . import timeline


class ReadOnlyAdmin(admin.ModelAdmin):
    """No add, change or delete, whatever the user's permissions (superusers too)."""

    actions = None
    show_full_result_count = False  # a COUNT(*) of the whole log on every page: no

    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def get_queryset(self, request: HttpRequest):
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


class EventAdmin(ReadOnlyAdmin):
    list_display = ("seq", "run", "type", "time", "summary_col")
    list_filter = ("type",)
    search_fields = ("=stream", "=id", "=causation")
    readonly_fields = ("id", "run", "seq", "type", "time", "causation", "tenant", "data", "blobs")
    fields = readonly_fields
    list_per_page = 50

    @admin.display(description="run", ordering="stream")
    def run(self, e: Any) -> str:
        page = timeline.page_of(e.seq, timeline.PAGE_SIZE)
        return _run_link(self.admin_site, e.stream, f"?page={page}#e{e.seq}")

    @admin.display(description="summary")
    def summary_col(self, e: Any) -> str:
        try:
            data = json.loads(e.data)
        except ValueError:
            data = {}
        claimed = isinstance(data, dict) and data.get("$claim") is True
        return timeline.summarize(e.type, data if isinstance(data, dict) else {"value": data},
                                  claimed=claimed, blobs=e.blobs or [])


class SnapshotAdmin(ReadOnlyAdmin):
    list_display = ("stream_link", "name", "version", "seq", "saved_at")
    list_filter = ("name",)
    search_fields = ("=stream",)
    readonly_fields = ("stream_link", "name", "version", "seq", "event_id", "saved_at", "state")
    fields = readonly_fields

    @admin.display(description="run", ordering="stream")
    def stream_link(self, s: Any) -> str:
        return _run_link(self.admin_site, s.stream)
