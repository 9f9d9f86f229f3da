"""The REST API: a django-ninja ``Router`` a site mounts in its own ``NinjaAPI``.

    from ninja import NinjaAPI
    from aaa_django.api import router as aaa_router

    api = NinjaAPI(urls_namespace="aaa")
    api.add_router("/", aaa_router)
    urlpatterns = [path("api/aaa/", api.urls)]

Endpoints (all authenticated; see :mod:`.auth`): start, list and get runs; page a
run's events or stream them (SSE); fold a projection; cancel; list and answer
approvals; erase. Writes go through the process's :class:`~aaa_django.site.host.EngineHost`
so the run goes on after the request returns; reads come from the log and the run
index. Errors: :mod:`.errors`.
"""

from __future__ import annotations

import hashlib
import json
import logging
from typing import Any

from asgiref.sync import async_to_sync
from django.core.handlers.asgi import ASGIRequest
from django.http import HttpRequest, HttpResponse, StreamingHttpResponse
from ninja import Body, Header, Path, Query, Router
from ninja.responses import Status

import aaa_django.algos  # noqa: F401  (registers the built-in algorithms by name)
from aaa_django import access
from aaa_django.conf import aaa_settings
from aaa_django.events import default_cache, derive_id
from aaa_django.models import EventRecord, RunRecord
from aaa_django.reading import projections
from aaa_django.reading.hydrated import hydrating
from aaa_django.runtime import RunNotEndedError, registry
from aaa_django.runtime.event_types import APPROVAL_EXPIRED, decision_id
from aaa_django.runtime.validation import start_errors
from aaa_django.site import tokens
from aaa_django.site.host import EngineHost
from aaa_django.store import runindex, wakeups
from aaa_django.validate import validate

from . import auth, runs, stream, streamcap, talk
from .boundary import boundary, parse_json
from .errors import ApiError, not_found, pydantic_errors, translate
from .schemas import (
    ID_PATTERN,
    KEY_PATTERN,
    MAX_SEQ,
    NAME_PATTERN,
    ApprovalOut,
    CancelIn,
    CancelOut,
    DecisionIn,
    DecisionOut,
    ErrorOut,
    EventPage,
    ProjectionOut,
    RunDetailOut,
    RunFilters,
    RunPage,
    StartIn,
    utc,
)

log = logging.getLogger("aaa_django.api")

router = Router(auth=auth.AUTH, tags=["runs"])
router.add_decorator(boundary, mode="view")
router.add_decorator(translate, mode="operation")

RunId = Path(..., pattern=ID_PATTERN, max_length=200, description="the run's id")

_AUTH = {401: ErrorOut, 429: ErrorOut}
_READ = {**_AUTH, 404: ErrorOut, 422: ErrorOut}
_WRITE = {**_READ, 400: ErrorOut, 403: ErrorOut, 409: ErrorOut, 413: ErrorOut, 415: ErrorOut,
          503: ErrorOut}


def host() -> EngineHost:
    return EngineHost.get()


# -- starting and listing runs ---------------------------------------------------------


@router.post("/runs", response={201: RunDetailOut, 200: RunDetailOut, **_WRITE},
             summary="Start a run")
