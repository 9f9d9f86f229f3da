"""``LLMCallError``: a provider call that failed for good, with every attempt it made.

Raised by the provider clients (:mod:`~aaa_django.llm.openai_client`,
:mod:`~aaa_django.llm.anthropic_client`) once their retries are used up or the
failure is not worth retrying. :class:`~aaa_django.llm.handler.LLMHandler` turns it
into ``aaa.llm.failed`` and stores ``str(error)``, so the message says everything an
operator needs (reason, HTTP status, each attempt) and never contains the API key.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from aaa_django.data.jsonvalue import JSONObject

#: the reasons a call can fail, and whether the client retries them
REASONS: dict[str, bool] = {
    "rate_limit": True,  # HTTP 429
    "server_error": True,  # HTTP 5xx (529 "overloaded" too), 408, 409
    "timeout": True,  # no complete answer within the client's timeout
    "connection": True,  # refused, reset, or dropped mid-response
    "auth": False,  # HTTP 401, 403: the key is wrong or lacks access
    "client_error": False,  # any other 4xx: the request itself is wrong
    "malformed_response": False,  # 2xx, but not the provider's JSON
    "bad_tool_arguments": False,  # the model's tool-call arguments are not a JSON object
}


class LLMCallError(Exception):
    """A model call failed.

    ``reason`` is one of :data:`REASONS`; ``status`` the last HTTP status (None when
    there was no response); ``attempts`` one dict per HTTP attempt, in order:
    ``{"attempt": 1, "status": 429, "reason": "rate_limit", "error": "...",
    "elapsed": 0.012, "retry_in": 1.0}`` (``retry_in`` is absent on the last one).
    """

    def __init__(
        self,
        message: str,
        *,
        reason: str,
        status: int | None = None,
        attempts: list[JSONObject] | None = None,
        provider: str | None = None,
        model: str | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.reason = reason
        self.status = status
        self.attempts = list(attempts or ())
        self.provider = provider
        self.model = model

    @property
    def retryable(self) -> bool:
        """Whether this kind of failure is one the client retries (it gave up on it)."""
        return REASONS.get(self.reason, False)

    def __str__(self) -> str:
        head = f"{self.provider or 'model'} call"
        if self.model:
            head += f" to {self.model!r}"
        status = f", HTTP {self.status}" if self.status is not None else ""
        n = len(self.attempts)
        text = f"{head} failed ({self.reason}{status}) after {n} attempt{'s' * (n != 1)}: {self.message}"
        if n > 1:
            text += " | attempts: " + "; ".join(_describe(a) for a in self.attempts)
        return text

    def __repr__(self) -> str:
        return f"LLMCallError(reason={self.reason!r}, status={self.status!r}, attempts={len(self.attempts)})"

    # keyword-only arguments: pickle by rebuilding
    def __reduce__(self) -> tuple[Callable[..., LLMCallError], tuple[str, dict[str, Any]]]:
        return (_rebuild, (self.message, self.__dict__))


def _rebuild(message: str, state: dict[str, Any]) -> LLMCallError:
    error = LLMCallError(message, reason=state.get("reason", "client_error"))
    error.__dict__.update(state)
    return error


def _describe(a: JSONObject) -> str:
    what = f"HTTP {a['status']}" if a.get("status") is not None else a.get("reason", "?")
    text = f"#{a.get('attempt')} {what} after {a.get('elapsed', 0):.3f}s"
    if a.get("retry_in") is not None:
        text += f", retried in {a['retry_in']:.3f}s"
    return text
