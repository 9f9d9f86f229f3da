"""The REST API's request and response bodies (pydantic, through django-ninja)."""

from __future__ import annotations

import re
import time
from datetime import UTC, datetime
from typing import Annotated, Any, Literal

from ninja import Schema
from pydantic import (
    BeforeValidator,
    ConfigDict,
    Field,
    StrictBool,
    StrictFloat,
    StrictInt,
    StrictStr,
    TypeAdapter,
    WithJsonSchema,
    field_validator,
)

from aaa_django.runtime.outcome import OUTCOMES

#: run ids and approval request ids: what the engine makes ("run-<uuid>", uuids)
ID_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._:\-]{0,199}$"
#: algorithm and projection names ("aaa.algos.ToolLoop", "RUNMETA")
NAME_PATTERN = r"^[A-Za-z0-9_.:\-]{1,200}$"
#: an Idempotency-Key: 1 to 200 printable ASCII characters
KEY_PATTERN = r"^[\x21-\x7e]{1,200}$"
#: the furthest deadline accepted (ten years)
MAX_DEADLINE_SECONDS = 10 * 365 * 24 * 3600
MAX_SEQ = 2**62
#: JavaScript's safe integers: counts beyond are not meaningful budgets
MAX_COUNT = 2**53
#: the most runs one request reads or follows by id
MAX_BATCH = 100

_RFC3339 = re.compile(r"^\d{4}-\d{2}-\d{2}[Tt]\d{2}:\d{2}:\d{2}(\.\d+)?([Zz]|[+-]\d{2}:\d{2})$")


def _rfc3339(value: object) -> object:
    # pydantic alone would also take 1700000000 or "2030-01-01" for a datetime; the
    # schema says an RFC 3339 date-time, so only that is accepted.
    if isinstance(value, datetime) or (isinstance(value, str) and _RFC3339.match(value)):
        return value
    raise ValueError("expected a date-time with a timezone, such as 2030-01-01T12:00:00Z")


#: an RFC 3339 date-time with its offset (the OpenAPI "date-time" format), nothing else
DateTime = Annotated[datetime, BeforeValidator(_rfc3339)]

#: seconds from now, or a date-time: one field, validated by StartIn (one clear error)
Deadline = Annotated[
    Any,
    WithJsonSchema(
        {
            "anyOf": [
                {"type": "number", "exclusiveMinimum": 0, "maximum": MAX_DEADLINE_SECONDS},
                {"type": "string", "format": "date-time"},
                {"type": "null"},
            ],
            "description": "seconds from now, or an RFC 3339 date-time with a timezone",
        }
    ),
]
_DATETIME = TypeAdapter(datetime)

Status = Literal["pending", "running", "waiting", "completed"]
OutcomeName = Literal[OUTCOMES]  # type: ignore[valid-type]


class ErrorItem(Schema):
    """One problem: where (``loc``), why (``msg``) and its kind (``type``)."""

    model_config = ConfigDict(extra="allow")

    loc: list[str | int]
    msg: str
    type: str


class ErrorOut(Schema):
    detail: list[ErrorItem]


# -- starting a run -------------------------------------------------------------------


class BudgetIn(Schema):
    """Spend limits; a missing field is unlimited."""

    model_config = ConfigDict(extra="forbid")

    tokens: StrictInt | None = Field(None, ge=0, le=MAX_COUNT)
    cost: StrictFloat | None = Field(None, ge=0, le=1e12)
    model_calls: StrictInt | None = Field(None, ge=0, le=MAX_COUNT)
    tool_calls: StrictInt | None = Field(None, ge=0, le=MAX_COUNT)


class ConversationIn(Schema):
    """A conversation's settings: ``idle``, the seconds it waits for the next message
    before it ends ``timeout`` (default ``AAA["CONVERSATION_IDLE"]``)."""

    model_config = ConfigDict(extra="forbid")

    idle: StrictFloat | StrictInt | None = Field(None, gt=0, le=MAX_DEADLINE_SECONDS)


class StartIn(Schema):
    """``algorithm``: a registered name; ``input``: checked against its input schema;
    ``config``: the algorithm's config (its defaults when left out); ``deadline``:
    seconds from now, or a time with a timezone; ``conversation``: true (or its
    settings) to hold a conversation: the run waits for the next message after each
    answer (``POST /runs/{id}/messages``)."""

    model_config = ConfigDict(
        extra="forbid",
        json_schema_extra={
            "examples": [
                {
                    "algorithm": "aaa.algos.ToolLoop",
                    "input": {"task": "How many people live in Lyon and Porto together?"},
                    "budget": {"model_calls": 5, "cost": 0.5},
                    "deadline": 300,
                }
            ]
        },
    )

    algorithm: StrictStr = Field(min_length=1, max_length=200)
    input: Any = None
    config: dict[str, Any] | None = None
    budget: BudgetIn | None = None
    deadline: Deadline = None
    conversation: StrictBool | ConversationIn | None = None

    @field_validator("deadline")
    @classmethod
    def _deadline(cls, v: object) -> float | datetime | None:
        return valid_deadline(v)


