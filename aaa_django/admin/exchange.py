"""The admin's export, import, fork and run again: each a page or a download that calls
:mod:`aaa_django.store.exchange` or the engine (fork), never an ORM write on the log.

- **Export** (a run's page): the run as one JSON Lines file, blobs inlined, streamed.
  Whoever may see the run may export it.
- **Import** (the run list, with ``aaa.import_run``): upload an export; it is checked
  whole (every blob against its hash) before anything is stored; the run is yours.
- **Run again** (a run's page; the same permissions as a fork): a new run of the
  run's algorithm, input, config, budget and deadline (as long as the run had): a fork
  at its first event, so each run's page links to the other.
- **Fork** (a run's page, an event's page; with ``aaa.add_runrecord`` and the right to
  see the run): a new run from the run's first N events with an edited configuration,
  budget and deadline; the new run's page links back, the old one lists its forks.
"""

from __future__ import annotations

from django.contrib import messages
from django.core.exceptions import PermissionDenied
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect, StreamingHttpResponse
from django.template.response import TemplateResponse
from django.views.decorators.http import require_POST

from aaa_django.models import RunRecord
from aaa_django.runtime.fork import ForkError
from aaa_django.site.engines import site_blobs
from aaa_django.store import exchange, runindex

from . import engine, reading
from .actions import RunAdminViews
from .forms import ForkForm, ImportForm

IMPORT = "aaa.import_run"


class RunExchange(RunAdminViews):
    """Views mixed into :class:`~aaa_django.admin.runs.RunAdmin`: export, import, fork."""

    def export_view(self, request: HttpRequest, object_id: str) -> HttpResponse:
        run = self.get_run(request, object_id)
        try:
            lines = exchange.export_run(run.run_id, using=self._using(), blobs=site_blobs())
        except exchange.ExchangeError as exc:
            messages.error(request, f"Cannot export this run: {exc}")
            return HttpResponseRedirect(self._url("change", run.run_id))
        response = StreamingHttpResponse(
            (line.encode("utf-8") for line in lines), content_type=f"{exchange.MEDIA_TYPE}; charset=utf-8"
        )
        response["Content-Disposition"] = f'attachment; filename="{run.run_id}.jsonl"'
        response["Cache-Control"] = "private, no-store"
        return response

    def import_view(self, request: HttpRequest) -> HttpResponse:
        if not (self.has_module_permission(request) and request.user.has_perm(IMPORT)):
            raise PermissionDenied
        form = ImportForm(request.POST or None, request.FILES or None)
        if request.method == "POST" and form.is_valid():
            upload = form.cleaned_data["file"]
            try:
                export = exchange.read_export(upload)
                exchange.import_run(export, using=self._using(), blobs=site_blobs(), owner=str(request.user.pk))
            except exchange.ExchangeError as exc:
                form.add_error("file", f"Nothing was imported: {exc}")
            else:
                runindex.refresh(self._using(), export.run_id)
                messages.success(
                    request, f"Run {export.run_id} imported: {len(export.events)} events, {len(export.refs())} blobs."
                )
                return HttpResponseRedirect(self._url("change", export.run_id))
        ctx = {
            **self.admin_site.each_context(request),
            "opts": self.opts,
            "app_label": self.opts.app_label,
            "title": "Import a run",
            "form": form,
        }
        return TemplateResponse(request, "aaa/admin/import.html", ctx)

    def fork_view(self, request: HttpRequest, object_id: str) -> HttpResponse:
        run = self.get_run(request, object_id)
        if not self.has_add_permission(request):
            raise PermissionDenied
        started = reading.data_of(reading.event_at(run.run_id, 1, self._using())) or {}
        form = ForkForm(request.POST or None, initial=ForkForm.initial_for(run, started, request.GET))
        if request.method == "POST" and form.is_valid():
            d = form.cleaned_data
            try:
                new_id = engine.fork(
                    run.run_id,
                    d["at"],
                    user=request.user,
                    config=d["config"],
                    budget=d["budget"],
                    deadline=d["deadline"],
                )
            except ForkError as exc:
                form.add_error(None, str(exc))
            except engine.EngineUnavailable as exc:
                form.add_error(None, f"The engine did not answer: {exc}")
            else:
                runindex.refresh(self._using(), new_id)
                messages.success(request, f"Run {new_id} forked from {run.run_id} at event {d['at']}.")
                return HttpResponseRedirect(self._url("change", new_id))
        ctx = self._context(request, run, title=f"Fork run {run.run_id}", crumb="fork", form=form)
        return TemplateResponse(request, "aaa/admin/fork.html", ctx)

    def run_again_view(self, request: HttpRequest, object_id: str) -> HttpResponse:
        return require_POST(self._run_again)(request, object_id)

    def _run_again(self, request: HttpRequest, object_id: str) -> HttpResponse:
        run = self.get_run(request, object_id)
        if not self.has_add_permission(request):
            raise PermissionDenied
        try:
            new_id = engine.run_again(run.run_id, user=request.user)
        except ForkError as exc:
            messages.error(request, f"Cannot run it again: {exc}")
            return HttpResponseRedirect(self._url("change", run.run_id))
        except engine.EngineUnavailable as exc:
            messages.error(request, f"The engine did not answer: {exc}")
            return HttpResponseRedirect(self._url("change", run.run_id))
        runindex.refresh(self._using(), new_id)
        messages.success(request, f"Run {new_id} started: {run.run_id} again (its algorithm, input and config).")
        return HttpResponseRedirect(self._url("change", new_id))


def forks_of(using: str, run_id: str, limit: int) -> list[RunRecord]:
    """The runs forked from ``run_id`` (newest first)."""
    return list(RunRecord.objects.using(using).filter(forked_from=run_id).order_by("-started_at")[:limit])
