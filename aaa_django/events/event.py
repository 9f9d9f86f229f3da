"""The event: one immutable fact appended to a stream."""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from typing import Any

from aaa_django.data.refs import BlobRef

from .errors import InvalidEventError
from .ids import derive_id, new_id

_TYPE_RE = re.compile(r"^[A-Za-z0-9_\-]+(\.[A-Za-z0-9_\-]+)+$")
MAX_NAME = 200
MAX_DEPTH = 256


def utcnow() -> datetime:
    return datetime.now(UTC)


@dataclass(frozen=True, slots=True)
class Event:
    """One immutable fact in a stream.

    ``seq`` is assigned by the store (dense from 1 within a stream); an event built in
    memory has ``seq=None`` until it is appended. ``blobs`` holds the
    :class:`~aaa_django.data.BlobRef` of a claim-checked payload. ``data`` is shared
    by reference between readers: never mutate an event's data.
    """

    id: str
    stream: str
    type: str
    data: dict[str, Any] = field(default_factory=dict)
    seq: int | None = None
    causation: str | None = None
    time: datetime = field(default_factory=utcnow)
    blobs: tuple[BlobRef, ...] = ()
    tenant: str | None = None

    @classmethod
    def new(
        cls,
        stream: str,
        type: str,
        data: Mapping[str, Any] | None = None,
        *,
        id: str | None = None,
        causation: str | None = None,
        tenant: str | None = None,
        blobs: Iterable[BlobRef] = (),
    ) -> Event:
        """A root event with a fresh random id (or the given one)."""
        return cls(
            id=id or new_id(),
            stream=stream,
            type=type,
            data=dict(data or {}),
            causation=causation,
            tenant=tenant,
            blobs=tuple(blobs),
        )

    def derive(
        self,
        type: str,
        data: Mapping[str, Any] | None = None,
        *,
        key: object = "",
        stream: str | None = None,
    ) -> Event:
        """An event caused by this one, with a deterministic id.

        Deriving the same ``type`` and ``key`` from the same event twice gives the same
        id, so the second append is absorbed by the store.
        """
        return Event(
            id=derive_id(self.id, type, key),
            stream=stream or self.stream,
            type=type,
            data=dict(data or {}),
            causation=self.id,
            tenant=self.tenant,
        )

    def with_seq(self, seq: int) -> Event:
        return replace(self, seq=seq)

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict (golden logs, the REST API)."""
        return {
            "id": self.id,
            "stream": self.stream,
            "seq": self.seq,
            "type": self.type,
            "data": self.data,
            "causation": self.causation,
            "time": self.time.isoformat(),
            "blobs": [b.to_dict() if hasattr(b, "to_dict") else b for b in self.blobs],
            "tenant": self.tenant,
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Event:
        return cls(
            id=d["id"],
            stream=d["stream"],
            seq=d.get("seq"),
            type=d["type"],
            data=dict(d.get("data") or {}),
            causation=d.get("causation"),
            time=datetime.fromisoformat(d["time"]) if d.get("time") else utcnow(),
            blobs=decode_blobs(d.get("blobs") or ()),
            tenant=d.get("tenant"),
        )


# Each field's slot, set directly: a frozen dataclass's __init__ sets every field
# through object.__setattr__, a third of the cost of reading an event from a row.
_SET = tuple(
    Event.__dict__[name].__set__
    for name in ("id", "stream", "seq", "type", "data", "causation", "time", "blobs", "tenant")
)
_new = object.__new__


def stored_event(
    id: str,
    stream: str,
    seq: int,
    type: str,
    data: dict[str, Any],
    causation: str | None,
    time: datetime,
    blobs: tuple[BlobRef, ...],
    tenant: str | None,
) -> Event:
    """``Event(...)`` of values a store has read (already checked when they were
    appended), in the order of a row; the same event, made in less time (a store's
    reads make one per row)."""
    event = _new(Event)
    s_id, s_stream, s_seq, s_type, s_data, s_causation, s_time, s_blobs, s_tenant = _SET
    s_id(event, id)
    s_stream(event, stream)
    s_seq(event, seq)
    s_type(event, type)
    s_data(event, data)
    s_causation(event, causation)
    s_time(event, time)
    s_blobs(event, blobs)
    s_tenant(event, tenant)
    return event


#: the one encoder of event data (``json.dumps`` with arguments builds a new encoder at
#: every call: a third of the cost of encoding an event's data)
_ENCODER = json.JSONEncoder(ensure_ascii=False, allow_nan=False, separators=(",", ":"))


def encode_json(value: object) -> str:
    """Canonical JSON text of ``value``; raises ``InvalidEventError`` if it is not JSON."""
    try:
        return _ENCODER.encode(value)
    except (TypeError, ValueError) as exc:
        raise InvalidEventError(f"event data is not JSON-serialisable: {exc}") from None


def decode_blobs(raw: Iterable[BlobRef | Mapping[str, Any]]) -> tuple[BlobRef, ...]:
    """Blob refs from their JSON form (the blob layer owns the type)."""
    return tuple(r if isinstance(r, BlobRef) else BlobRef.from_dict(r) for r in raw)


def encode_blobs(blobs: Iterable[BlobRef | Mapping[str, Any]]) -> list[Mapping[str, object]]:
    return [b.to_dict() if isinstance(b, BlobRef) else dict(b) for b in blobs]


def check_event(event: object) -> str:
    """Validate an event before it is stored; return its data encoded as JSON text.

    Every store calls this for every event of a batch before writing any of them, so
    bad input raises :class:`InvalidEventError` and writes nothing.
    """
    if not isinstance(event, Event):
        raise InvalidEventError(f"expected an Event, got {type(event).__name__}")
    for name in ("id", "stream", "type"):
        value = getattr(event, name)
        if not isinstance(value, str) or not value.strip():
            raise InvalidEventError(f"event {name} must be a non-empty string, got {value!r}")
        if len(value) > MAX_NAME:
            raise InvalidEventError(f"event {name} is longer than {MAX_NAME} characters")
    if not _TYPE_RE.match(event.type):
        raise InvalidEventError(f"event type {event.type!r} must be dotted words such as 'aaa.run.started'")
    if not isinstance(event.data, dict):
        raise InvalidEventError(f"event data must be a JSON object, got {type(event.data).__name__}")
    if event.seq is not None and (not isinstance(event.seq, int) or event.seq < 1):
        raise InvalidEventError(f"event seq must be a positive integer, got {event.seq!r}")
    if event.causation is not None and not isinstance(event.causation, str):
        raise InvalidEventError("event causation must be an event id (a string)")
    if not isinstance(event.time, datetime) or event.time.tzinfo is None:
        raise InvalidEventError("event time must be a timezone-aware datetime")
    if event.tenant is not None and not isinstance(event.tenant, str):
        raise InvalidEventError("event tenant must be a string or None")
    _check_keys(event.data)
    return encode_json(event.data)


def _check_keys(value: Any) -> None:
    """Refuse data that would not read back as written, or not at all.

    json.dumps silently turns a key 1 into "1", so the stored event would differ from
    the one the caller built; data nested deeper than ``MAX_DEPTH`` (or containing
    itself) would end in a RecursionError rather than a clear error. Iterative, with
    exact type checks first: this runs for every appended event.
    """
    stack = [(value, 0)]
    while stack:
        v, depth = stack.pop()
        if depth > MAX_DEPTH:
            raise InvalidEventError(f"event data is nested deeper than {MAX_DEPTH} levels")
        if type(v) is dict or isinstance(v, dict):
            for k, x in v.items():
                if type(k) is not str and not isinstance(k, str):
                    raise InvalidEventError(f"event data keys must be strings, got {k!r}")
                t = type(x)
                if t in _CONTAINERS or (t not in _SCALARS and isinstance(x, (dict, list, tuple))):
                    stack.append((x, depth + 1))
        else:
            for x in v:
                t = type(x)
                if t in _CONTAINERS or (t not in _SCALARS and isinstance(x, (dict, list, tuple))):
                    stack.append((x, depth + 1))


_CONTAINERS = frozenset({dict, list, tuple})
_SCALARS = frozenset({str, int, float, bool, type(None)})