class ForkIn(Schema):
    """``at``: the seq of the last event kept from the run; ``config``: a JSON merge
    patch (RFC 7386) on the run's config (``{"model": "x"}``; ``null`` removes a key);
    ``budget`` and ``deadline``: the new run's (left out: the run's budget, and a
    deadline as far off as the run's was; ``null``: none)."""

    model_config = ConfigDict(
        extra="forbid",
        json_schema_extra={"examples": [{"at": 7, "config": {"model": "gpt-4o"}, "budget": {"model_calls": 10}}]},
    )

    at: StrictInt = Field(ge=1, le=MAX_SEQ)
    config: dict[str, Any] | None = None
    budget: BudgetIn | None = None
    deadline: Deadline = None

    @field_validator("deadline")
    @classmethod
    def _deadline(cls, v: object) -> float | datetime | None:
        return valid_deadline(v)


def valid_deadline(v: object) -> float | datetime | None:
    """A deadline as given: seconds from now (> 0) or an aware date-time in the future,
    at most ten years away."""
    if v is None:
        return v
    if isinstance(v, bool) or not isinstance(v, (int, float, str, datetime)):
        raise ValueError("a deadline is a number of seconds or a date-time string")
    if isinstance(v, str):
        _rfc3339(v)
        try:
            v = _DATETIME.validate_python(v)
        except ValueError:
            raise ValueError("not a valid date-time") from None
    if isinstance(v, datetime):
        if v.tzinfo is None or v.utcoffset() is None:
            raise ValueError("a deadline time needs a timezone (e.g. 2030-01-01T12:00:00Z)")
        try:
            ahead = v.timestamp() - time.time()
        except (OverflowError, ValueError, OSError):
            raise ValueError("the deadline is out of range") from None
        if ahead <= 0:
            raise ValueError("the deadline is in the past")
    else:
        try:
            ahead = v = float(v)
        except OverflowError:
            raise ValueError("the deadline is more than ten years away") from None
        if not ahead > 0:
            raise ValueError("a deadline in seconds must be greater than 0")
    if ahead > MAX_DEADLINE_SECONDS:
        raise ValueError("the deadline is more than ten years away")
    return v


# -- runs -----------------------------------------------------------------------------


class SpendOut(Schema):
    tokens: int
    tokens_in: int
    tokens_out: int
    cost: float
    model_calls: int
    tool_calls: int


class ForkedFrom(Schema):
    """The run a fork was made from, and the seq of the last event it kept."""

    run: str
    seq: int


class RunOut(Schema):
    id: str
    url: str
    algorithm: str
    status: Status
    outcome: OutcomeName | None = None
    owner: str | None = None
    parent: str | None = None
    forked_from: ForkedFrom | None = None
    spend: SpendOut
    started_at: datetime
    ended_at: datetime | None = None
    updated_at: datetime
    #: seq of the last event of the run the index has seen
    last_seq: int


class RunDetailOut(RunOut):
    #: the run's result (success) or the reason it ended otherwise; null until it ends
    value: Any = None
    budget: dict[str, Any] | None = None
    deadline: datetime | None = None
    #: a conversation's settings (``{"idle": seconds or null}``); null for other runs
    conversation: dict[str, Any] | None = None
    links: dict[str, str]


class RunPage(Schema):
    items: list[RunOut]
    count: int
    limit: int
    offset: int


class RunFilters(Schema):
    status: Status | None = None
    outcome: OutcomeName | None = None
    algorithm: str | None = Field(None, max_length=200, pattern=NAME_PATTERN)
    parent: str | None = Field(None, max_length=200, pattern=ID_PATTERN)
    created_after: DateTime | None = Field(None, description="started at or after this time")
    created_before: DateTime | None = Field(None, description="started before this time")
    limit: int = Field(50, ge=1, le=200)
    offset: int = Field(0, ge=0, le=10**9)


class BatchIn(Schema):
    """The ids of the runs to read (1 to 100; a repeated id is read once)."""

    model_config = ConfigDict(extra="forbid", json_schema_extra={"examples": [{"ids": ["run-a", "run-b"]}]})

    ids: list[Annotated[StrictStr, Field(pattern=ID_PATTERN, max_length=200)]] = Field(
        min_length=1, max_length=MAX_BATCH
    )


class RunBatch(Schema):
    #: the runs found, in the order asked, each as ``GET /runs/{id}`` shows it
    items: list[RunDetailOut]
    #: the ids asked for that name no run the caller may see
    missing: list[str]


#: one run id of a comma-separated list
_ID = r"[A-Za-z0-9][A-Za-z0-9._:\-]{0,199}"
#: a change stream's position (its messages' ``id``): ``<n>.<run id>``
POSITION_PATTERN = rf"^[0-9]{{1,18}}\.{_ID}$"


