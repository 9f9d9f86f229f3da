"""Who is calling, and what they may do with a run.

Credentials, tried in this order:

- ``Authorization: Bearer <API key>``;
- ``X-API-Key: <API key>``;
- the Django session (the site's login), with Django's CSRF check on unsafe methods.

An API key is looked up by its SHA-256 (only the hash is stored); a revoked or
expired key, or one of an inactive user, authenticates nobody. The result is a
:class:`Principal` on ``request.auth``. Failed key attempts are counted per client
address (``AAA["API_KEY_FAILURES"]``): past the limit, every key attempt from that
address is a 429 until the period ends, so keys cannot be guessed at speed.

Both limits count in Django's default cache: share it between processes (Redis,
Memcached, the database cache), or each process counts alone (system check aaa.W020).

Who may see and act on which run is :mod:`aaa_django.access` (the same rule as the
admin); :func:`aaa_django.api.runs.load` turns its verdict into a 404 or a 403.
"""

from __future__ import annotations

import hashlib
import time
from dataclasses import dataclass
from datetime import timedelta
from typing import TYPE_CHECKING

from django.conf import settings
from django.core.cache import cache
from django.http import HttpRequest
from django.utils import timezone
from ninja.security import APIKeyCookie, APIKeyHeader, HttpBearer
from ninja.throttling import SimpleRateThrottle
from ninja.utils import check_csrf

from aaa_django.conf import aaa_settings
from aaa_django.models import ApiKey

from .errors import ApiError

if TYPE_CHECKING:
    from django.contrib.auth.base_user import AbstractBaseUser

#: longest key accepted (ours are 47 characters); anything longer is not a key
MAX_KEY_LENGTH = 200
#: last_used_at is written at most this often per key
TOUCH_EVERY = timedelta(minutes=1)


@dataclass(frozen=True)
class Principal:
    """An authenticated caller: a user, and the API key used (None for a session)."""

    user: AbstractBaseUser
    key: ApiKey | None = None

    def __str__(self) -> str:  # ninja's throttles key on str(request.auth)
        return f"user:{self.user.pk}"

    @property
    def owner(self) -> str:
        """The ``owner`` written in the runs this caller starts."""
        return str(self.user.pk)

    @property
    def label(self) -> str:
        """Who did it, as recorded in ``by`` of a cancel or an approval decision."""
        who = f"{self.user.get_username()} (user {self.user.pk}"
        return who + (f", key {self.key.prefix})" if self.key else ", session)")


def authenticate(request: HttpRequest) -> Principal:
    """The caller of ``request``; raises a 401 (or a CSRF 403, or a 429 after too many
    failed key attempts from its address) :class:`ApiError`."""
    header = request.headers.get("Authorization")
    if header:
        scheme, _, token = header.strip().partition(" ")
        if scheme.lower() != "bearer" or not token.strip():
            raise ApiError(
                401, ["header", "Authorization"], "use 'Authorization: Bearer <API key>'", "invalid_credentials"
            )
        return _counted(request, token.strip(), ["header", "Authorization"])
    key = request.headers.get("X-API-Key")
    if key:
        return _counted(request, key.strip(), ["header", "X-API-Key"])
    user = getattr(request, "user", None)
    if user is not None and user.is_authenticated and user.is_active:
        # Django's CsrfViewMiddleware decides (through ninja's check_csrf), with the
        # exemptions Django makes itself (safe methods; its test client's requests).
        if check_csrf(request):
            raise ApiError(
                403,
                ["header", "X-CSRFToken"],
                "CSRF check failed: send the csrftoken cookie's value in X-CSRFToken",
                "csrf_failed",
            )
        return Principal(user)
    raise ApiError(
        401,
        ["header", "Authorization"],
        "no credentials: send 'Authorization: Bearer <API key>', 'X-API-Key: <API key>' or a session cookie",
        "not_authenticated",
    )


def _counted(request: HttpRequest, raw: str, loc: list[str]) -> Principal:
    """``_by_key``, refused while the client's address is over its failed attempts."""
    failures = FailedKeys.from_settings()
    if failures is None:
        return _by_key(raw, loc)
    wait = failures.blocked(request)
    if wait is not None:
        raise ApiError(
            429,
            loc,
            f"too many failed API key attempts from your address: at most {failures.rate}",
            "throttled",
            headers={"Retry-After": str(wait)},
        )
    try:
        return _by_key(raw, loc)
    except ApiError:
        failures.failed(request)
        raise


