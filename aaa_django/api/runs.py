"""What the views need from the log and the index: finding a run the caller may see,
and shaping runs, events and approvals for the answers."""

from __future__ import annotations

import logging
from collections.abc import Iterable
from datetime import UTC, datetime

from django.db import DatabaseError
from django.db.models import QuerySet
from django.http import HttpRequest

from aaa_django import access
from aaa_django.data.jsonvalue import JSONObject
from aaa_django.events import Event
from aaa_django.models import EventRecord, RunRecord
from aaa_django.reading.hydrated import hydrated
from aaa_django.runtime.event_types import (
    APPROVAL_DECISIONS,
    APPROVAL_REQUESTED,
    RUN_COMPLETED,
    TOOL_REQUESTED,
    completion_id,
)
from aaa_django.site.engines import site_blobs
from aaa_django.store import DjangoEventStore, runindex

from . import auth
from .errors import ApiError, not_found

log = logging.getLogger("aaa_django.api")

#: the database alias the API reads and the host's engine writes
USING = "default"


def store() -> DjangoEventStore:
    return DjangoEventStore(USING)


# -- finding runs --------------------------------------------------------------------


def visible(p: auth.Principal) -> QuerySet:
    """The runs ``p`` may list."""
    return access.visible(p.user, RunRecord.objects.using(USING).select_related("owner"))


def load(p: auth.Principal, run_id: str, action: str | None = None) -> RunRecord:
    """The run's index row, caught up with its log, if ``p`` may see it, or do
    ``action`` to it (:func:`aaa_django.access.check`): else 404 (not seen) or 403."""
    try:
        row = runindex.refresh(USING, run_id)
    except DatabaseError:  # the index is a cache: a busy database still lets us read
        log.warning("refreshing the index of %s failed", run_id, exc_info=True)
        row = RunRecord.objects.using(USING).filter(pk=run_id).first()
    verdict = access.Verdict.NOT_FOUND if row is None else access.check(p.user, row.owner_id, action)
    if row is None or verdict is access.Verdict.NOT_FOUND:
        raise not_found(["path", "run_id"], "run")
    if verdict is access.Verdict.FORBIDDEN:
        permission = access.ACTIONS.get(action or "")
        raise ApiError(
            403, ["path", "run_id"], f"you may not {action} this run (permission {permission})", "permission_denied"
        )
    return row


#: the router's paths outside ``/runs``
OUTSIDE_RUNS = ("/imports", "/changes")


def run_url(request: HttpRequest, run_id: str) -> str:
    """The absolute URL of a run, from the URL of any of the router's endpoints."""
    path = request.path.partition("?")[0].rstrip("/")  # (a test client's path has its query)
    cut = path.rfind("/runs/")
    outside = next((p for p in OUTSIDE_RUNS if path.endswith(p)), None)
    if cut >= 0:
        base = path[: cut + len("/runs")]
    elif outside is not None:
        base = path[: -len(outside)] + "/runs"
    else:
        base = path
    return request.build_absolute_uri(f"{base}/{run_id}")


def run_out(request: HttpRequest, row: RunRecord) -> dict[str, object]:
    return {
        "id": row.run_id,
        "url": run_url(request, row.run_id),
        "algorithm": row.algorithm,
        "status": row.status,
        "outcome": row.outcome,
        "owner": row.owner.get_username() if row.owner_id is not None and row.owner else None,
        "parent": row.parent,
        "forked_from": {"run": row.forked_from, "seq": row.forked_at} if row.forked_from else None,
        "spend": {
            "tokens": row.tokens,
            "tokens_in": row.tokens_in,
            "tokens_out": row.tokens_out,
            "cost": row.cost,
            "model_calls": row.model_calls,
            "tool_calls": row.tool_calls,
        },
        "started_at": row.started_at,
        "ended_at": row.ended_at,
        "updated_at": row.updated_at,
        "last_seq": row.last_seq,
    }


