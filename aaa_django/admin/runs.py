"""The Runs admin: the run list, the run page, one event, one blob, live updates.

The list is the run index (:class:`~aaa_django.models.RunRecord`, derived from the
log); the run page reads the log itself: a page of its timeline, every registered
projection (now or as of an earlier event), its blobs (verified), its parent and
children. The actions (:mod:`.actions`) are calls on the engine; nothing here writes
an event.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from django.contrib import admin
from django.contrib.admin.utils import quote, unquote
from django.core.exceptions import PermissionDenied
from django.core.handlers.asgi import ASGIRequest
from django.db.models import QuerySet
from django.http import (
    Http404,
    HttpRequest,
    HttpResponse,
    JsonResponse,
    StreamingHttpResponse,
)
from django.template.loader import render_to_string
from django.template.response import TemplateResponse
from django.urls import URLPattern, path, reverse
from django.utils import timezone
from django.utils.html import format_html
from pydantic import ValidationError

from aaa_django import access
from aaa_django.conf import aaa_settings
from aaa_django.data import is_claimed
from aaa_django.data.errors import BlobError
from aaa_django.events import Event
from aaa_django.models import EventRecord, RunRecord
from aaa_django.reading.hydrated import hydrated
from aaa_django.runtime import RUNMETA
from aaa_django.runtime import registry as algorithms
from aaa_django.runtime.event_types import APPROVAL_REQUESTED, TOOL_REQUESTED
from aaa_django.site import tokens
from aaa_django.store import runindex
from aaa_django.store.rows import to_event

from . import charts, graphs, livetokens, pictures, reading, timeline
from .actions import RunActions
from .attempts import model_calls
from .bulk import RunBulkActions
from .dates import ProbedDates, StartedFilter
from .exchange import RunExchange, forks_of
from .records import EstimatingPaginator, indexed_values
from .transcript import RunTranscript

if TYPE_CHECKING:
    from django.contrib.auth.base_user import AbstractBaseUser
    from django.utils.safestring import SafeString

    from aaa_django.runtime.meta import RunMeta

#: blobs listed (and verified) per page of the run page
BLOBS_PER_PAGE = 10
#: children listed on the run page
CHILDREN_SHOWN = 50
#: seconds between two polls of a live run's page
POLL_SECONDS = 1.0


def duration(run: RunRecord, now: datetime | None = None) -> timedelta | None:
    if run.started_at is None:
        return None
    end = run.ended_at or (now or timezone.now())
    return end - run.started_at


def format_duration(d: timedelta | None) -> str:
    if d is None:
        return "—"
    s = max(d.total_seconds(), 0.0)
    if s < 1:
        return f"{s * 1000:.0f} ms"
    if s < 60:
        return f"{s:.1f} s"
    m, s = divmod(int(s), 60)
    h, m = divmod(m, 60)
    return f"{h}h {m:02d}m {s:02d}s" if h else f"{m}m {s:02d}s"


VIEW = "aaa.view_runrecord"


def may_use_runs(user: AbstractBaseUser) -> bool:
    """Whether the admin offers the Runs pages to this user at all (which runs they
    see there and what they may do to them is :mod:`aaa_django.access`)."""
    if not (user.is_active and user.is_staff):
        return False
    perms = (VIEW, access.START, access.VIEW_ALL, *access.ACTIONS.values())
    return any(user.has_perm(p) for p in perms)


def status_label(run: RunRecord) -> str:
    return f"{run.status} · {run.outcome}" if run.outcome else run.status


def _timeline_events(run_id: str, using: str) -> list[tuple[str, int, str, float, str]]:
    """What the timeline picture needs of each event: id, seq, type, time and (a
    tool's, an approval's) name, in one query."""
    rows = EventRecord.objects.using(using).filter(stream=run_id)
    named = {}  # a tool call's (and its approval's) name: their data is small
    for seq, data in rows.filter(type__in=(TOOL_REQUESTED, APPROVAL_REQUESTED)).values_list("seq", "data"):
        try:
            named[seq] = str((json.loads(data) if isinstance(data, str) else data).get("name") or "")
        except (ValueError, AttributeError):
            pass
    return [
        (eid, seq, etype, at.timestamp(), named.get(seq, ""))
        for eid, seq, etype, at in rows.order_by("seq").values_list("id", "seq", "type", "time")
    ]


def _graph_events(run_id: str, using: str) -> list[Event]:
    """The events a graph picture reads (:data:`graphs.TYPES`), in one query; a
    claim-checked one hydrated only where the picture needs its payload."""
    rows = (
        EventRecord.objects.using(using)
        .filter(stream=run_id, type__in=graphs.TYPES)
        .order_by("seq")
        .values_list("id", "stream", "seq", "type", "data", "causation", "time", "blobs", "tenant")
    )
    events = [to_event(row) for row in rows]
    return [hydrated(e) if e.type in graphs.NEEDS_PAYLOAD else e for e in events]


@dataclass(frozen=True)
class RunGraph:
    """The run page's graph: its SVG, or why there is none; ``kind``: "workflow" or "fsm"."""

    svg: SafeString | None = None
    reason: str = ""
    kind: str = "workflow"


