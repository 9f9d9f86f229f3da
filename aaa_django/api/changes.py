"""The caller's runs' changes, as one stream of Server-Sent Events: ``GET /changes``.

Each message is one run as ``GET /runs`` lists it (status, outcome, spend, times), sent
when the run starts and when its status, outcome, spend or end changes. Its ``id`` is
the change's position, ``"<n>.<run id>"`` (:mod:`aaa_django.store.changes`): positions
only increase along a stream. Without ``Last-Event-ID`` (or ``after``) the stream begins
with each run of the filter as it is now, in the order of their last changes, then goes
on with what changes. A client that reconnects sends the last id it saw and gets what
changed after it: nothing twice, nothing missed (a run that changed twice meanwhile
comes once, as it is now). ``follow=false`` ends the stream once what has changed is
sent (a client that catches up, then goes). The stream takes one of the caller's
``AAA["API_STREAMS_PER_USER"]`` places, as an event stream does.

A caller sees the runs it may see (:mod:`aaa_django.access`), narrowed by the filters
(algorithm, status at the change, ids, started after). On PostgreSQL the stream is
woken by every append (the database's notifications) and reads at most every
:data:`GAP` seconds; elsewhere it polls (:data:`~.stream.POLL`).
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass

from django.core.serializers.json import DjangoJSONEncoder
from django.db.models import QuerySet
from django.http import HttpRequest, StreamingHttpResponse
from ninja import Header, Query

from aaa_django.conf import aaa_settings
from aaa_django.models import RunRecord
from aaa_django.store import changes, wakeups

from . import runs, stream
from .contract import RUNS
from .errors import ApiError
from .router import router
from .schemas import POSITION_PATTERN, ChangeFilters, ErrorOut, RunOut, utc

#: seconds between two reads of a change stream at least (it is woken by every append)
GAP = 0.1

_RESPONSES = {
    "200": stream.sse_content(
        "Server-Sent Events: each message's `data` is a run as GET /runs lists it, sent when it "
        "starts and when its status, outcome, spend or end changes; its `id` the change's position "
        "(`<n>.<run id>`, increasing). Resumable with Last-Event-ID.",
        {"$ref": "#/components/schemas/RunOut"},
    )
}


@dataclass
class RunChanges:
    """The changes of the runs ``rows`` as a :class:`~.stream.Feed`; the cursor a
    position (None: from the first)."""

    rows: QuerySet[RunRecord]
    request: HttpRequest

    @property
    def key(self) -> str:
        return wakeups.ANY

    @property
    def using(self) -> str:
        return runs.USING

    def read(self, after: changes.Position | None) -> stream.Page:
        found = changes.after(self.rows, after, stream.PAGE)
        items = [(self.message(row), False) for row in found.rows]
        last = changes.position(found.rows[-1]) if found.rows else after
        return stream.Page(items, after=last, held=found.held, more=len(found.rows) == stream.PAGE and not found.held)

    def head(self) -> None:
        return None

    def message(self, row: RunRecord) -> str:
        data = RunOut.model_validate(runs.run_out(self.request, row)).model_dump()
        text = json.dumps(data, cls=DjangoJSONEncoder, separators=(",", ":"))
        return f"id: {changes.text(changes.position(row))}\ndata: {text}\n\n"


@router.get(
    "/changes",
    response={401: ErrorOut, 422: ErrorOut, 429: ErrorOut},
    summary="Stream the runs' changes (SSE)",
    operation_id="watch_runs",
    tags=[RUNS],
    openapi_extra={"responses": _RESPONSES},
)
def watch_runs(
    request: HttpRequest,
    filters: Query[ChangeFilters],
    last_event_id: str | None = Header(
        None,
        alias="Last-Event-ID",
        pattern=POSITION_PATTERN,
        max_length=220,
        description="resume after this change (sent by EventSource on reconnect)",
    ),
) -> StreamingHttpResponse:
    """The caller's runs as they start and change (status, outcome, spend, end), in the
    order of their changes; resumable."""
    rows = runs.visible(request.auth)
    f = filters
    if f.algorithm is not None:
        rows = rows.filter(algorithm=f.algorithm)
    if f.status is not None:
        rows = rows.filter(status=f.status)
    if f.ids is not None:
        rows = rows.filter(run_id__in=f.ids.split(","))
    if f.started_after is not None:
        try:
            rows = rows.filter(started_at__gte=utc(f.started_after))
        except (OverflowError, ValueError):
            raise ApiError(422, ["query", "started_after"], "the time is out of range", "datetime_range") from None
    cursor = last_event_id if last_event_id is not None else f.after
    loc = ["header", "Last-Event-ID"] if last_event_id is not None else ["query", "after"]
    try:
        position = changes.parse(cursor) if cursor is not None else None
    except ValueError as exc:
        raise ApiError(422, loc, str(exc), "invalid_position") from None
    slot = stream.open_slot(request, ["header", "Authorization"])  # (the caller's streams)
    hub = wakeups.for_database(runs.USING)
    steps = stream.plan(
        position,
        ended=not f.follow,
        max_seconds=aaa_settings()["API_STREAM_SECONDS"],
        renews=True,
        reliable=hub.reliable,
        clock=time.monotonic,
        checks_head=False,
        gap=GAP,
    )
    return stream.respond(request, steps, RunChanges(rows, request), wakeups=hub, slot=slot)
