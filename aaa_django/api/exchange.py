"""The REST API's export, import and fork of runs (on the same router as the rest).

- ``GET /runs/{id}/export``: the run as JSON Lines, its blobs inlined (whoever may see
  the run may export it).
- ``POST /imports``: an export as the body, as JSON Lines (``Content-Type:
  application/jsonl``, the file the export gives) or as one JSON object
  (:class:`~.schemas.ExportIn`); checked whole, every blob against its hash and in the
  run's own namespace, before anything is stored; the caller owns the imported run.
  Needs ``aaa.import_run``.
- ``POST /runs/{id}/fork``: a new run from the run's first ``at`` events, with its
  configuration changed by a JSON merge patch, and a new budget or deadline. Whoever
  may see the run and may start runs (``aaa.add_runrecord``) may fork it.
"""

from __future__ import annotations

import json
import logging
from typing import Any

from django.http import HttpRequest, HttpResponse, StreamingHttpResponse
from ninja.responses import Status
from pydantic import ValidationError

from aaa_django import access
from aaa_django.runtime.fork import ForkError, fork, merge_patch
from aaa_django.site.engines import site_blobs
from aaa_django.store import exchange, runindex

from . import agents, auth, runs
from .boundary import JSON_LINES, media_type, parse_json
from .contract import EXCHANGE
from .errors import ApiError, pydantic_errors
from .router import _READ, _WRITE, RunId, host, router
from .schemas import ErrorOut, ExportIn, ForkIn, RunDetailOut

log = logging.getLogger("aaa_django.api")

IMPORT = "aaa.import_run"


@router.get(
    "/runs/{run_id}/export",
    response={**_READ, 409: ErrorOut},
    summary="Export a run",
    operation_id="export_run",
    tags=[EXCHANGE],
    # 200 is declared here alone (a string key; ninja keys its own by int: see the
    # event stream's route)
    openapi_extra={
        "responses": {
            "200": {
                "description": "The run as JSON Lines: a header, its events, its blobs (base64).",
                "content": {exchange.MEDIA_TYPE: {"schema": {"type": "string"}}},
            }
        }
    },
)
def export_run(request: HttpRequest, run_id: str = RunId) -> StreamingHttpResponse:
    """The run's log and blobs as one JSON Lines file (``manage.py aaa_import`` or
    ``POST /imports`` on another site reads it)."""
    runs.load(request.auth, run_id)
    try:
        lines = exchange.export_run(run_id, using=runs.USING, blobs=site_blobs())
    except exchange.ExchangeError as exc:
        raise ApiError(409, ["path", "run_id"], str(exc), "not_exportable") from None
    response = StreamingHttpResponse(
        (line.encode("utf-8") for line in lines), content_type=f"{exchange.MEDIA_TYPE}; charset=utf-8"
    )
    response["Content-Disposition"] = f'attachment; filename="{run_id}.jsonl"'
    return response


def _inlined(schema: dict[str, Any]) -> dict[str, Any]:
    """A pydantic JSON schema with its ``$defs`` put in place of their ``$ref`` (a request
    body declared beside ninja's own components cannot point into ``$defs``)."""
    defs = schema.pop("$defs", {})

    def walk(node: Any) -> Any:
        if isinstance(node, dict):
            ref = node.get("$ref")
            if isinstance(ref, str) and ref.startswith("#/$defs/"):
                return walk(defs[ref[len("#/$defs/") :]])
            return {k: walk(v) for k, v in node.items()}
        if isinstance(node, list):
            return [walk(v) for v in node]
        return node

    return walk(schema)


IMPORT_BODY = {
    "requestBody": {
        "required": True,
        "content": {
            "application/json": {"schema": _inlined(ExportIn.model_json_schema())},
            exchange.MEDIA_TYPE: {
                "schema": {
                    "type": "string",
                    "format": "binary",
                    "description": "the file GET /runs/{run_id}/export gives: a header line, then one line "
                    "per event and per blob",
                }
            },
        },
    }
}


