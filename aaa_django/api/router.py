"""The REST API: a django-ninja ``Router`` a site mounts in its own ``NinjaAPI``.

    from ninja import NinjaAPI
    from aaa_django.api import VERSION, router as aaa_router

    api = NinjaAPI(urls_namespace="aaa", version=VERSION)
    api.add_router("/", aaa_router)
    urlpatterns = [path("api/aaa/", api.urls)]

Endpoints (all authenticated; see :mod:`.auth`; their operation ids and tags are the
contract, :mod:`.contract`): start, list and get runs, one or several at once; page a
run's events or stream them (SSE); fold a projection; cancel; list and answer
approvals; erase. The change stream of many runs is :mod:`.changes`; export, import and
fork :mod:`.exchange`. Writes go through the process's :class:`~aaa_django.site.host.EngineHost`
so the run goes on after the request returns; reads come from the log and the run
index. Errors: :mod:`.errors`.
"""

from __future__ import annotations

import hashlib
import json
import logging
import time
from typing import Any

from asgiref.sync import async_to_sync
from django.http import HttpRequest, HttpResponse
from django.http.response import HttpResponseBase
from ninja import Body, Header, Path, Query, Router
from ninja.responses import Status

import aaa_django.algos  # noqa: F401  (registers the built-in algorithms by name)
from aaa_django import access
from aaa_django.conf import aaa_settings
from aaa_django.data.jsonvalue import JSONObject
from aaa_django.events import Event, default_cache, derive_id
from aaa_django.models import EventRecord, RunRecord
from aaa_django.reading import projections
from aaa_django.reading.hydrated import hydrating
from aaa_django.runtime import Engine, RunNotEndedError, offered, registry
from aaa_django.runtime.event_types import APPROVAL_EXPIRED, decision_id
from aaa_django.runtime.validation import start_errors
from aaa_django.site import tokens
from aaa_django.site.host import EngineHost
from aaa_django.store import runindex, wakeups
from aaa_django.validate import validate

from . import agents, auth, runs, stream, talk
from .boundary import boundary, parse_json
from .contract import APPROVALS, EVENTS, RUNS
from .errors import ApiError, not_found, pydantic_errors, translate
from .schemas import (
    ID_PATTERN,
    KEY_PATTERN,
    MAX_SEQ,
    NAME_PATTERN,
    ApprovalOut,
    BatchIn,
    CancelIn,
    CancelOut,
    DecisionIn,
    DecisionOut,
    ErrorOut,
    EventPage,
    ProjectionOut,
    RunBatch,
    RunDetailOut,
    RunFilters,
    RunPage,
    StartIn,
    utc,
)

log = logging.getLogger("aaa_django.api")

router = Router(auth=auth.AUTH, tags=[RUNS])
router.add_decorator(boundary, mode="view")
router.add_decorator(translate, mode="operation")

#: the data of an ``event: token`` message of an event stream
TOKEN = {
    "type": "object",
    "required": ["run_id", "request_id", "index", "text"],
    "properties": {
        "run_id": {"type": "string"},
        "request_id": {"type": "string"},
        "index": {"type": "integer"},
        "text": {"type": "string"},
    },
}

RunId = Path(..., pattern=ID_PATTERN, max_length=200, description="the run's id")

_AUTH = {401: ErrorOut, 429: ErrorOut}
_READ = {**_AUTH, 404: ErrorOut, 422: ErrorOut}
_WRITE = {**_READ, 400: ErrorOut, 403: ErrorOut, 409: ErrorOut, 413: ErrorOut, 415: ErrorOut, 503: ErrorOut}


def host() -> EngineHost:
    return EngineHost.get()


# -- starting and listing runs ---------------------------------------------------------


