"""The run actions of the admin: cancel, approve/deny, re-drive, erase, start.

Each is a POST (erase and start also have a page) that checks the user's permission
(403 without it, see :mod:`aaa_django.access`) and then makes one call on the engine through
:mod:`.engine`: nothing here writes to the log itself.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from django.contrib import messages
from django.contrib.admin import AdminSite
from django.core.exceptions import PermissionDenied
from django.db.models.options import Options
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.template.response import TemplateResponse
from django.urls import reverse
from django.utils.http import urlencode
from django.views.decorators.http import require_POST

from aaa_django.models import EventRecord, RunRecord
from aaa_django.runtime import RunNotEndedError, registry
from aaa_django.store import runindex

from . import engine
from .forms import ApprovalForm, ReasonForm
from .startform import StartRunForm, chosen_algorithm


class RunAdminViews:
    """What views mixed into :class:`~aaa_django.admin.runs.RunAdmin` use of it (a
    ``ModelAdmin``): declared for the type checker, provided by ``RunAdmin``."""

    if TYPE_CHECKING:
        admin_site: AdminSite
        opts: Options[RunRecord]

        def get_run(self, request: HttpRequest, object_id: str, action: str | None = None) -> RunRecord: ...

        def has_view_permission(self, request: HttpRequest, obj: RunRecord | None = None) -> bool: ...

        def has_add_permission(self, request: HttpRequest) -> bool: ...

        def has_module_permission(self, request: HttpRequest) -> bool: ...

        def _url(self, what: str, run_id: str, *args: object) -> str: ...

        def _using(self) -> str: ...

        def _context(self, request: HttpRequest, run: RunRecord, **extra: object) -> dict[str, object]: ...


class RunActions(RunAdminViews):
    """Views mixed into :class:`~aaa_django.admin.runs.RunAdmin`: the actions on a run."""

    def _acting(self, request: HttpRequest, object_id: str, action: str) -> RunRecord:
        return self.get_run(request, object_id, action)

    def _back(self, request: HttpRequest, run: RunRecord) -> HttpResponse:
        """After acting: to the run's page, or to the run list when the user may act
        on the run without seeing it (its page would be a 404 for them)."""
        if self.has_view_permission(request, run):
            return HttpResponseRedirect(self._url("change", run.run_id))
        return HttpResponseRedirect(self._changelist_url())

    def _changelist_url(self) -> str:
        return reverse(f"{self.admin_site.name}:{self.opts.app_label}_{self.opts.model_name}_changelist")

    def _done(self, request: HttpRequest, run: RunRecord, ok: bool, yes: str, no: str) -> HttpResponse:
        if ok:
            messages.success(request, yes)
        else:
            messages.warning(request, no)
        return self._back(request, run)

    def _engine_failed(self, request: HttpRequest, run: RunRecord, exc: Exception) -> HttpResponse:
        messages.error(request, f"The engine did not answer: {exc}")
        return self._back(request, run)

    def cancel_view(self, request: HttpRequest, object_id: str) -> HttpResponse:
        return require_POST(self._cancel)(request, object_id)

    def _cancel(self, request: HttpRequest, object_id: str) -> HttpResponse:
        run = self._acting(request, object_id, "cancel")
        form = ReasonForm(request.POST)
        reason = form.cleaned_data["reason"] if form.is_valid() else None
        try:
            ok = engine.cancel(run.run_id, user=request.user, reason=reason)
        except engine.EngineUnavailable as exc:
            return self._engine_failed(request, run, exc)
        return self._done(
            request, run, ok, "Cancellation requested.", "The run has ended already (or was asked to cancel before)."
        )

    def approve_view(self, request: HttpRequest, object_id: str) -> HttpResponse:
        return require_POST(self._decide)(request, object_id, grant=True)

    def deny_view(self, request: HttpRequest, object_id: str) -> HttpResponse:
        return require_POST(self._decide)(request, object_id, grant=False)

    def _decide(self, request: HttpRequest, object_id: str, *, grant: bool) -> HttpResponse:
        run = self._acting(request, object_id, "approve")
        form = ApprovalForm(request.POST)
        if not form.is_valid():
            messages.error(request, "Which approval? The form was incomplete.")
            return self._back(request, run)
        decide = engine.approve if grant else engine.deny
        try:
            ok = decide(
                run.run_id, form.cleaned_data["request_id"], user=request.user, reason=form.cleaned_data["reason"]
            )
        except engine.EngineUnavailable as exc:
            return self._engine_failed(request, run, exc)
        word = "Approved" if grant else "Denied"
        return self._done(
            request, run, ok, f"{word}.", "That approval is no longer pending (decided, expired, or the run ended)."
        )

    def redrive_view(self, request: HttpRequest, object_id: str) -> HttpResponse:
        return require_POST(self._redrive)(request, object_id)

    def _redrive(self, request: HttpRequest, object_id: str) -> HttpResponse:
        run = self._acting(request, object_id, "redrive")
        try:
            ok = engine.redrive(run.run_id)
        except engine.EngineUnavailable as exc:
            return self._engine_failed(request, run, exc)
        return self._done(
            request,
            run,
            ok,
            "The run's events were delivered again.",
            "The run has ended: there is nothing to re-drive.",
        )

    def erase_view(self, request: HttpRequest, object_id: str) -> HttpResponse:
        run = self._acting(request, object_id, "erase")
        if request.method == "POST" and request.POST.get("confirm") == run.run_id:
            try:
                count = engine.erase(run.run_id, using=self._using())
            except engine.EngineUnavailable as exc:
                return self._engine_failed(request, run, exc)
            except RunNotEndedError:  # the engine's rule, as over the API
                messages.error(request, f"Run {run.run_id} has not ended: cancel it, then erase it.")
                return self._back(request, run)
            messages.success(request, f"Run {run.run_id} erased: {count} events, its snapshots and blobs.")
            return HttpResponseRedirect(self._changelist_url())
        blob_events = EventRecord.objects.using(self._using()).filter(stream=run.run_id).exclude(blobs=[]).count()
        ctx = self._context(
            request,
            run,
            title=f"Erase run {run.run_id}?",
            crumb="erase",
            blob_events=blob_events,
            children=RunRecord.objects.using(self._using()).filter(parent=run.run_id).count(),
            wrong_confirmation=request.method == "POST",
        )
        return TemplateResponse(request, "aaa/admin/erase.html", ctx)

    # -- starting a run ------------------------------------------------------------------

    def add_view(
        self, request: HttpRequest, form_url: str = "", extra_context: dict[str, object] | None = None
    ) -> HttpResponse:
        """Start a run: the form of the chosen algorithm (``?algorithm=``; see
        :mod:`.startform`)."""
        if not self.has_add_permission(request):
            raise PermissionDenied
        if request.method == "POST":
            posted, shown = request.POST.get("algorithm"), request.POST.get("shown_for")
            if shown and posted != shown and registry.known(posted or ""):
                # another algorithm was chosen (no script): its own fields, empty
                return HttpResponseRedirect(f"{request.path}?{urlencode({'algorithm': posted})}")
            name = shown if registry.known(shown or "") else posted
            form = StartRunForm(request.POST, algorithm=name if registry.known(name or "") else None)
        else:
            form = StartRunForm(algorithm=chosen_algorithm(request.GET.get("algorithm")))
        run_id = self._start(request, form) if request.method == "POST" and form.is_valid() else None
        if run_id is not None:
            runindex.refresh(self._using(), run_id)
            messages.success(request, f"Run {run_id} started.")
            return HttpResponseRedirect(self._url("change", run_id))
        ctx = {
            **self.admin_site.each_context(request),
            "opts": self.opts,
            "app_label": self.opts.app_label,
            "title": "Start a run",
            "form": form,
        }
        return TemplateResponse(request, "aaa/admin/start.html", ctx)

    def _start(self, request: HttpRequest, form: StartRunForm) -> str | None:
        """Start the form's run; None (the form says why) if the engine refuses it."""
        d = form.cleaned_data
        try:
            refused = engine.start_errors(d["config"], d["budget"]) if d["budget"] else []
            if refused:
                form.add_start_errors(refused)
                return None
            return engine.start(
                d["instance"], d["input"], user=request.user, budget=d["budget"], deadline=d["deadline"]
            )
        except engine.EngineUnavailable as exc:
            form.add_error(None, f"The engine did not answer: {exc}")
            return None