def start_run(
    request: HttpRequest,
    response: HttpResponse,
    payload: StartIn,
    idempotency_key: str | None = Header(
        None, alias="Idempotency-Key", pattern=KEY_PATTERN,
        description="the same key and body return the same run; another body: 409",
    ),
):
    """Start a run of a registered algorithm: 201 with the run and its URL.

    The input is checked against the algorithm's input schema first: a bad input
    gets 422 and no run is created."""
    p: auth.Principal = request.auth
    if not access.may_start(p.user):
        raise ApiError(403, ["auth"], f"you may not start runs (permission {access.START})",
                       "permission_denied")
    cls = registry.get(payload.algorithm)
    try:
        instance = registry.build(payload.algorithm, payload.config or {})
    except Exception as exc:
        if hasattr(exc, "errors"):
            raise ApiError(422, errors=pydantic_errors(exc, ["body", "config"])) from None
        raise ApiError(422, ["body", "config"], f"not a valid config: {exc}", "invalid_config") from None
    errors = validate(cls, payload.input)
    if errors:
        raise ApiError(422, errors=pydantic_errors(errors, ["body", "input"]))
    conversation = talk.start_settings(payload.algorithm, payload.config, payload.conversation)
    budget = payload.budget.model_dump(exclude_none=True) if payload.budget else None
    if budget and budget.get("cost") is not None:  # the engine would refuse it: say so now
        async def priced(engine: Any) -> list[dict[str, Any]]:
            return start_errors(engine, payload.config, budget)

        unpriced = host().call(priced)
        if unpriced:
            raise ApiError(422, errors=pydantic_errors(unpriced, ["body"]))

    run_id = None
    digest = ""
    if idempotency_key is not None:
        run_id = "run-" + derive_id(f"aaa.api:{p.user.pk}", "Idempotency-Key", idempotency_key)
        digest = _digest(request.body)
        row = RunRecord.objects.using(runs.USING).filter(pk=run_id).first()
        if row is not None:
            return _replay(request, response, row, digest)

    algorithm = instance if payload.config is not None else payload.algorithm
    run = host().call(lambda engine: engine.start(
        algorithm, payload.input, budget=budget, deadline=payload.deadline,
        owner=p.owner, run_id=run_id, conversation=conversation,
    ))
    row = runindex.refresh(runs.USING, run.run_id)
    if row is None:  # the started event is committed: the index has it now
        raise ApiError(503, ["server", "index"], "the run index is behind; retry", "unavailable")
    if idempotency_key is not None:
        rows = RunRecord.objects.using(runs.USING).filter(pk=run.run_id)
        if rows.filter(request_hash="").update(request_hash=digest) == 0:
            # A concurrent request with the same key started it: same body, same run.
            return _replay(request, response, rows.first(), digest)
        row.request_hash = digest
    response["Location"] = runs.run_url(request, row.run_id)
    log.info("run %s (%s) started by %s", row.run_id, row.algorithm, p.label)
    return Status(201, runs.run_detail(request, row))


def _digest(body: bytes) -> str:
    canonical = json.dumps(parse_json(body), sort_keys=True, separators=(",", ":"),
                           ensure_ascii=False)
    return hashlib.sha256(canonical.encode("utf-8")).hexdigest()


def _replay(request: HttpRequest, response: HttpResponse, row: Any, digest: str):
    if row.request_hash and row.request_hash != digest:
        raise ApiError(409, ["header", "Idempotency-Key"],
                       "this key was used with another request body", "idempotency_conflict")
    response["Location"] = runs.run_url(request, row.run_id)
    response["Idempotent-Replayed"] = "true"
    return Status(200, runs.run_detail(request, runindex.refresh(runs.USING, row.run_id) or row))


@router.get("/runs", response={200: RunPage, **_READ}, summary="List runs")
def list_runs(request: HttpRequest, filters: Query[RunFilters]):
    """The runs the caller may see, newest first, filtered and paged."""
    rows = runs.visible(request.auth)
    f = filters
    for field in ("status", "outcome", "algorithm", "parent"):
        value = getattr(f, field)
        if value is not None:
            rows = rows.filter(**{field: value})
    try:
        after, before = utc(f.created_after), utc(f.created_before)
    except (OverflowError, ValueError):
        raise ApiError(422, ["query", "created_after"], "the time is out of range",
                       "datetime_range") from None
    if after is not None:
        rows = rows.filter(started_at__gte=after)
    if before is not None:
        rows = rows.filter(started_at__lt=before)
    rows = rows.order_by("-started_at", "-run_id")
    count = rows.count()
    page = rows[f.offset: f.offset + f.limit]
    return {
        "items": [runs.run_out(request, row) for row in page],
        "count": count,
        "limit": f.limit,
        "offset": f.offset,
    }


@router.get("/runs/{run_id}", response={200: RunDetailOut, **_READ}, summary="Get a run")
def get_run(request: HttpRequest, run_id: str = RunId):
    """Status, outcome and value, spend, times, budget and deadline of a run."""
    row = runs.load(request.auth, run_id)
    return runs.run_detail(request, row)


# -- events and projections --------------------------------------------------------------


@router.get("/runs/{run_id}/events", response={200: EventPage, **_READ},
            summary="Page a run's events")
def list_events(
    request: HttpRequest,
    run_id: str = RunId,
    after: int = Query(0, ge=0, le=MAX_SEQ, description="return events with a greater seq"),
    limit: int = Query(100, ge=1, le=1000),
    hydrate: bool = Query(False, description="restore claim-checked payloads"),
):
    """The run's events after ``after``, in order."""
    runs.load(request.auth, run_id)
    events = runs.store().read_sync(run_id, after=after, limit=limit + 1)
    more = len(events) > limit
    events = events[:limit]
    return {
        "items": runs.events_out(events, hydrate),
        "next_after": events[-1].seq if events else after,
        "has_more": more,
    }


