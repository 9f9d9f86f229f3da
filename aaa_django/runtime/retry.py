"""Retrying, decided in one place: the backoff, what is worth retrying, and when a
delivery that failed is tried again.

- :class:`Backoff`: the delays between tries (the model clients' HTTP attempts, the
  buses' redeliveries): doubling up to a cap, less a random part, or a server's own
  ``Retry-After``.
- :func:`transient`: the one classification of a failed delivery. Adapters translate
  their drivers' errors into :class:`~aaa_django.events.InfrastructureError` at their
  boundary and say there whether the failure is transient; the core reads only that.
- :class:`Redelivery`: how often and after how long a bus delivers again an event
  whose delivery failed transiently; :func:`failure` the ``failed`` outcome's value of
  a run whose delivery failed for good.

Everything here is pure: the buses do the waiting.
"""

from __future__ import annotations

import traceback
from dataclasses import dataclass, field
from typing import NotRequired, TypedDict

from aaa_django.events import ConcurrencyError, InfrastructureError


@dataclass(frozen=True, slots=True)
class Backoff:
    """How long to wait between tries (seconds)."""

    initial: float = 0.5
    max: float = 8.0
    #: the longest ``Retry-After`` honoured; a longer one fails the call at once
    max_retry_after: float = 60.0
    #: up to this fraction of an exponential delay is taken off at random
    jitter: float = 0.25

    def delay(self, retry: int, retry_after: float | None = None, rand: float = 0.0) -> float | None:
        """Seconds to wait before retry number ``retry`` (1-based), or None when the
        server asked for longer than :attr:`max_retry_after`. ``rand`` is in [0, 1)."""
        if retry_after is not None:
            return max(0.0, retry_after) if retry_after <= self.max_retry_after else None
        base = min(self.max, self.initial * 2 ** (retry - 1))
        return base * (1.0 - self.jitter * rand)


def transient(exc: BaseException) -> bool:
    """Is a delivery that raised ``exc`` worth trying again?

    An :class:`~aaa_django.events.InfrastructureError` says so itself; a lost race
    (:class:`~aaa_django.events.ConcurrencyError`) is; so are Python's own
    ``ConnectionError`` and ``TimeoutError`` from a store no adapter translated.
    Anything else (a persistent infrastructure failure, a bug) would fail again.
    """
    if isinstance(exc, InfrastructureError):
        return exc.transient
    return isinstance(exc, (ConcurrencyError, ConnectionError, TimeoutError))


@dataclass(frozen=True, slots=True)
class Redelivery:
    """When a bus delivers again an event whose delivery failed transiently: up to
    ``retries`` times, after ``backoff``'s delays. About a minute in all by default,
    enough for a database or a broker to restart."""

    retries: int = 12
    backoff: Backoff = field(default_factory=lambda: Backoff(initial=0.1, max=10.0, jitter=0.25))

    def delay(self, retry: int, rand: float = 0.0) -> float | None:
        """Seconds before retry number ``retry`` (1-based); None when none is left."""
        if retry > self.retries:
            return None
        return self.backoff.delay(retry, None, rand)


class Failure(TypedDict):
    """The value of a ``failed`` outcome a delivery's failure ends a run with
    (:func:`failure`)."""

    error: str
    cause: str
    service: str | None
    transient: bool
    attempts: int
    event: str | None
    event_type: str | None
    #: where a bug raised (not for an infrastructure failure)
    traceback: NotRequired[str]


def failure(
    exc: BaseException, *, event_id: str | None = None, event_type: str | None = None, attempts: int = 1
) -> Failure:
    """The value of the ``failed`` outcome of a run whose delivery of an event failed
    for good: ``error`` names the cause (the service that failed, the exception),
    ``transient`` whether it was an outage that outlasted the retries, ``attempts``
    how many deliveries were tried."""
    service = exc.service if isinstance(exc, InfrastructureError) else None
    what = f"the {service} failed: " if service else ""
    value: Failure = {
        "error": f"{what}{type(exc).__name__}: {exc}",
        "cause": type(exc).__name__,
        "service": service,
        "transient": transient(exc),
        "attempts": attempts,
        "event": event_id,
        "event_type": event_type,
    }
    if not isinstance(exc, InfrastructureError):  # a bug: where it is
        value["traceback"] = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
    return value
