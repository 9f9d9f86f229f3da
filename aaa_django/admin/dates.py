"""The run list's date drill-down at any number of runs: the periods that hold runs,
found by probing the index of the date, period by period.

Django's date hierarchy asks its queryset's ``datetimes(field, kind)``: ``SELECT
DISTINCT`` of the truncated date of every row the list's filters keep (247-360 ms a
page at a million runs, ``benchmarks/bench_run_list.py``), at every page of the
list. :class:`ProbedDates` answers the same question with one query a period that
holds a row, and one more: the first row at or after the start of the next period
(``ORDER BY started_at LIMIT 1``, an index probe on ``aaa_run_started``). The answer
is Django's (the start of each period, in the current time zone, oldest first);
Django's template tag, its links and its titles are unchanged. The probes together
read at most what the one query did (each reads from its start to the next row the
filters keep); with no filter, or a filter the index's order serves, a handful of
index entries a period."""

from __future__ import annotations

from datetime import datetime, timedelta, tzinfo
from typing import Any

from django.conf import settings
from django.contrib import admin
from django.db import models
from django.http import HttpRequest
from django.utils import timezone

__all__ = ["ProbedDates", "StartedFilter", "period_start"]

#: the kinds of period probed (the date hierarchy's); any other is Django's query
PROBED = ("year", "month", "day")


class ProbedDates(models.QuerySet):
    """A queryset whose ``datetimes(field, kind)``, for a year, a month or a day in
    ascending order, probes period by period (see the module) and returns a list of
    the periods' starts, where Django's returns a query over every row."""

    def datetimes(self, field_name: str, kind: str, order: str = "ASC", tzinfo: tzinfo | None = None) -> Any:
        if kind not in PROBED or order != "ASC" or "__" in field_name:
            return super().datetimes(field_name, kind, order, tzinfo)
        tz = (tzinfo or timezone.get_current_timezone()) if settings.USE_TZ else None
        rows = self.filter(**{f"{field_name}__isnull": False}).order_by(field_name).values_list(field_name, flat=True)
        found: list[datetime] = []
        after: datetime | None = None
        while True:
            first = (rows if after is None else rows.filter(**{f"{field_name}__gte": after})).first()
            if first is None:
                return found
            start = period_start(first, kind, tz)
            if found and start <= found[-1]:  # (cannot be: each probe starts past the last period)
                raise AssertionError(f"{field_name} probe went back: {start} after {found[-1]}")
            found.append(start)
            after = _next_start(start, kind, tz)


def period_start(when: datetime, kind: str, tz: tzinfo | None) -> datetime:
    """The start of the ``kind`` (year, month, day) that ``when`` falls in, in ``tz``
    (None: ``when`` is naive, as the site keeps its times without ``USE_TZ``), as
    ``Trunc(..., tzinfo=tz)`` gives it."""
    local = timezone.localtime(when, tz).replace(tzinfo=None) if tz is not None else when
    naive = datetime(local.year, 1 if kind == "year" else local.month, local.day if kind == "day" else 1)
    return timezone.make_aware(naive, tz) if tz is not None else naive


def _next_start(start: datetime, kind: str, tz: tzinfo | None) -> datetime:
    """The start of the period after the one that starts at ``start``."""
    naive = start.replace(tzinfo=None)
    if kind == "year":
        naive = naive.replace(year=naive.year + 1)
    elif kind == "month":
        naive = (naive.replace(day=28) + timedelta(days=4)).replace(day=1)
    else:
        naive += timedelta(days=1)
    return timezone.make_aware(naive, tz) if tz is not None else naive


class StartedFilter(admin.DateFieldListFilter):
    """The run list's "started" filter: Django's periods, and the **past hour** (from the
    start of the minute an hour ago) and the **past 24 hours** first, for acting on
    what was just started (select all, then an action)."""

    def __init__(
        self,
        field: models.Field,
        request: HttpRequest,
        params: dict[str, list[str]],
        model: type[models.Model],
        model_admin: admin.ModelAdmin,
        field_path: str,
    ) -> None:
        super().__init__(field, request, params, model, model_admin, field_path)
        now = timezone.localtime(timezone.now()).replace(second=0, microsecond=0)
        until = {self.lookup_kwarg_until: now + timedelta(days=1)}
        recent = (
            ("Past hour", {self.lookup_kwarg_since: now - timedelta(hours=1), **until}),
            ("Past 24 hours", {self.lookup_kwarg_since: now - timedelta(hours=24), **until}),
        )
        links: tuple[Any, ...] = getattr(self, "links")  # Django's, set by its __init__
        self.links = (links[0], *recent, *links[1:])
