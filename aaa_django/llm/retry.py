"""The one retry policy of the provider clients.

A call is made of HTTP *attempts*. An attempt that fails transiently -- HTTP 429,
5xx (529 too), 408 or 409, a timeout, a refused or dropped connection -- is retried
up to ``max_retries`` times; anything else (a bad key, a bad request, a reply that is
not the provider's JSON) fails at once. Before retry *n* the client waits:

* the server's ``Retry-After`` (or ``retry-after-ms``) when it sent one, as long as
  it is at most ``Backoff.max_retry_after`` seconds -- a server asking for longer
  (a spent daily quota) fails the call now instead of holding a worker;
* otherwise ``min(max, initial * 2**(n-1))`` seconds, less up to ``jitter`` of it at
  random, so clients that failed together do not retry together.

Every attempt is recorded (``{"attempt", "status", "reason", "error", "elapsed",
"retry_in"}``); before each retry, :data:`BEFORE_RETRY` (set by whoever makes the call:
the ``LLMHandler`` puts the attempt on the run's log there) is awaited, and may stop
the call (:class:`StopAttempts`). A call that fails for good raises
:class:`~aaa_django.llm.errors.LLMCallError` carrying them all. The SDKs' own retries
are switched off (``max_retries=0``), so this is the only policy. The deciding
function (:meth:`Backoff.delay`) is pure; the loop (:func:`call_with_retries`) is the
only part that sleeps.
"""

from __future__ import annotations

import asyncio
import contextvars
import email.utils
import random
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import TypeVar

from aaa_django.data.jsonvalue import JSONObject
from aaa_django.runtime.retry import Backoff

from .errors import REASONS, LLMCallError

__all__ = [
    "BEFORE_RETRY",
    "AttemptFailed",
    "Backoff",
    "Failure",
    "StopAttempts",
    "call_with_retries",
    "reason_for_status",
    "retry_after",
    "shorten",
]

R = TypeVar("R")

#: longest server message kept in an attempt record or an error
MAX_MESSAGE = 300


@dataclass(frozen=True, slots=True)
class Failure:
    """One failed attempt, classified."""

    reason: str
    message: str
    status: int | None = None
    #: seconds the server asked us to wait (Retry-After), if it did
    retry_after: float | None = None

    @property
    def retryable(self) -> bool:
        return REASONS.get(self.reason, False)


class AttemptFailed(Exception):
    """Raised inside an attempt (e.g. while reading the reply) with its classification."""

    def __init__(self, failure: Failure) -> None:
        super().__init__(failure.message)
        self.failure = failure


class StopAttempts(Exception):
    """Raised by a :data:`BEFORE_RETRY` hook: make no more attempts (the call's result is
    known elsewhere, its run has ended, or this process no longer holds it). It leaves
    :func:`call_with_retries` as it is, not as a call failure."""


#: ``await hook(n)`` before attempt ``n`` (2, 3, ...) of a call, after the wait before
#: it: set by the caller of a client for the calls it makes (a context variable, so the
#: clients need not know of it). ``n`` counts this call's attempts.
BEFORE_RETRY: contextvars.ContextVar[Callable[[int], Awaitable[None]] | None] = contextvars.ContextVar(
    "aaa_llm_before_retry", default=None
)


def reason_for_status(status: int) -> str:
    """The failure reason of an HTTP error status."""
    if status == 429:
        return "rate_limit"
    if status >= 500 or status in (408, 409):
        return "server_error"
    if status in (401, 403):
        return "auth"
    return "client_error"


def retry_after(headers: Mapping[str, str] | None, *, now: float | None = None) -> float | None:
    """Seconds from ``retry-after-ms`` or ``Retry-After`` (seconds or an HTTP date)."""
    if not headers:
        return None
    ms = headers.get("retry-after-ms")
    if ms is not None:
        try:
            return max(0.0, float(ms) / 1000)
        except ValueError:
            pass
    value = headers.get("retry-after")
    if value is None:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    if when is None:
        return None
    return max(0.0, when.timestamp() - (time.time() if now is None else now))


def shorten(text: str, limit: int = MAX_MESSAGE) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


async def call_with_retries(
    attempt: Callable[[], Awaitable[R]],
    classify: Callable[[BaseException], Failure | None],
    *,
    max_retries: int,
    backoff: Backoff,
    timeout: float | None,
    redact: Callable[[str], str],
    provider: str,
    model: str | None,
    sleep: Callable[[float], Awaitable[object]] = asyncio.sleep,
) -> tuple[R, list[JSONObject]]:
    """Run ``attempt`` until it succeeds or fails for good; return its result and the
    attempt records. ``classify`` maps an exception to a :class:`Failure` (None: not
    a call failure -- a bug -- which propagates unchanged). ``timeout`` bounds each
    attempt. Before each retry the :data:`BEFORE_RETRY` hook, if set, is awaited (its
    :class:`StopAttempts` propagates). Raises :class:`LLMCallError`."""
    records: list[JSONObject] = []
    before = BEFORE_RETRY.get()
    n = 0
    while True:
        n += 1
        if n > 1 and before is not None:
            await before(n)
        started = time.monotonic()
        try:
            if timeout is not None:
                async with asyncio.timeout(timeout):
                    result = await attempt()
            else:
                result = await attempt()
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            if isinstance(exc, TimeoutError):
                failure = Failure("timeout", f"no complete answer within {timeout}s")
            elif isinstance(exc, AttemptFailed):
                failure = exc.failure
            else:
                classified = classify(exc)
                if classified is None:
                    raise
                failure = classified
            message = redact(shorten(failure.message))
            record: JSONObject = {
                "attempt": n,
                "status": failure.status,
                "reason": failure.reason,
                "error": message,
                "elapsed": round(time.monotonic() - started, 3),
            }
            records.append(record)
            wait = None
            if failure.retryable and n <= max_retries:
                wait = backoff.delay(n, failure.retry_after, random.random())
                if wait is None:
                    message += (
                        f" (the server asked to retry after {failure.retry_after:.0f}s,"
                        f" more than the {backoff.max_retry_after:.0f}s we wait)"
                    )
            if wait is None:
                raise LLMCallError(
                    message,
                    reason=failure.reason,
                    status=failure.status,
                    attempts=records,
                    provider=provider,
                    model=model,
                ) from None
            record["retry_in"] = round(wait, 3)
            await sleep(wait)
            continue
        records.append({"attempt": n, "status": None, "reason": "ok", "elapsed": round(time.monotonic() - started, 3)})
        return result, records