@router.post(
    "/runs",
    response={201: RunDetailOut, 200: RunDetailOut, **_WRITE},
    summary="Start a run",
    operation_id="start_run",
    tags=[RUNS],
)
def start_run(
    request: HttpRequest,
    response: HttpResponse,
    payload: StartIn,
    idempotency_key: str | None = Header(
        None,
        alias="Idempotency-Key",
        pattern=KEY_PATTERN,
        description="the same key and body return the same run; another body: 409",
    ),
) -> Status:
    """Start a run of a registered algorithm: 201 with the run and its URL.

    The input is checked against the algorithm's input schema first: a bad input
    gets 422 and no run is created."""
    p: auth.Principal = request.auth
    if not access.may_start(p.user):
        raise ApiError(403, ["auth"], f"you may not start runs (permission {access.START})", "permission_denied")
    cls = registry.get(payload.algorithm)
    agents.check(payload.algorithm, payload.config, ["body", "config"])  # before it is built
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
    names = offered.names_chosen(payload.algorithm, payload.config)
    if names or (budget and budget.get("cost") is not None):  # the engine would refuse it: say so now

        async def refused(engine: Any) -> list[dict[str, Any]]:
            return offered.tool_errors(engine, payload.algorithm, payload.config) + start_errors(
                engine, payload.config, budget
            )

        errors = host().call(refused)
        if errors:
            raise ApiError(422, errors=pydantic_errors(errors, ["body"]))

    run_id = None
    digest = ""
    if idempotency_key is not None:
        run_id = "run-" + derive_id(f"aaa.api:{p.user.pk}", "Idempotency-Key", idempotency_key)
        digest = _digest(request.body)
        row = RunRecord.objects.using(runs.USING).filter(pk=run_id).first()
        if row is not None:
            return _replay(request, response, row, digest)

    algorithm = instance if payload.config is not None else payload.algorithm
    run = host().call(
        lambda engine: engine.start(
            algorithm,
            payload.input,
            budget=budget,
            deadline=payload.deadline,
            owner=p.owner,
            run_id=run_id,
            conversation=conversation,
        )
    )
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
    canonical = json.dumps(parse_json(body), sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(canonical.encode("utf-8")).hexdigest()


def _replay(request: HttpRequest, response: HttpResponse, row: RunRecord, digest: str) -> Status:
    if row.request_hash and row.request_hash != digest:
        raise ApiError(
            409, ["header", "Idempotency-Key"], "this key was used with another request body", "idempotency_conflict"
        )
    response["Location"] = runs.run_url(request, row.run_id)
    response["Idempotent-Replayed"] = "true"
    return Status(200, runs.run_detail(request, runindex.refresh(runs.USING, row.run_id) or row))


@router.get("/runs", response={200: RunPage, **_READ}, summary="List runs", operation_id="list_runs", tags=[RUNS])
def list_runs(request: HttpRequest, filters: Query[RunFilters]) -> dict[str, object]:
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
        raise ApiError(422, ["query", "created_after"], "the time is out of range", "datetime_range") from None
    if after is not None:
        rows = rows.filter(started_at__gte=after)
    if before is not None:
        rows = rows.filter(started_at__lt=before)
    rows = rows.order_by("-started_at", "-run_id")
    count = rows.count()
    page = rows[f.offset : f.offset + f.limit]
    return {
        "items": [runs.run_out(request, row) for row in page],
        "count": count,
        "limit": f.limit,
        "offset": f.offset,
    }


# (before /runs/{run_id}: Django tries the router's paths in this order)
@router.post(
    "/runs/batch", response={200: RunBatch, **_WRITE}, summary="Get several runs", operation_id="get_runs", tags=[RUNS]
)
def get_runs(request: HttpRequest, payload: BatchIn) -> dict[str, object]:
    """Several runs by id, each as ``GET /runs/{run_id}`` shows it, in the order asked;
    ``missing``: the ids that name no run the caller may see (unknown or not theirs,
    alike)."""
    items, missing = [], []
    for run_id in dict.fromkeys(payload.ids):  # (once each, in order)
        try:
            row = runs.load(request.auth, run_id)
        except ApiError as exc:
            if exc.status != 404:
                raise
            missing.append(run_id)
            continue
        items.append(runs.run_detail(request, row))
    return {"items": items, "missing": missing}


@router.get(
    "/runs/{run_id}", response={200: RunDetailOut, **_READ}, summary="Get a run", operation_id="get_run", tags=[RUNS]
)
def get_run(request: HttpRequest, run_id: str = RunId) -> dict[str, object]:
    """Status, outcome and value, spend, times, budget and deadline of a run."""
    row = runs.load(request.auth, run_id)
    return runs.run_detail(request, row)


# -- events and projections --------------------------------------------------------------


@router.get(
    "/runs/{run_id}/events",
    response={200: EventPage, **_READ},
    summary="Page a run's events",
    operation_id="list_events",
    tags=[EVENTS],
)
def list_events(
    request: HttpRequest,
    run_id: str = RunId,
    after: int = Query(0, ge=0, le=MAX_SEQ, description="return events with a greater seq"),
    limit: int = Query(100, ge=1, le=1000),
    hydrate: bool = Query(False, description="restore claim-checked payloads"),
) -> dict[str, object]:
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
    operation_id="stream_events",
    tags=[EVENTS],
    # 200 and 204 are declared here alone: ninja keys its responses by int, these are
    # strings, and declaring 204 in both wrote the key twice (Swagger UI refused it).
    openapi_extra={
        "responses": {
            "200": stream.sse_content(
                "Server-Sent Events: `id` is the event's seq, `data` the event as JSON; the "
                "stream ends after aaa.run.completed. With AAA['STREAM_TOKENS'], `event: token` "
                "messages (no id) carry a model reply's text as it comes (`data`: run_id, "
                "request_id, index, text), before the reply's event.",
                {"anyOf": [{"$ref": "#/components/schemas/EventOut"}, TOKEN]},
            ),
            "204": {"description": "the run has ended and nothing is left after Last-Event-ID"},
        }
    },
)
def stream_events(
    request: HttpRequest,
    run_id: str = RunId,
    last_event_id: int | None = Header(
        None,
        alias="Last-Event-ID",
        ge=0,
        le=MAX_SEQ,
        description="resume after this seq (sent by EventSource on reconnect)",
    ),
    after: int = Query(0, ge=0, le=MAX_SEQ, description="start after this seq"),
    hydrate: bool = Query(False, description="restore claim-checked payloads"),
) -> HttpResponseBase:
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
    slot = stream.open_slot(request, ["path", "run_id"])
    blobs = runs.site_blobs() if hydrate else None

    def shape(e: Event) -> JSONObject:
        return runs.event_out(runs.hydrated(e, blobs) if hydrate else e)

    hub = wakeups.for_database(runs.USING)
    steps = stream.plan(
        start,
        ended=ended,
        max_seconds=aaa_settings()["API_STREAM_SECONDS"],
        renews=True,
        reliable=hub.reliable,
        clock=time.monotonic,
    )
    return stream.respond(
        request,
        steps,
        stream.RunEvents(s, run_id, shape),
        wakeups=hub,
        slot=slot,
        subscribe=lambda: tokens.subscribe(run_id),
    )