class ChangeFilters(Schema):
    """Which runs a change stream follows (all the caller may see, when none is given),
    and from where."""

    algorithm: str | None = Field(None, max_length=200, pattern=NAME_PATTERN, description="runs of this algorithm")
    status: Status | None = Field(None, description="runs whose status is this at the change")
    ids: str | None = Field(
        None,
        pattern=rf"^{_ID}(,{_ID}){{0,{MAX_BATCH - 1}}}$",
        max_length=MAX_BATCH * 201,
        description=f"these runs: comma-separated ids, at most {MAX_BATCH}",
    )
    started_after: DateTime | None = Field(None, description="runs started at or after this time")
    after: str | None = Field(
        None,
        pattern=POSITION_PATTERN,
        max_length=220,
        description="start after this change (an id the stream sent); Last-Event-ID wins over it",
    )
    follow: bool = Field(True, description="false: send what has changed, then end")


# -- events ---------------------------------------------------------------------------


class EventOut(Schema):
    id: str
    stream: str
    seq: int
    type: str
    data: dict[str, Any]
    causation: str | None = None
    #: ISO 8601 with microseconds, exactly as stored (the SSE stream sends the same)
    time: str = Field(json_schema_extra={"format": "date-time"})
    blobs: list[dict[str, Any]] = []
    tenant: str | None = None


class EventPage(Schema):
    items: list[EventOut]
    #: pass as ``after`` to get the next page
    next_after: int
    has_more: bool


class ExportBlobRef(Schema):
    """Where a blob is: its SHA-256, size, media type and namespace (its run's id)."""

    model_config = ConfigDict(extra="forbid")

    sha256: StrictStr = Field(pattern=r"^[0-9a-f]{64}$")
    size: StrictInt = Field(ge=0, le=MAX_COUNT)
    media_type: StrictStr = Field("application/octet-stream", min_length=1, max_length=255)
    namespace: StrictStr = Field("", max_length=200)


class ExportBlob(Schema):
    """A blob of the run: its ref and its bytes in base64."""

    model_config = ConfigDict(extra="forbid")

    blob: ExportBlobRef
    base64: StrictStr


class ExportEvent(Schema):
    """An event as stored (as ``GET /runs/{id}/events`` gives it)."""

    id: StrictStr = Field(min_length=1, max_length=200)
    stream: StrictStr = Field(min_length=1, max_length=200)
    seq: StrictInt = Field(ge=1, le=MAX_SEQ)
    type: StrictStr = Field(min_length=1, max_length=200)
    data: dict[str, Any]
    causation: StrictStr | None = None
    time: DateTime
    blobs: list[dict[str, Any]] = []
    tenant: StrictStr | None = None


class ExportIn(Schema):
    """A run's export as one JSON object (the JSON Lines export's header, with its events
    and blobs in full): ``aaa_export`` the format (1), ``run`` the run's id, ``events``
    its log from seq 1, ``blobs`` the blobs its events refer to."""

    model_config = ConfigDict(extra="forbid")

    aaa_export: Literal[1]
    run: StrictStr = Field(min_length=1, max_length=200)
    events: list[ExportEvent] = Field(min_length=1)
    blobs: list[ExportBlob] = []


class ProjectionOut(Schema):
    name: str
    version: int
    #: seq of the last event folded into ``state``
    seq: int
    state: Any = None


# -- acting on a run ------------------------------------------------------------------


class CancelIn(Schema):
    model_config = ConfigDict(extra="forbid")

    reason: StrictStr | None = Field(None, max_length=2000)


class CancelOut(Schema):
    id: str
    #: true once a cancellation is recorded (now or before); the run then ends ``cancelled``
    cancel_requested: bool
    status: Status


class ApprovalOut(Schema):
    request_id: str
    seq: int
    #: ``closed``: the run ended before anyone answered (it can no longer be answered)
    status: Literal["pending", "granted", "denied", "expired", "closed"]
    tool: str | None = None
    call_id: str | None = None
    args: dict[str, Any] | None = None
    tool_request_id: str | None = None
    requested_at: datetime
    expires_at: datetime | None = None
    decided_at: datetime | None = None
    decided_by: str | None = None
    reason: str | None = None


class DecisionIn(Schema):
    model_config = ConfigDict(extra="forbid")

    decision: Literal["grant", "deny"]
    reason: StrictStr | None = Field(None, max_length=2000)


class DecisionOut(Schema):
    request_id: str
    decision: Literal["granted", "denied", "expired"]
    by: str | None = None
    reason: str | None = None


def utc(dt: datetime | None) -> datetime | None:
    """A query's datetime in UTC (naive ones are taken as UTC)."""
    if dt is None:
        return None
    if dt.tzinfo is None:
        return dt.replace(tzinfo=UTC)
    return dt.astimezone(UTC)
