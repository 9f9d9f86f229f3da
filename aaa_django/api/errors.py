"""Errors at the HTTP boundary: one body shape, and the one map from core errors to codes.

Every 4xx (and the rare 5xx) body is ``{"detail": [{"loc": [...], "msg": "...",
"type": "..."}]}``: ``loc`` names the field (``["body", "input", "task"]``,
``["header", "Authorization"]``, ``["path", "run_id"]``, ``["query", "at"]``) and
``msg`` the reason, the same shape as django-ninja's own 422 validation errors. The
views raise :class:`ApiError` or let core exceptions through; :func:`to_response` is
the only place that turns them into status codes.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable, Iterable, Sequence
from typing import Any, ParamSpec, TypedDict, TypeVar

from django.core.exceptions import PermissionDenied
from django.core.signals import got_request_exception
from django.http import Http404, HttpRequest, JsonResponse
from django.utils.log import log_response

from aaa_django.data.errors import BlobError
from aaa_django.events import ConcurrencyError, InvalidEventError
from aaa_django.runtime import UnknownAlgorithmError
from aaa_django.site.host import EngineUnavailable

log = logging.getLogger("aaa_django.api")

Loc = Sequence[str | int]

P = ParamSpec("P")
R = TypeVar("R")


class ErrorItem(TypedDict):
    """One error of a response's ``detail`` (pydantic's shape)."""

    loc: list[str | int]
    msg: str
    type: str


#: seconds a client is asked to wait (``Retry-After``) when a service is away
RETRY_AFTER = 2


class ApiError(Exception):
    """An error the API answers with ``status`` and one or more ``(loc, msg, type)``."""

    def __init__(
        self,
        status: int,
        loc: Loc | None = None,
        msg: str = "",
        type: str = "invalid",
        *,
        errors: Iterable[ErrorItem] | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        self.status = status
        self.errors = list(errors) if errors is not None else [item(loc or [], msg, type)]
        self.headers = dict(headers or {})
        super().__init__(status, self.errors)


def item(loc: Loc, msg: str, type: str) -> ErrorItem:
    return {"loc": list(loc), "msg": msg, "type": type}


def not_found(loc: Loc, what: str) -> ApiError:
    return ApiError(404, loc, f"no such {what}", "not_found")


def pydantic_errors(exc: Any, prefix: Loc) -> list[ErrorItem]:
    """A pydantic ValidationError's errors (or a list of them) under ``prefix``."""
    raw = exc.errors(include_url=False) if hasattr(exc, "errors") else list(exc)
    out = []
    for e in raw:
        out.append(item([*prefix, *e.get("loc", ())], str(e.get("msg", "invalid")), str(e.get("type", "invalid"))))
    return out


def error_response(status: int, errors: list[ErrorItem], headers: dict[str, str] | None = None) -> JsonResponse:
    response = JsonResponse({"detail": errors}, status=status)
    for k, v in (headers or {}).items():
        response[k] = v
    return response


def to_response(exc: BaseException) -> JsonResponse | None:
    """The HTTP answer to an exception a view raised, or None if it is a bug."""
    if isinstance(exc, ApiError):
        return error_response(exc.status, exc.errors, exc.headers)
    outage = unavailable(exc)
    if outage is not None:
        return outage
    if isinstance(exc, UnknownAlgorithmError):
        return error_response(422, [item(["body", "algorithm"], str(exc), "unknown_algorithm")])
    if isinstance(exc, InvalidEventError):
        return error_response(422, [item(["body"], str(exc), "invalid_event")])
    if isinstance(exc, ConcurrencyError):
        return error_response(409, [item(["path", "run_id"], f"the run changed meanwhile: {exc}", "conflict")])
    if isinstance(exc, EngineUnavailable):
        return error_response(503, [item(["server", "engine"], str(exc), "unavailable")], {"Retry-After": "5"})
    if isinstance(exc, BlobError):
        log.error("blob store error", exc_info=exc)
        return error_response(502, [item(["server", "blobs"], f"the blob store failed: {exc}", "blob_error")])
    if isinstance(exc, Http404):
        return error_response(404, [item(["path"], "not found", "not_found")])
    if isinstance(exc, PermissionDenied):
        return error_response(403, [item(["auth"], str(exc) or "permission denied", "forbidden")])
    return None


def unavailable(exc: BaseException) -> JsonResponse | None:
    """503 with ``Retry-After`` when ``exc`` is an outage (the database restarting, the
    broker away: :mod:`aaa_django.store.faults`), whether a store translated it or the ORM
    raised it; else None. The driver's message (hosts, ports) stays in the log."""
    from aaa_django.store.faults import translate as classify

    fault = classify(exc)
    if fault is None or not fault.transient:
        return None
    log.warning("%s unavailable: %s: %s", fault.service, type(exc).__name__, exc)
    return error_response(
        503,
        [
            item(
                ["server", fault.service.replace(" ", "_")],
                f"the {fault.service} is unavailable for a moment; retry in {RETRY_AFTER} s",
                "unavailable",
            )
        ],
        {"Retry-After": str(RETRY_AFTER)},
    )


def translate(view: Callable[P, R]) -> Callable[P, R | JsonResponse]:
    """Operation decorator: turn exceptions raised by a view into their responses."""

    @functools.wraps(view)
    def wrapper(*args: P.args, **kwargs: P.kwargs) -> R | JsonResponse:
        try:
            return view(*args, **kwargs)
        except Exception as exc:
            response = to_response(exc)
            if response is None:
                raise
            return response

    return wrapper


def server_error(request: HttpRequest, exc: BaseException) -> JsonResponse:
    """The last resort: a bug. Reported as Django reports an uncaught exception, and
    answered in the API's shape instead of Django's HTML page. Call it in the
    ``except`` block: ``got_request_exception`` receivers read ``sys.exc_info()``."""
    got_request_exception.send(sender=None, request=request)
    response = error_response(500, [item(["server"], "internal error (logged)", "server_error")])
    # On the "django.request" logger, with the traceback, as Django's own handler logs
    # it (mail_admins listens there); log_response marks the response as logged, so
    # the handler does not log it a second time without the traceback.
    log_response("Internal Server Error: %s", request.path, response=response, request=request, exception=exc)
    return response
