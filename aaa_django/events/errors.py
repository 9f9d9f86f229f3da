"""Exceptions of the event log that a caller can act on."""

from __future__ import annotations

from aaa_django.data.errors import InfrastructureError

__all__ = [
    "ClosedStreamError",
    "ConcurrencyError",
    "EventError",
    "InfrastructureError",
    "InvalidEventError",
    "StoreUnavailable",
]


class EventError(Exception):
    """Base class of every event-log error."""


class InvalidEventError(EventError, ValueError):
    """An event is malformed (no type, data that is not a JSON object, ...).

    Raised before anything is written: a batch with one invalid event writes nothing.
    """


class ConcurrencyError(EventError):
    """A write would break the stream's dense ``seq``.

    Raised when an event carries a ``seq`` that is not the stream's next one, or when
    ``expected_seq`` does not match the stream head. Nothing is written; re-read the
    stream and decide again.
    """


class ClosedStreamError(EventError):
    """The stream takes no such event: nothing follows a run's ``aaa.run.completed``,
    and a run's stream (one whose first event is of the runtime's ``aaa.`` types)
    starts with its ``aaa.run.started``, so nothing is written to a run that has
    ended, was erased or never started.

    Raised before anything is written. The engine drops what was refused: a late
    result of a run that has ended is not part of its log.
    """


class StoreUnavailable(InfrastructureError, EventError):
    """The event store (or reading a claimed payload through it) failed.

    Raised through an algorithm's step so the engine does not mistake it for the
    algorithm's own failure: the delivery fails and is retried (or, persistent, the
    run ends ``failed`` naming it).
    """

    service = "event store"