def _by_key(raw: str, loc: list[str]) -> Principal:
    if len(raw) > MAX_KEY_LENGTH or not raw.isascii():
        raise ApiError(401, loc, "not an API key", "invalid_credentials")
    key = ApiKey.objects.select_related("user").filter(hashed=ApiKey.hash(raw)).first()
    if key is None:
        raise ApiError(401, loc, "unknown API key", "invalid_credentials")
    if key.revoked_at is not None:
        raise ApiError(401, loc, "this API key was revoked", "revoked_key")
    now = timezone.now()
    if key.expires_at is not None and key.expires_at <= now:
        raise ApiError(401, loc, "this API key has expired", "expired_key")
    if not key.user.is_active:
        raise ApiError(401, loc, "the API key's user is inactive", "inactive_user")
    if key.last_used_at is None or now - key.last_used_at >= TOUCH_EVERY:
        ApiKey.objects.filter(pk=key.pk).update(last_used_at=now)
    return Principal(key.user, key)


def principal(request: HttpRequest) -> Principal | None:
    """The principal the boundary authenticated for this request (None: not yet)."""
    return getattr(request, "_aaa_principal", None)


# -- the auth schemes as ninja sees them (enforced by the boundary, documented here) --


class BearerKey(HttpBearer):
    """``Authorization: Bearer <API key>``."""

    def authenticate(self, request: HttpRequest, token: str) -> Principal | None:
        return principal(request)


class HeaderKey(APIKeyHeader):
    """``X-API-Key: <API key>``."""

    param_name = "X-API-Key"

    def authenticate(self, request: HttpRequest, key: str | None) -> Principal | None:
        return principal(request)


class Session(APIKeyCookie):
    """The Django session cookie (CSRF is checked by the boundary)."""

    param_name = settings.SESSION_COOKIE_NAME

    def __init__(self) -> None:
        super().__init__(csrf=False)

    def authenticate(self, request: HttpRequest, key: str | None) -> Principal | None:
        return principal(request)


AUTH = [BearerKey(), HeaderKey(), Session()]


# -- rate limits ----------------------------------------------------------------------


class UserRateThrottle(SimpleRateThrottle):
    """``AAA["API_RATE"]`` requests per user (whatever credential it uses)."""

    scope = "aaa_api"

    def get_cache_key(self, request: HttpRequest) -> str | None:
        p = principal(request)
        if p is None:
            return None
        return self.cache_format % {"scope": self.scope, "ident": p.user.pk}


class FailedKeys:
    """Failed API-key attempts per client address, in fixed windows of the rate's
    period (``AAA["API_KEY_FAILURES"]``; the address as ninja's throttles see it:
    ``REMOTE_ADDR``, or ``X-Forwarded-For`` per ``NINJA_NUM_PROXIES``)."""

    def __init__(self, rate: str) -> None:
        self.rate = rate
        limit, period = SimpleRateThrottle(rate).parse_rate(rate)
        if limit is None or period is None:  # (the system check aaa.E021 says so first)
            raise ValueError(f"AAA['API_KEY_FAILURES'] is not a rate: {rate!r}")
        self.limit, self.period = limit, period

    @classmethod
    def from_settings(cls) -> FailedKeys | None:
        rate = aaa_settings()["API_KEY_FAILURES"]
        return cls(rate) if rate else None

    def _key(self, request: HttpRequest, now: float) -> str:
        ident = SimpleRateThrottle(self.rate).get_ident(request) or "unknown"
        window = int(now // self.period)
        return f"aaa:key-failures:{hashlib.sha256(ident.encode()).hexdigest()[:32]}:{window}"

    def blocked(self, request: HttpRequest) -> int | None:
        """Seconds until the address may try again, or None if it may now."""
        now = time.time()
        if (cache.get(self._key(request, now)) or 0) < self.limit:
            return None
        return max(1, int(self.period - now % self.period + 0.999))

    def failed(self, request: HttpRequest) -> None:
        key = self._key(request, time.time())
        cache.add(key, 0, self.period)
        try:
            cache.incr(key)
        except ValueError:  # expired between add and incr: this failure opens the window
            cache.set(key, 1, self.period)


def throttle(request: HttpRequest, rate: str | None) -> None:
    """Raise a 429 :class:`ApiError` when the caller is over ``rate``."""
    if not rate:
        return
    t = UserRateThrottle(rate)
    if t.allow_request(request):
        return
    wait = t.wait()
    headers = {"Retry-After": str(max(1, int(wait + 0.999)))} if wait is not None else {}
    raise ApiError(
        429, ["header", "Authorization"], f"rate limit exceeded: at most {rate} per user", "throttled", headers=headers
    )