def run_graph(run: RunRecord, config: object, using: str) -> RunGraph | None:
    """The graph of a WorkflowGraph or FSM run (None for other algorithms)."""
    algorithm = algorithms.get(run.algorithm) if algorithms.known(run.algorithm) else None
    if algorithm is None or not graphs.draws(algorithm):
        return None
    kind = "fsm" if graphs.is_fsm(algorithm) else "workflow"
    if run.last_seq > pictures.TIMELINE_EVENTS:
        return RunGraph(reason=f"The graph is drawn for runs of up to {pictures.TIMELINE_EVENTS:,} events.", kind=kind)
    try:
        picture = graphs.graph_picture(algorithm, config, _graph_events(run.run_id, using))
    except ValidationError as exc:
        return RunGraph(
            reason=f"The run's config does not describe a graph ({exc.error_count()} error(s)): nothing to draw.",
            kind=kind,
        )
    except BlobError as exc:
        return RunGraph(reason=f"A child run's end cannot be read: {exc}", kind=kind)
    assert picture is not None  # graphs.draws(algorithm): a WorkflowGraph or an FSM, drawn
    return RunGraph(svg=pictures.graph(picture), kind=kind)


class RunAdmin(RunActions, RunExchange, RunBulkActions, RunTranscript, admin.ModelAdmin):
    list_display = (
        "run_link",
        "algorithm",
        "status_outcome",
        "owner",
        "tokens_col",
        "cost_col",
        "events_col",
        "started_col",
        "ended_col",
        "duration_col",
    )
    list_filter = (
        indexed_values("outcome", "aaa_run"),
        "status",
        indexed_values("algorithm", "aaa_run"),
        ("started_at", StartedFilter),
    )
    paginator = EstimatingPaginator
    search_fields = ("run_id", "owner__username", "owner__email")
    list_select_related = ("owner",)
    ordering = ("-started_at",)
    date_hierarchy = "started_at"
    list_per_page = 50
    show_full_result_count = False
    change_list_template = "aaa/admin/run_list.html"

    # -- columns ---------------------------------------------------------------------

    @admin.display(description="run", ordering="run_id")
    def run_link(self, run: RunRecord) -> str:
        rid = run.run_id
        short = rid if len(rid) <= 24 else f"{rid[:13]}…{rid[-8:]}"  # the whole id is the title
        return format_html('<a class="aaa-run-id" href="{}" title="{}">{}</a>', self._url("change", rid), rid, short)

    @admin.display(description="status / outcome", ordering="status")
    def status_outcome(self, run: RunRecord) -> str:
        css = run.outcome or run.status
        return format_html('<span class="aaa-badge aaa-{}">{}</span>', css, status_label(run))

    @admin.display(description="tokens", ordering="tokens_in")
    def tokens_col(self, run: RunRecord) -> str:
        return format_html(
            '<span title="{} in / {} out">{}</span>', f"{run.tokens_in:,}", f"{run.tokens_out:,}", f"{run.tokens:,}"
        )

    @admin.display(description="cost", ordering="cost")
    def cost_col(self, run: RunRecord) -> str:
        return f"${run.cost:.6f}"

    @admin.display(description="events", ordering="last_seq")
    def events_col(self, run: RunRecord) -> int:
        return run.last_seq  # seq is dense from 1: the last seq is the count

    @admin.display(description="started", ordering="started_at")
    def started_col(self, run: RunRecord) -> str:
        return _when(run.started_at)

    @admin.display(description="ended", ordering="ended_at")
    def ended_col(self, run: RunRecord) -> str:
        return _when(run.ended_at)

    @admin.display(description="duration")
    def duration_col(self, run: RunRecord) -> str:
        return format_duration(duration(run))

    def changelist_view(self, request: HttpRequest, extra_context: dict[str, object] | None = None) -> HttpResponse:
        may_import = request.user.has_perm("aaa.import_run")
        response = super().changelist_view(
            request, {"title": "Runs", "may_import": may_import, **(extra_context or {})}
        )
        if isinstance(response, TemplateResponse) and "cl" in (response.context_data or {}):
            # the runs the list shows, whatever page of them: its filters, search, date
            # drill-down and who may see what (the ChangeList's queryset, unpaginated)
            runs = response.context_data["cl"].queryset
            response.context_data["spend_chart"] = charts.spend_chart(charts.spend_per_day(runs))
        return response

    # -- who sees and acts -------------------------------------------------------------

    def get_queryset(self, request: HttpRequest) -> QuerySet:
        # Django's (the model's default manager's rows, in the admin's order), as a
        # queryset whose date drill-down probes the index (``dates.ProbedDates``)
        runs = ProbedDates(self.model, using=self.model._default_manager.db)
        ordering = self.get_ordering(request)
        return access.visible(request.user, runs.order_by(*ordering) if ordering else runs)

    def has_module_permission(self, request: HttpRequest) -> bool:
        return may_use_runs(request.user)

    def has_view_permission(self, request: HttpRequest, obj: RunRecord | None = None) -> bool:
        if obj is None:
            return may_use_runs(request.user)
        return may_use_runs(request.user) and access.may_see(request.user, obj.owner_id)

    def has_change_permission(self, request: HttpRequest, obj: RunRecord | None = None) -> bool:
        return False  # a run changes only through the engine (the actions below)

    def has_delete_permission(self, request: HttpRequest, obj: RunRecord | None = None) -> bool:
        return False  # erasing is an engine action with its own confirmation page

    # -- urls --------------------------------------------------------------------------

    def get_urls(self) -> list[URLPattern]:
        wrap = self.admin_site.admin_view
        name = f"{self.opts.app_label}_{self.opts.model_name}"
        run = "<path:object_id>"
        mine = [
            path(f"{run}/live/", wrap(self.live_view), name=f"{name}_live"),
            path(f"{run}/tokens/", wrap(self.tokens_view), name=f"{name}_tokens"),
            path(f"{run}/events/<int:seq>/", wrap(self.event_view), name=f"{name}_event"),
            path(f"{run}/events/<int:seq>/blobs/<int:index>/", wrap(self.blob_view), name=f"{name}_blob"),
            path(
                f"{run}/events/<int:seq>/blobs/<int:index>/download/",
                wrap(self.blob_download),
                name=f"{name}_blob_download",
            ),
            path(f"{run}/cancel/", wrap(self.cancel_view), name=f"{name}_cancel"),
            path(f"{run}/approve/", wrap(self.approve_view), name=f"{name}_approve"),
            path(f"{run}/deny/", wrap(self.deny_view), name=f"{name}_deny"),
            path(f"{run}/redrive/", wrap(self.redrive_view), name=f"{name}_redrive"),
            path(f"{run}/erase/", wrap(self.erase_view), name=f"{name}_erase"),
            path(f"{run}/export/", wrap(self.export_view), name=f"{name}_export"),
            path(f"{run}/fork/", wrap(self.fork_view), name=f"{name}_fork"),
            path(f"{run}/again/", wrap(self.run_again_view), name=f"{name}_again"),
            path(f"{run}/transcript/", wrap(self.transcript_view), name=f"{name}_transcript"),
            path(f"{run}/answer/", wrap(self.answer_view), name=f"{name}_answer"),
            path("import/", wrap(self.import_view), name=f"{name}_import"),
        ]
        return mine + super().get_urls()

    def _url(self, what: str, run_id: str, *args: object) -> str:
        name = f"{self.admin_site.name}:{self.opts.app_label}_{self.opts.model_name}_{what}"
        return reverse(name, args=(quote(run_id), *args))

    # -- reading a run -----------------------------------------------------------------

    def get_run(self, request: HttpRequest, object_id: str, action: str | None = None) -> RunRecord:
        """The run, its index row caught up with its log, if the user may see it (or
        do ``action`` to it): else 404 (unseen or unknown) or 403 (seen, not allowed)."""
        if not may_use_runs(request.user):
            raise PermissionDenied
        run = runindex.refresh(self._using(), unquote(object_id))
        verdict = access.Verdict.NOT_FOUND if run is None else access.check(request.user, run.owner_id, action)
        if run is None or verdict is access.Verdict.NOT_FOUND:
            raise Http404("no such run")
        if verdict is access.Verdict.FORBIDDEN:
            raise PermissionDenied
        return run

    def _using(self) -> str:
        return "default"

    def _context(self, request: HttpRequest, run: RunRecord, **extra: object) -> dict[str, object]:
        ctx = {
            **self.admin_site.each_context(request),
            "opts": self.opts,
            "app_label": self.opts.app_label,
            "run": run,
            "title": f"Run {run.run_id}",
            "run_url": self._url("change", run.run_id),
            # the run's own URLs are below this one: live/, events/N/, cancel/, ...
            "run_base": self._url("live", run.run_id)[: -len("live/")],
            "can": {**access.allowed_actions(request.user, run.owner_id), "fork": self.has_add_permission(request)},
        }
        ctx.update(extra)
        return ctx

    def change_view(
        self, request: HttpRequest, object_id: str, form_url: str = "", extra_context: dict[str, object] | None = None
    ) -> HttpResponse:
        run = self.get_run(request, object_id)
        using = self._using()
        size = timeline.page_size(request.GET.get("per"))
        page = timeline.load_page(run.run_id, run.last_seq, request.GET.get("page", 1), size, using=using)
        at = _int(request.GET.get("at"))
        if at is not None:
            at = min(max(at, 0), run.last_seq)
        eager = request.GET.get("fold") == "all"
        folded = reading.fold_all(
            run.run_id, at=at, using=using, events=run.last_seq, eager=eager, algorithm=run.algorithm
        )
        # The summary needs RUNMETA now; fold it apart when the page travels in time.
        meta = next((f.raw for f in folded if f.name == RUNMETA.name), None)
        if at is not None:
            meta = reading.runmeta(run.run_id, using=using).raw
        started = reading.event_at(run.run_id, 1, using)
        ended = reading.event_at(run.run_id, meta.completion_seq, using) if meta and meta.completion_seq else None
        blobs_page = max(_int(request.GET.get("blobs")) or 1, 1)
        blob_views, more_blobs = self._blobs(run.run_id, blobs_page, using)
        started_data = reading.data_of(started) or {}
        ctx = self._context(
            request,
            run,
            page=page,
            per=size,
            at=at,
            folded=folded,
            meta=meta,
            input_text=_pretty(started_data.get("input", started_data.get("$error"))),
            config_text=_pretty(started_data.get("config")),
            schema_text=_schema_text(started_data.get("config")),
            outcome_text=_pretty((reading.data_of(ended) or {}).get("value")) if ended else None,
            approvals=self._approvals(run.run_id, meta, using),
            attempts=model_calls(run.run_id, using),  # the attempts panel (_attempts.html)
            parent=RunRecord.objects.using(using).filter(pk=run.parent).first() if run.parent else None,
            children=list(
                RunRecord.objects.using(using).filter(parent=run.run_id).order_by("started_at")[:CHILDREN_SHOWN]
            ),
            origin=RunRecord.objects.using(using).filter(pk=run.forked_from).first() if run.forked_from else None,
            forks=forks_of(using, run.run_id, CHILDREN_SHOWN),
            blob_views=blob_views,
            blobs_page=blobs_page,
            more_blobs=more_blobs,
            duration=format_duration(duration(run)),
            deadline=_from_epoch(meta.deadline) if meta else None,
            budget_svg=pictures.budget_bars(meta.budget, meta.spend) if meta else None,
            timeline_svg=pictures.timeline(_timeline_events(run.run_id, using), time.time())
            if run.last_seq <= pictures.TIMELINE_EVENTS
            else None,
            timeline_max=pictures.TIMELINE_EVENTS,
            graph=run_graph(run, started_data.get("config"), using),
            status_label=status_label(run),
            live_url=self._url("live", run.run_id),
            poll_ms=int(POLL_SECONDS * 1000),
            # live tokens: only while the run goes and the site streams them
            tokens_url=self._url("tokens", run.run_id)
            if run.status != "completed" and aaa_settings()["STREAM_TOKENS"]
            else None,
        )
        return TemplateResponse(request, "aaa/admin/run.html", ctx)

    def _approvals(self, run_id: str, meta: RunMeta | None, using: str) -> list[dict[str, object]]:
        """Pending approval gates, with the arguments of the call they hold."""
        if meta is None or not meta.approvals or meta.completed:
            return []
        seqs = {p.seq: (rid, p) for rid, p in meta.approvals.items()}
        rows = EventRecord.objects.using(using).filter(stream=run_id, seq__in=list(seqs))
        args = {}
        for seq, data in rows.values_list("seq", "data"):
            try:
                args[seq] = json.loads(data).get("args")
            except (ValueError, AttributeError):
                args[seq] = None
        out = []
        for seq, (rid, p) in sorted(seqs.items()):
            out.append(
                {
                    "request_id": rid,
                    "seq": seq,
                    "name": p.name,
                    "call_id": p.call_id,
                    "args": json.dumps(args.get(seq), ensure_ascii=False, sort_keys=True),
                    "expires_at": _from_epoch(p.expires_at),
                }
            )
        return out

    def _blobs(self, run_id: str, number: int, using: str) -> tuple[list[reading.BlobView], bool]:
        """A page of the run's blob refs, each read and verified."""
        rows = list(
            EventRecord.objects.using(using)
            .filter(stream=run_id)
            .exclude(blobs=[])
            .order_by("seq")
            .values_list("seq", "blobs")[(number - 1) * BLOBS_PER_PAGE : number * BLOBS_PER_PAGE + 1]
        )
        more = len(rows) > BLOBS_PER_PAGE
        store = reading.site_blobs()
        views = [reading.check(v, store) for seq, raw in rows[:BLOBS_PER_PAGE] for v in reading.refs_of(seq, raw)]
        return views, more

    # -- live updates --------------------------------------------------------------------

    def live_view(self, request: HttpRequest, object_id: str) -> JsonResponse:
        """What changed since ``after``: the run's status and spend, new timeline rows
        (up to ``until``, the end of the page shown), the actions panel."""
        run = self.get_run(request, object_id)
        using = self._using()
        after = max(_int(request.GET.get("after")) or 0, 0)
        until = _int(request.GET.get("until")) or after
        size = timeline.page_size(request.GET.get("per"))
        new_rows = (
            timeline.rows(run.run_id, after=after, upto=min(until, after + size), size=size, using=using)
            if until > after
            else []
        )
        meta = reading.runmeta(run.run_id, using=using).raw
        ctx = self._context(request, run, per=size, meta=meta, approvals=self._approvals(run.run_id, meta, using))
        return JsonResponse(
            {
                "run_id": run.run_id,
                "status": run.status,
                "outcome": run.outcome,
                "label": status_label(run),
                "last_seq": run.last_seq,
                "tokens": f"{run.tokens:,} ({run.tokens_in:,} in / {run.tokens_out:,} out)",
                "cost": f"${run.cost:.6f}",
                "model_calls": run.model_calls,
                "tool_calls": run.tool_calls,
                "ended": timezone.localtime(run.ended_at).isoformat(sep=" ", timespec="seconds")
                if run.ended_at
                else "—",
                "duration": format_duration(duration(run)),
                "after": new_rows[-1].seq if new_rows else after,
                "rows_html": render_to_string(
                    "aaa/admin/_timeline_rows.html", {**ctx, "rows": new_rows}, request=request
                ),
                "actions_html": render_to_string("aaa/admin/_actions.html", ctx, request=request),
            }
        )

    def tokens_view(self, request: HttpRequest, object_id: str) -> HttpResponse:
        """The run's live tokens as Server-Sent Events (:mod:`.livetokens`); 204 (which
        tells an ``EventSource`` to stop) when the run has ended, the site does not
        stream tokens, or they cannot be read now."""
        run = self.get_run(request, object_id)
        subscription = tokens.subscribe(run.run_id) if run.status != "completed" else None
        if subscription is None:
            return HttpResponse(status=204)
        stream = livetokens.AsyncTokenStream if isinstance(request, ASGIRequest) else livetokens.TokenStream
        response = StreamingHttpResponse(stream(subscription), content_type="text/event-stream; charset=utf-8")
        response["X-Accel-Buffering"] = "no"  # a proxy passes each message on as it comes
        return response  # (admin_view marks it never cached)

    # -- one event, one blob ----------------------------------------------------------------

    def _event(self, run: RunRecord, seq: int) -> Event:
        found = reading.event_at(run.run_id, seq, self._using())
        if found is None:
            raise Http404("no such event")
        return found

    def event_view(self, request: HttpRequest, object_id: str, seq: int) -> HttpResponse:
        run = self.get_run(request, object_id)
        event = self._event(run, seq)
        claimed = is_claimed(event.data)
        hydrated_text = error = None
        if claimed and request.GET.get("hydrate"):
            try:
                hydrated_text = _pretty(reading.hydrated(event, reading.site_blobs()).data)
            except BlobError as exc:
                error = f"{type(exc).__name__}: {exc}"
        size = timeline.page_size(request.GET.get("per"))
        cause = None
        if event.causation:
            cause = (
                EventRecord.objects.using(self._using()).filter(pk=event.causation).values_list("stream", "seq").first()
            )
        ctx = self._context(
            request,
            run,
            title=f"Event {seq} of run {run.run_id}",
            crumb=f"event {seq}",
            event=event,
            data_text=_pretty(event.data),
            summary=timeline.summarize(
                event.type, event.data, claimed=claimed, blobs=[b.to_dict() for b in event.blobs]
            ),
            claimed=claimed,
            hydrated_text=hydrated_text,
            error=error,
            blob_refs=[reading.BlobView(seq=seq, index=i, ref=b) for i, b in enumerate(event.blobs)],
            cause=cause,
            cause_url=(self._url("change", cause[0]) + f"?page={timeline.page_of(cause[1], size)}#e{cause[1]}")
            if cause
            else None,
            timeline_url=f"{self._url('change', run.run_id)}?page={timeline.page_of(seq, size)}#e{seq}",
        )
        return TemplateResponse(request, "aaa/admin/event.html", ctx)

    def _blob_ref(self, run: RunRecord, seq: int, index: int) -> reading.BlobView:
        event = self._event(run, seq)
        if not 0 <= index < len(event.blobs):
            raise Http404("no such blob")
        return reading.BlobView(seq=seq, index=index, ref=event.blobs[index])

    def blob_view(self, request: HttpRequest, object_id: str, seq: int, index: int) -> HttpResponse:
        run = self.get_run(request, object_id)
        view = reading.check(self._blob_ref(run, seq, index), reading.site_blobs(), keep=True)
        ctx = self._context(
            request,
            run,
            title=f"Blob {view.ref.sha256[:12]}… of run {run.run_id}",
            blob=view,
            crumb=f"event {seq} blob",
        )
        return TemplateResponse(request, "aaa/admin/blob.html", ctx, status=200 if view.ok else 409)

    def blob_download(self, request: HttpRequest, object_id: str, seq: int, index: int) -> HttpResponse:
        """The blob's bytes, read through the storage and verified before any is sent."""
        run = self.get_run(request, object_id)
        view = reading.check(self._blob_ref(run, seq, index), reading.site_blobs(), keep=True)
        if not view.ok:
            ctx = self._context(request, run, title="Blob download refused", blob=view)
            return TemplateResponse(request, "aaa/admin/blob.html", ctx, status=409)
        data = view.data or b""
        chunk = 64 * 1024
        response = StreamingHttpResponse(
            (data[i : i + chunk] for i in range(0, len(data), chunk)),
            content_type=view.ref.media_type,
        )
        response["Content-Length"] = str(len(data))
        response["Content-Disposition"] = f'attachment; filename="{view.ref.sha256}"'
        response["X-Content-Type-Options"] = "nosniff"
        response["Cache-Control"] = "private, no-store"
        return response


# -- helpers ---------------------------------------------------------------------------------


def _when(t: datetime | None) -> str:
    if t is None:
        return "—"
    t = timezone.localtime(t)
    return format_html(
        '<span title="{}">{}</span>', t.isoformat(sep=" ", timespec="milliseconds"), t.strftime("%Y-%m-%d %H:%M")
    )


def _from_epoch(seconds: float | None) -> datetime | None:
    """A time the log keeps as seconds since the epoch (a deadline, an expiry), in the
    site's time zone."""
    if seconds is None:
        return None
    try:
        return datetime.fromtimestamp(seconds, tz=timezone.get_current_timezone())
    except (OverflowError, OSError, ValueError):
        return None


def _int(raw: Any) -> int | None:
    try:
        return int(raw)
    except (TypeError, ValueError):
        return None


def _schema_text(config: object) -> str | None:
    """The JSON schema of the run's structured result, if its config has one
    (``output_schema``: ToolLoop, ReAct, PydanticAIAgent)."""
    schema = config.get("output_schema") if isinstance(config, dict) else None
    return _pretty(schema) if schema else None


def _pretty(value: object) -> str:
    return json.dumps(value, indent=2, ensure_ascii=False, default=str)
