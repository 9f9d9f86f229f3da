"""The HTTP boundary every request of the router crosses before django-ninja sees it.

In order: who is calling (401), the rate limit (429), the body's size (413), its
content type (415), whether it is JSON at all (400; JSON Lines: every line) and whether
any of its values nests deeper than :data:`MAX_DEPTH` levels (422: deeper JSON is
refused before any parser, validator or the event log recurses into it). Each failure is answered in
the API's one error shape, whatever ``NinjaAPI`` the site mounts the router in; an
unexpected exception becomes a 500 in the same shape (never an HTML page), reported as
Django reports one: ``got_request_exception`` and the ``django.request`` logger.
"""

from __future__ import annotations

import functools
import json
import math
from collections.abc import Callable, Iterable
from typing import Any, Concatenate, NoReturn, ParamSpec, TypeVar

from django.core.exceptions import RequestDataTooBig
from django.http import HttpRequest, JsonResponse

from aaa_django.conf import aaa_settings

from . import auth
from .errors import ApiError, error_response, server_error, unavailable

BODY_METHODS = frozenset({"POST", "PUT", "PATCH", "DELETE"})
#: the media types of JSON Lines (a run's export): one JSON value per line
JSON_LINES = frozenset({"application/jsonl", "application/x-ndjson", "application/x-jsonlines"})
#: levels of arrays and objects a request body may nest, the body itself included
MAX_DEPTH = 64

P = ParamSpec("P")
R = TypeVar("R")


def boundary(run: Callable[Concatenate[HttpRequest, P], R]) -> Callable[Concatenate[HttpRequest, P], R | JsonResponse]:
    """View decorator (``Router.add_decorator(boundary, mode="view")``)."""

    @functools.wraps(run)
    def wrapper(request: HttpRequest, *args: P.args, **kwargs: P.kwargs) -> R | JsonResponse:
        try:
            check(request)
            return run(request, *args, **kwargs)
        except ApiError as exc:
            return error_response(exc.status, exc.errors, exc.headers)
        except Exception as exc:  # an outage (503), else a bug: reported as Django would, as JSON
            return unavailable(exc) or server_error(request, exc)

    return wrapper


def check(request: HttpRequest) -> None:
    conf = aaa_settings()
    p = auth.authenticate(request)
    request._aaa_principal = p
    request.auth = p
    auth.throttle(request, conf["API_RATE"])
    if request.method in BODY_METHODS:
        check_body(request, conf["API_MAX_BODY"])


def check_body(request: HttpRequest, limit: int) -> None:
    length = request.headers.get("Content-Length") or ""
    if length.strip():
        try:
            declared = int(length)
        except ValueError:
            raise ApiError(400, ["header", "Content-Length"], "not a number", "invalid") from None
        if declared > limit:
            raise too_big(declared, limit)
    try:
        body = request.body
    except RequestDataTooBig:
        raise too_big(None, limit) from None
    if len(body) > limit:
        raise too_big(len(body), limit)
    if not body:
        return
    ctype = media_type(request)
    if ctype in JSON_LINES:  # a run's export (POST /imports): each line is JSON
        for line in body.splitlines():
            if line.strip():
                parse_json(line)
        return
    if not (ctype == "application/json" or (ctype.startswith("application/") and ctype.endswith("+json"))):
        raise ApiError(
            415,
            ["header", "Content-Type"],
            f"the body must be JSON (Content-Type: application/json), not {ctype or 'untyped'}",
            "unsupported_media_type",
        )
    deep = too_deep(parse_json(body), MAX_DEPTH)
    if deep is not None:
        raise ApiError(
            422, ["body", *deep[:1]], f"nested more than {MAX_DEPTH} levels deep (at {_path(deep)})", "too_deep"
        )


def media_type(request: HttpRequest) -> str:
    """The body's media type, without its parameters, in lower case ("" if none)."""
    return (request.headers.get("Content-Type") or "").split(";")[0].strip().lower()


def too_big(size: int | None, limit: int) -> ApiError:
    said = f"{size} bytes" if size is not None else "too large"
    return ApiError(413, ["body"], f"the body is {said}; at most {limit} bytes are accepted", "too_large")


def too_deep(value: object, limit: int) -> list[str | int] | None:
    """The path to the first array or object of ``value`` below ``limit`` levels of
    them (``value`` itself is level 1), or None. Iterative: any depth is safe."""
    stack: list[tuple[object, int, tuple[str | int, ...]]] = [(value, 1, ())]
    while stack:
        node, level, path = stack.pop()
        items: Iterable[tuple[str | int, object]]
        if isinstance(node, dict):
            items = node.items()
        elif isinstance(node, list):
            items = enumerate(node)
        else:
            continue
        if level > limit:
            return list(path)
        stack.extend((v, level + 1, (*path, k)) for k, v in items)
    return None


def _path(path: list[str | int]) -> str:
    return "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in path).lstrip(".") or "the body"


def _no_constant(name: str) -> NoReturn:
    raise ValueError(f"{name} is not a JSON number")


def _finite(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(f"{text} is out of range for a number")
    return value


def parse_json(body: bytes) -> Any:
    """The body as strict JSON: UTF-8, finite numbers, no lone surrogates."""
    try:
        text = body.decode("utf-8")
        data = json.loads(text, parse_constant=_no_constant, parse_float=_finite)
        # A lone surrogate ("\ud800") decodes but cannot be stored as UTF-8 text.
        json.dumps(data, ensure_ascii=False).encode("utf-8")
    except (UnicodeDecodeError, UnicodeEncodeError) as exc:
        raise ApiError(400, ["body"], f"not UTF-8 text: {exc.reason}", "json_invalid") from None
    except RecursionError:  # deeper than the parser goes: far past MAX_DEPTH
        raise ApiError(422, ["body"], f"nested more than {MAX_DEPTH} levels deep", "too_deep") from None
    except ValueError as exc:
        raise ApiError(400, ["body"], f"invalid JSON: {exc}", "json_invalid") from None
    return data