@router.post(
    "/imports",
    response={201: RunDetailOut, **_WRITE},
    summary="Import a run",
    operation_id="import_run",
    tags=[EXCHANGE],
    openapi_extra=IMPORT_BODY,
)
def import_run(request: HttpRequest, response: HttpResponse) -> Status:
    """Store an exported run with its ids: the export as JSON Lines (the file ``GET
    /runs/{run_id}/export`` gives) or as one JSON object (its header, with the events and
    blobs in full). 409 if the run exists here, 422 if it is not a sound export (a blob
    that does not match its hash, a missing event, a blob outside the run's own)."""
    p: auth.Principal = request.auth
    if not p.user.has_perm(IMPORT):
        raise ApiError(403, ["body"], f"importing runs needs the permission {IMPORT}", "permission_denied")
    try:
        export = exchange.read_export(_lines(request))
    except exchange.ExchangeError as exc:
        raise ApiError(422, ["body"], str(exc), "invalid_export") from None
    try:
        exchange.import_run(export, using=runs.USING, blobs=site_blobs(), owner=p.owner)
    except exchange.ExchangeConflict as exc:
        raise ApiError(409, ["body"], str(exc), "exists") from None
    except exchange.ExchangeError as exc:
        raise ApiError(422, ["body"], str(exc), "invalid_export") from None
    row = runindex.refresh(runs.USING, export.run_id)
    assert row is not None  # the run's events were just stored, its row with them
    response["Location"] = runs.run_url(request, export.run_id)
    log.info("run %s imported (%s events) by %s", export.run_id, len(export.events), p.label)
    return Status(201, runs.run_detail(request, row))


def _lines(request: HttpRequest) -> list[bytes]:
    """The export's lines, from either body (the boundary let only these two through)."""
    if media_type(request) in JSON_LINES:
        return request.body.splitlines()
    data = parse_json(request.body)
    try:
        ExportIn.model_validate(data)
    except ValidationError as exc:
        raise ApiError(422, errors=pydantic_errors(exc, ["body"])) from None
    header = {"aaa_export": data["aaa_export"], "run": data["run"], "events": len(data["events"]), "blobs": "inline"}
    records = [header, *({"event": e} for e in data["events"]), *data.get("blobs", ())]
    return [json.dumps(r, ensure_ascii=False).encode("utf-8") for r in records]


@router.post(
    "/runs/{run_id}/fork",
    response={201: RunDetailOut, **_WRITE},
    summary="Fork a run",
    operation_id="fork_run",
    tags=[EXCHANGE],
)
def fork_run(request: HttpRequest, response: HttpResponse, payload: ForkIn, run_id: str = RunId) -> Status:
    """A new run from this run's events 1..``at``, with its ``config`` changed by a JSON
    merge patch (RFC 7386), and a new ``budget`` or ``deadline`` if given. The new run
    records where it came from (``forked_from``); the caller owns it."""
    p: auth.Principal = request.auth
    row = runs.load(p, run_id)
    if not access.may_start(p.user):  # a fork is a new run: it spends the model budget too
        raise ApiError(403, ["auth"], f"you may not start runs (permission {access.START})", "permission_denied")
    given = payload.model_fields_set
    config = None
    if payload.config is not None:
        started = runs.hydrated(runs.store().read_sync(run_id, limit=1)[0])
        config = merge_patch(started.data.get("config") or {}, payload.config)
        agents.check(started.data.get("algorithm"), config, ["body", "config"])
    budget = payload.budget.model_dump(exclude_none=True) if payload.budget else None
    options: dict[str, Any] = {"budget": budget} if "budget" in given else {}
    if "deadline" in given:
        options["deadline"] = payload.deadline
    try:
        run = host().call(lambda engine: fork(engine, run_id, payload.at, config=config, owner=p.owner, **options))
    except ForkError as exc:
        raise ApiError(422, ["body", exc.field], str(exc), "invalid_fork") from None
    new = runindex.refresh(runs.USING, run.run_id)
    if new is None:
        raise ApiError(503, ["server", "index"], "the run index is behind; retry", "unavailable")
    response["Location"] = runs.run_url(request, new.run_id)
    log.info("run %s forked from %s at %s by %s", new.run_id, row.run_id, payload.at, p.label)
    return Status(201, runs.run_detail(request, new))