@router.get(
    "/runs/{run_id}/projections/{name}",
    response={200: ProjectionOut, **_READ},
    summary="Fold a projection of a run",
    operation_id="get_projection",
    tags=[EVENTS],
)
def get_projection(
    request: HttpRequest,
    run_id: str = RunId,
    name: str = Path(
        ..., pattern=NAME_PATTERN, max_length=200, description="a registered projection's name, or its last part"
    ),
    at: int | None = Query(None, ge=0, le=MAX_SEQ, description="as of this event's seq"),
) -> dict[str, object]:
    """A registered projection's state over the run, now or as of event ``at``."""
    row = runs.load(request.auth, run_id)
    projection = projections.get(name)
    if projection is None:
        raise ApiError(
            404, ["path", "name"], "no such projection; known: " + ", ".join(projections.names()), "not_found"
        )
    if at is not None and at > row.last_seq:
        head = runs.store().head_sync(run_id)
        if head is None or at > head[0]:
            raise ApiError(422, ["query", "at"], f"the run has {head[0] if head else 0} events", "out_of_range")
    loaded = async_to_sync(projection.load_info)(hydrating(runs.store()), run_id, cache=default_cache, at=at)
    return {
        "name": projection.name,
        "version": projection.version,
        "seq": loaded.seq,
        "state": projections.state_json(loaded.state),
    }


