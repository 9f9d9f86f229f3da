"""The run list's actions on the selected runs: cancel, re-drive, erase, export.

Django admin actions (``ModelAdmin.actions``), each with its permission (Django hides
an action from a user without it):

=========================  ===========================  ==========================================
Action                     Permission                   Does, through the engine
=========================  ===========================  ==========================================
Cancel the selected runs   ``aaa.cancel_run``           ``Engine.cancel`` each (with a reason)
Re-drive the selected      ``aaa.change_runrecord``     ``Engine.resume`` (delivers again what
runs                                                    an unfinished run's log holds)
Erase the selected runs    ``aaa.erase_run``            ``Engine.erase`` each run that has ended;
                                                        those that have not are named and kept
Export the selected runs   seeing the runs              a zip of one ``<run id>.jsonl`` per run
=========================  ===========================  ==========================================

Cancel, re-drive and erase first show a confirmation page (as Django's
``delete_selected`` does) saying what will happen to which runs; export downloads at
once. "Select all" across the list's pages selects every run its filters, search and
date drill-down keep: the confirmation page carries that selection (not the ids) and
the time it was shown, and the action takes the runs that match and had started by
then. Nothing here writes to the log: every change is a call on the engine
(:mod:`.engine`).
"""

from __future__ import annotations

import tempfile
import zipfile
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from django.contrib import admin, messages
from django.contrib.admin import helpers
from django.db.models import QuerySet
from django.http import FileResponse, HttpRequest, HttpResponse
from django.template.response import TemplateResponse
from django.utils import timezone

from aaa_django import access
from aaa_django.data.errors import BlobError
from aaa_django.site.engines import site_blobs
from aaa_django.store import exchange

from . import engine
from .forms import MAX_REASON

if TYPE_CHECKING:
    from django.contrib.admin import AdminSite
    from django.db.models.options import Options

    from aaa_django.models import RunRecord

#: runs named on a confirmation page (the rest are counted)
LISTED = 100
#: runs named in a message (the rest are counted)
NAMED = 20
#: the confirmation page's field: when it was shown (seconds since the epoch)
UNTIL = "aaa_until"
#: the export's bytes kept in memory before they spill to a temporary file
SPOOL = 8 * 1024 * 1024

WHAT = {
    "cancel": ("Cancel", "cancel", "cancel_selected"),
    "redrive": ("Re-drive", "re-drive", "redrive_selected"),
    "erase": ("Erase", "erase", "erase_selected"),
}


