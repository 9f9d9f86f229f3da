"""Exceptions of the event log that a caller can act on."""

from __future__ import annotations


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