# -- acting on a run ----------------------------------------------------------------------


@router.post(
    "/runs/{run_id}/cancel",
    response={202: CancelOut, **_WRITE},
    summary="Cancel a run",
    operation_id="cancel_run",
    tags=[RUNS],
)
def cancel_run(request: HttpRequest, run_id: str = RunId, payload: CancelIn | None = Body(None)) -> Status:
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


@router.get(
    "/runs/{run_id}/approvals",
    response={200: list[ApprovalOut], **_READ},
    summary="List a run's approvals",
    operation_id="list_approvals",
    tags=[APPROVALS],
)
def list_approvals(request: HttpRequest, run_id: str = RunId) -> list[dict[str, object]]:
    """Every approval gate of the run (pending ones first to answer), with the tool
    call it guards and its decision."""
    runs.load(request.auth, run_id)
    return runs.approvals(run_id)


@router.post(
    "/runs/{run_id}/approvals/{request_id}",
    response={200: DecisionOut, **_WRITE},
    summary="Grant or deny an approval",
    operation_id="decide_approval",
    tags=[APPROVALS],
)
def decide_approval(
    request: HttpRequest,
    payload: DecisionIn,
    run_id: str = RunId,
    request_id: str = Path(
        ..., pattern=ID_PATTERN, max_length=200, description="the aaa.approval.requested event's id"
    ),
) -> dict[str, object]:
    """Grant (the tool call runs) or deny (it fails with reason ``denied``) a pending
    approval; recorded with who answered and why."""
    p: auth.Principal = request.auth
    runs.load(p, run_id, "approve")
    gate = next((a for a in runs.approvals(run_id) if a["request_id"] == request_id), None)
    if gate is None:
        raise not_found(["path", "request_id"], "approval request in this run")
    if gate["status"] == "closed":
        raise ApiError(409, ["path", "request_id"], f"this approval is closed: {gate['reason']}", "run_ended")
    if gate["status"] != "pending":
        raise ApiError(409, ["path", "request_id"], f"this approval was {gate['status']} already", "decided")
    grant = payload.decision == "grant"
    reason = payload.reason

    async def decide(engine: Engine) -> bool:
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
        why = "the run has ended" if row is not None and row.status == "completed" else ("it was decided meanwhile")
        raise ApiError(409, ["path", "request_id"], f"this approval is not pending: {why}", "decided")
    if decision == APPROVAL_EXPIRED:
        raise ApiError(409, ["path", "request_id"], "this approval had expired; it is recorded as expired", "expired")
    log.info("approval %s of run %s %s by %s", request_id, run_id, decision, p.label)
    return {"request_id": request_id, "decision": decision.rsplit(".", 1)[-1], "by": p.label, "reason": reason}


@router.delete(
    "/runs/{run_id}", response={204: None, **_WRITE}, summary="Erase a run", operation_id="erase_run", tags=[RUNS]
)
def erase_run(request: HttpRequest, run_id: str = RunId) -> Status:
    """Erase a run that has ended: its events, snapshots and blobs. Cancel a run
    that is still going first (409 until it has ended)."""
    p: auth.Principal = request.auth
    row = runs.load(p, run_id, "erase")
    not_ended = ApiError(409, ["path", "run_id"], "the run has not ended: cancel it, then erase it", "run_not_ended")
    if row.status != "completed":  # the index (written with the log) says so without a call
        raise not_ended
    try:  # the engine's rule, the admin's too
        count = host().call(lambda engine: engine.erase(run_id))
    except RunNotEndedError:
        raise not_ended from None
    runindex.forget(runs.USING, run_id)
    log.info("run %s erased (%s events) by %s", run_id, count, p.label)
    return Status(204, None)