class RunBulkActions:
    """Mixed into :class:`~aaa_django.admin.runs.RunAdmin`: the run list's actions."""

    actions = ["cancel_selected", "redrive_selected", "export_selected", "erase_selected"]

    if TYPE_CHECKING:
        admin_site: AdminSite
        opts: Options[RunRecord]

        def has_module_permission(self, request: HttpRequest) -> bool: ...

        def message_user(
            self, request: HttpRequest, message: str, level: int = ..., extra_tags: str = ..., fail_silently: bool = ...
        ) -> None: ...

        def _using(self) -> str: ...

    # -- who may (Django asks ``has_<permission>_permission`` for each action) ---------

    def _may(self, request: HttpRequest, action: str) -> bool:
        return self.has_module_permission(request) and request.user.has_perm(access.ACTIONS[action])

    def has_cancel_permission(self, request: HttpRequest) -> bool:
        return self._may(request, "cancel")

    def has_redrive_permission(self, request: HttpRequest) -> bool:
        return self._may(request, "redrive")

    def has_erase_permission(self, request: HttpRequest) -> bool:
        return self._may(request, "erase")

    # -- the actions -------------------------------------------------------------------

    @admin.action(description="Cancel the selected runs…", permissions=["cancel"])
    def cancel_selected(self, request: HttpRequest, queryset: QuerySet) -> HttpResponse | None:
        return self._bulk(request, queryset, "cancel")

    @admin.action(description="Re-drive the selected runs…", permissions=["redrive"])
    def redrive_selected(self, request: HttpRequest, queryset: QuerySet) -> HttpResponse | None:
        return self._bulk(request, queryset, "redrive")

    @admin.action(description="Erase the selected runs that have ended…", permissions=["erase"])
    def erase_selected(self, request: HttpRequest, queryset: QuerySet) -> HttpResponse | None:
        return self._bulk(request, queryset, "erase")

    @admin.action(description="Export the selected runs (a zip of JSON Lines)", permissions=["view"])
    def export_selected(self, request: HttpRequest, queryset: QuerySet) -> HttpResponse:
        runs = list(queryset.order_by().values_list("run_id", flat=True))
        archive = tempfile.SpooledTemporaryFile(max_size=SPOOL)
        failed: list[str] = []
        with zipfile.ZipFile(archive, "w", compression=zipfile.ZIP_DEFLATED) as zf:
            for run_id in runs:
                error = _export_into(zf, run_id, self._using())
                if error:
                    failed.append(f"{run_id}: {error}")
            if failed:
                zf.writestr("errors.txt", "Not exported:\n" + "\n".join(failed) + "\n")
        archive.seek(0)
        stamp = timezone.now().strftime("%Y%m%d-%H%M%S")
        response = FileResponse(
            archive, as_attachment=True, filename=f"runs-{stamp}.zip", content_type="application/zip"
        )
        response["Cache-Control"] = "private, no-store"
        return response

    # -- confirm, then act ---------------------------------------------------------------

    def _bulk(self, request: HttpRequest, queryset: QuerySet, action: str) -> HttpResponse | None:
        until = _until(request.POST.get(UNTIL))
        if until is not None:  # what the confirmation page counted, not what started since
            queryset = queryset.filter(started_at__lte=until)
        rows = [
            (run_id, status, owner)
            for run_id, status, owner in queryset.order_by().values_list("run_id", "status", "owner_id")
            if access.may_act(request.user, owner, action)
        ]
        chosen = {r for r, _, _ in rows}
        ended = [r for r, status, _ in rows if status == "completed"]
        going = [r for r, status, _ in rows if status != "completed"]
        if request.POST.get("post") == "yes":
            try:
                self._act(request, action, going, ended)
            except engine.EngineUnavailable as exc:
                self.message_user(request, f"The engine did not answer: {exc}", messages.ERROR)
            return None  # Django goes back to the list, its filters kept
        title, verb, name = WHAT[action]
        shown = list(queryset.order_by("-started_at")[:LISTED])
        ctx = {
            **self.admin_site.each_context(request),
            "opts": self.opts,
            "app_label": self.opts.app_label,
            "title": f"{title} {len(rows)} run{'s' if len(rows) != 1 else ''}?",
            "action": action,
            "action_name": name,
            "verb": verb,
            "count": len(rows),
            "ended": ended,
            "going": going,
            "refused": going[:LISTED] if action == "erase" else [],
            "runs": shown,
            "more": max(len(rows) - len(shown), 0),
            # the posted ids that are in the selection (Django needs some, with "select all" too)
            "selected": [r for r in request.POST.getlist(helpers.ACTION_CHECKBOX_NAME) if r in chosen],
            "select_across": request.POST.get("select_across") == "1",
            "until_field": UNTIL,
            "until": until.timestamp() if until else timezone.now().timestamp(),
            "action_checkbox_name": helpers.ACTION_CHECKBOX_NAME,
            "max_reason": MAX_REASON,
        }
        return TemplateResponse(request, "aaa/admin/bulk_confirm.html", ctx)

    def _act(self, request: HttpRequest, action: str, going: list[str], ended: list[str]) -> None:
        if action == "cancel":
            reason = (request.POST.get("reason") or "").strip()[:MAX_REASON] or None
            asked = engine.cancel_many(going, user=request.user, reason=reason)
            said = [f"Cancellation requested for {_runs(len(asked))}."]
            skipped = len(going) - len(asked) + len(ended)
            if skipped:
                said.append(f"{_runs(skipped)} had ended already (or had been asked to cancel).")
            self.message_user(request, " ".join(said), messages.SUCCESS if asked else messages.WARNING)
        elif action == "redrive":
            adopted = engine.redrive_many(going)
            said = [f"The events of {_runs(len(adopted))} were delivered again."]
            skipped = len(going) - len(adopted) + len(ended)
            if skipped:
                said.append(f"{_runs(skipped)} had ended: nothing to re-drive.")
            self.message_user(request, " ".join(said), messages.SUCCESS if adopted else messages.WARNING)
        elif action == "erase":
            # The index's status is a hint: the engine decides what has ended.
            erased, refused = engine.erase_many([*ended, *going], using=self._using())
            if erased:
                self.message_user(
                    request,
                    f"{_runs(len(erased))} erased: {sum(erased.values())} events, their snapshots and blobs.",
                    messages.SUCCESS,
                )
            if refused:
                they = "it has" if len(refused) == 1 else "they have"
                self.message_user(
                    request,
                    f"{_runs(len(refused))} not erased: {they} not ended (cancel, then erase): {_names(refused)}.",
                    messages.ERROR,
                )


def _export_into(zf: zipfile.ZipFile, run_id: str, using: str) -> str | None:
    """Write the run's export as ``<run id>.jsonl`` into ``zf``; why not, if it fails
    (nothing of it is then written)."""
    with tempfile.SpooledTemporaryFile(max_size=SPOOL) as buffer:
        try:
            for line in exchange.export_run(run_id, using=using, blobs=site_blobs()):
                buffer.write(line.encode("utf-8"))
        except (exchange.ExchangeError, BlobError) as exc:
            return str(exc)
        buffer.seek(0)
        with zf.open(f"{run_id}.jsonl", "w") as entry:
            for chunk in iter(lambda: buffer.read(1024 * 1024), b""):
                entry.write(chunk)
    return None


def _until(raw: Any) -> datetime | None:
    try:
        return datetime.fromtimestamp(float(raw), tz=UTC)
    except (TypeError, ValueError, OverflowError, OSError):
        return None


def _runs(n: int) -> str:
    return f"{n} run{'s' if n != 1 else ''}"


def _names(ids: list[str]) -> str:
    shown = ", ".join(ids[:NAMED])
    return shown if len(ids) <= NAMED else f"{shown} and {len(ids) - NAMED} more"
