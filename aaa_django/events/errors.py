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


class ClosedStreamError(EventError):
    """The stream takes no such event: nothing follows a run's ``aaa.run.completed``,
    and a run's stream (one whose first event is of the runtime's ``aaa.`` types)
    starts with its ``aaa.run.started``, so nothing is written to a run that has
    ended, was erased or never started.

    Raised before anything is written. The engine drops what was refused: a late
    result of a run that has ended is not part of its log.
    """


class InfrastructureError(Exception):
    """A service the engine stands on failed: the event store's database, the blob
    store, the broker. Not the run's fault, nor the caller's.

    Adapters raise it at their boundary in place of their driver's errors (the driver's
    exception is its ``__cause__``), so the core decides on one classification:

    - ``transient``: an outage that retrying is expected to outlast (a lost
      connection, a restart, a timeout, throttling). A delivery is retried with
      backoff; the API answers 503 with ``Retry-After``.
    - persistent (``transient=False``): retrying repeats it (a missing bucket or
      table, refused credentials). The run it hits ends ``failed`` with this error's
      message as the reason.

    ``service`` names what failed (``"event store"``, ``"blob store"``, ``"broker"``).
    """

    service = "infrastructure"

    def __init__(self, message: str, *, transient: bool = True, service: str | None = None) -> None:
        super().__init__(message)
        self.transient = transient
        if service is not None:
            self.service = service

    def __reduce__(self):  # picklable with its flags (Celery stores a task's exception)
        return (_rebuild, (type(self), str(self), self.transient, self.service))


def _rebuild(cls: type, message: str, transient: bool, service: str) -> "InfrastructureError":
    return cls(message, transient=transient, service=service)


class StoreUnavailable(InfrastructureError, EventError):
    """The event store (or reading a claimed payload through it) failed.

    Raised through an algorithm's step so the engine does not mistake it for the
    algorithm's own failure: the delivery fails and is retried (or, persistent, the
    run ends ``failed`` naming it).
    """

    service = "event store"