@router.get(
    "/runs/{run_id}/events/stream",
    response=_READ,
    summary="Stream a run's events (SSE)",
    # 200 and 204 are declared here alone: ninja keys its responses by int, these are
    # strings, and declaring 204 in both wrote the key twice (Swagger UI refused it).
    openapi_extra={
        "responses": {
            "200": {
                "description": "Server-Sent Events: `id` is the event's seq, `data` the event "
                "as JSON; the stream ends after aaa.run.completed. With AAA['STREAM_TOKENS'], "
                "`event: token` messages (no id) carry a model reply's text as it comes "
                "(`data`: run_id, request_id, index, text), before the reply's event.",
                "content": {"text/event-stream": {"schema": {"type": "string"}}},
            },
            "204": {"description": "the run has ended and nothing is left after Last-Event-ID"},
        }
    },
)
def stream_events(
    request: HttpRequest,
    run_id: str = RunId,
    last_event_id: int | None = Header(
        None, alias="Last-Event-ID", ge=0, le=MAX_SEQ,
        description="resume after this seq (sent by EventSource on reconnect)",
    ),
    after: int = Query(0, ge=0, le=MAX_SEQ, description="start after this seq"),
    hydrate: bool = Query(False, description="restore claim-checked payloads"),
):
    """The run's events as they are appended, until it completes; resumable."""
    row = runs.load(request.auth, run_id)
    start = last_event_id if last_event_id is not None else after
    s = runs.store()
    ended = False
    if row.status == "completed":
        done = runs.completion_seq(run_id)
        ended = done is not None and start >= done
        if ended and not s.read_sync(run_id, after=start, limit=1):
            return HttpResponse(status=204)
    limit = aaa_settings()["API_STREAMS_PER_USER"]
    slot = streamcap.acquire(request.auth.user.pk, limit)
    if slot is None:
        raise ApiError(429, ["path", "run_id"],
                       f"too many open event streams: at most {limit} per user; close one",
                       "too_many_streams", headers={"Retry-After": str(stream.RETRY_MS // 1000)})
    blobs = runs.site_blobs() if hydrate else None

    def shape(e):
        return runs.event_out(runs.hydrated(e, blobs) if hydrate else e)

    # Under ASGI the async iterator: the stream holds no thread while it waits (a sync
    # one would be read to its end by Django before sending anything).
    drive = stream.aevents if isinstance(request, ASGIRequest) else stream.events
    body = drive(s, run_id, start, shape=shape, ended=ended, slot=slot,
                 wakeups=wakeups.for_database(runs.USING),
                 max_seconds=aaa_settings()["API_STREAM_SECONDS"],
                 subscribe=lambda: tokens.subscribe(run_id))
    response = StreamingHttpResponse(body, content_type="text/event-stream; charset=utf-8")
    response["Cache-Control"] = "no-cache"
    response["X-Accel-Buffering"] = "no"
    return response


@router.get("/runs/{run_id}/projections/{name}", response={200: ProjectionOut, **_READ},
            summary="Fold a projection of a run")
def get_projection(
    request: HttpRequest,
    run_id: str = RunId,
    name: str = Path(..., pattern=NAME_PATTERN, max_length=200,
                     description="a registered projection's name, or its last part"),
    at: int | None = Query(None, ge=0, le=MAX_SEQ, description="as of this event's seq"),
):
    """A registered projection's state over the run, now or as of event ``at``."""
    row = runs.load(request.auth, run_id)
    projection = projections.get(name)
    if projection is None:
        raise ApiError(404, ["path", "name"],
                       "no such projection; known: " + ", ".join(projections.names()),
                       "not_found")
    if at is not None and at > row.last_seq:
        head = runs.store().head_sync(run_id)
        if head is None or at > head[0]:
            raise ApiError(422, ["query", "at"],
                           f"the run has {head[0] if head else 0} events", "out_of_range")
    loaded = async_to_sync(projection.load_info)(
        hydrating(runs.store()), run_id, cache=default_cache, at=at
    )
    return {
        "name": projection.name,
        "version": projection.version,
        "seq": loaded.seq,
        "state": projections.state_json(loaded.state),
    }


# -- acting on a run ----------------------------------------------------------------------


@router.post("/runs/{run_id}/cancel", response={202: CancelOut, **_WRITE},
             summary="Cancel a run")
def cancel_run(request: HttpRequest, run_id: str = RunId, payload: CancelIn | None = Body(None)):
    """Ask for the run to end ``cancelled`` (its in-flight tool calls are cancelled).
    202 once the request is recorded; 409 if the run has ended."""
    p: auth.Principal = request.auth
    row = runs.load(p, run_id, "cancel")
    reason = payload.reason if payload is not None else None
    recorded = host().call(lambda engine: engine.cancel(run_id, reason=reason, by=p.label))
    row = runindex.refresh(runs.USING, run_id) or row
    if not recorded and row.status == "completed":
        raise ApiError(409, ["path", "run_id"], f"the run has ended ({row.outcome})", "run_ended")
    if recorded:
        log.info("run %s cancelled by %s", run_id, p.label)
    return Status(202, {"id": run_id, "cancel_requested": True, "status": row.status})


@router.get("/runs/{run_id}/approvals", response={200: list[ApprovalOut], **_READ},
            summary="List a run's approvals")
def list_approvals(request: HttpRequest, run_id: str = RunId):
    """Every approval gate of the run (pending ones first to answer), with the tool
    call it guards and its decision."""
    runs.load(request.auth, run_id)
    return runs.approvals(run_id)


@router.post("/runs/{run_id}/approvals/{request_id}", response={200: DecisionOut, **_WRITE},
             summary="Grant or deny an approval")
def decide_approval(
    request: HttpRequest,
    payload: DecisionIn,
    run_id: str = RunId,
    request_id: str = Path(..., pattern=ID_PATTERN, max_length=200,
                           description="the aaa.approval.requested event's id"),
):
    """Grant (the tool call runs) or deny (it fails with reason ``denied``) a pending
    approval; recorded with who answered and why."""
    p: auth.Principal = request.auth
    runs.load(p, run_id, "approve")
    gate = next((a for a in runs.approvals(run_id) if a["request_id"] == request_id), None)
    if gate is None:
        raise not_found(["path", "request_id"], "approval request in this run")
    if gate["status"] == "closed":
        raise ApiError(409, ["path", "request_id"], f"this approval is closed: {gate['reason']}",
                       "run_ended")
    if gate["status"] != "pending":
        raise ApiError(409, ["path", "request_id"], f"this approval was {gate['status']} already",
                       "decided")
    grant = payload.decision == "grant"
    reason = payload.reason

    async def decide(engine):
        fn = engine.approve if grant else engine.deny
        return await fn(run_id, request_id, by=p.label, reason=reason)

    recorded = host().call(decide)
    decision = (
        EventRecord.objects.using(runs.USING)
        .filter(pk=decision_id(request_id), stream=run_id)
        .values_list("type", flat=True)
        .first()
    )
    if not recorded or decision is None:
        row = runindex.refresh(runs.USING, run_id)
        why = "the run has ended" if row is not None and row.status == "completed" else (
            "it was decided meanwhile")
        raise ApiError(409, ["path", "request_id"], f"this approval is not pending: {why}",
                       "decided")
    if decision == APPROVAL_EXPIRED:
        raise ApiError(409, ["path", "request_id"],
                       "this approval had expired; it is recorded as expired", "expired")
    log.info("approval %s of run %s %s by %s", request_id, run_id, decision, p.label)
    return {"request_id": request_id, "decision": decision.rsplit(".", 1)[-1], "by": p.label,
            "reason": reason}


@router.delete("/runs/{run_id}", response={204: None, **_WRITE}, summary="Erase a run")
def erase_run(request: HttpRequest, run_id: str = RunId):
    """Erase a run that has ended: its events, snapshots and blobs. Cancel a run
    that is still going first (409 until it has ended)."""
    p: auth.Principal = request.auth
    row = runs.load(p, run_id, "erase")
    not_ended = ApiError(409, ["path", "run_id"], "the run has not ended: cancel it, then erase it",
                         "run_not_ended")
    if row.status != "completed":  # the index (written with the log) says so without a call
        raise not_ended
    try:  # the engine's rule, the admin's too
        count = host().call(lambda engine: engine.erase(run_id))
    except RunNotEndedError:
        raise not_ended from None
    runindex.forget(runs.USING, run_id)
    log.info("run %s erased (%s events) by %s", run_id, count, p.label)
    return Status(204, None)