def run_detail(request: HttpRequest, row: RunRecord) -> dict[str, object]:
    """``run_out`` with the value, budget, deadline and links. The status and the value
    agree: the completion is read first, and a row read before it (the run ended
    meanwhile) is caught up with the log, so a value never comes with a run still
    ``running``."""
    completed = completion(row.run_id)
    if completed is not None and row.status != "completed":
        row = runindex.refresh(USING, row.run_id) or row
        if row.status != "completed":  # the index could not catch up: say what the row says
            completed = None
    out = run_out(request, row)
    s = store()
    first = s.read_sync(row.run_id, limit=1)
    started = hydrated(first[0]) if first else None
    data = started.data if started is not None else {}
    deadline = data.get("deadline")
    url = out["url"]
    talk = data.get("conversation") if isinstance(data.get("conversation"), dict) else None
    out.update(
        value=completed.data.get("value") if completed is not None else None,
        budget=data.get("budget") or None,
        deadline=_from_timestamp(deadline),
        conversation=talk,
        links={
            "events": f"{url}/events",
            "stream": f"{url}/events/stream",
            "approvals": f"{url}/approvals",
            "questions": f"{url}/questions",
            "messages": f"{url}/messages",
            "cancel": f"{url}/cancel",
            "export": f"{url}/export",
            "fork": f"{url}/fork",
            **({"close": f"{url}/close"} if talk is not None else {}),
        },
    )
    return out


def _from_timestamp(value: object) -> datetime | None:
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        return None
    try:
        return datetime.fromtimestamp(value, UTC)
    except (OverflowError, ValueError, OSError):
        return None


def completion(run_id: str) -> Event | None:
    """The run's ``aaa.run.completed`` (never claim-checked), if it has ended."""
    seq = completion_seq(run_id)
    if seq is None:
        return None
    events = store().read_sync(run_id, after=seq - 1, limit=1)
    return events[0] if events else None


def completion_seq(run_id: str) -> int | None:
    return (
        EventRecord.objects.using(USING)
        .filter(pk=completion_id(run_id), stream=run_id)
        .values_list("seq", flat=True)
        .first()
    )


# -- approvals -----------------------------------------------------------------------


def approvals(run_id: str) -> list[dict[str, object]]:
    """Every approval gate of the run, in order, with its decision if it has one. A
    gate still open when the run ended can no longer be answered: it is ``closed``."""
    events = runindex.read_all(USING, run_id)
    by_id: dict[str, dict[str, object]] = {}
    requests: dict[str, Event] = {}
    for e in events:
        if e.type == TOOL_REQUESTED:
            requests[e.id] = e
        elif e.type == APPROVAL_REQUESTED:
            d = e.data
            tool_request = requests.get(d.get("tool_request_id") or "")
            args = None
            if tool_request is not None:
                args = hydrated(tool_request).data.get("args")
            by_id[e.id] = {
                "request_id": e.id,
                "seq": e.seq,
                "status": "pending",
                "tool": d.get("name"),
                "call_id": d.get("call_id"),
                "args": args if isinstance(args, dict) else None,
                "tool_request_id": d.get("tool_request_id"),
                "requested_at": e.time,
                "expires_at": _from_timestamp(d.get("expires_at")),
                "decided_at": None,
                "decided_by": None,
                "reason": None,
            }
        elif e.type in APPROVAL_DECISIONS:
            a = by_id.get(e.data.get("request_id") or "")
            if a is not None and a["status"] == "pending":
                a.update(
                    status=e.type.rsplit(".", 1)[-1],
                    decided_at=e.time,
                    decided_by=_text(e.data.get("by")),
                    reason=_text(e.data.get("reason")),
                )
        elif e.type == RUN_COMPLETED:
            why = f"the run ended ({e.data.get('outcome')}) before an answer"
            for a in by_id.values():
                if a["status"] == "pending":
                    a.update(status="closed", reason=why)
    return list(by_id.values())


def _text(value: object) -> str | None:
    return None if value is None else str(value)


def event_out(e: Event) -> JSONObject:
    return e.to_dict()


def events_out(events: Iterable[Event], hydrate_them: bool) -> list[JSONObject]:
    blobs = site_blobs() if hydrate_them else None
    return [event_out(hydrated(e, blobs) if hydrate_them else e) for e in events]
