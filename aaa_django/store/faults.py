"""Driver errors translated into the core's own, at each adapter's boundary.

The core decides from :class:`~aaa_django.events.InfrastructureError` and its
``transient`` flag alone (:func:`aaa_django.runtime.retry.transient`); this module is
the one place that knows what a driver's error means: the database (Django's wrappers
of psycopg and sqlite3, and psycopg's own errors from the async store's connections,
:mod:`aaa_django.store.postgres`), Redis, the Celery broker (kombu), S3 (botocore) and a
storage's file system. Transient: the service is away for a moment (a lost or refused
connection, a restart, a timeout, throttling, a busy lock). Persistent: it answers,
and refuses (a missing table or bucket, bad credentials, a full disk).

A driver is only looked at if it is imported already (``sys.modules``): an exception
of a library the process never loaded cannot be raised.
"""

from __future__ import annotations

import sys
from collections.abc import Awaitable, Callable
from typing import ParamSpec, TypeVar

from aaa_django.events import InfrastructureError

F = TypeVar("F", bound=InfrastructureError)
#: what a translated call returns
T = TypeVar("T")
P = ParamSpec("P")

#: PostgreSQL SQLSTATE classes and codes of an outage or a lost race: connection
#: exceptions (08), insufficient resources (53), transaction rollbacks (40:
#: serialization failures, deadlocks), system errors (58), an administrator's or a
#: crash's shutdown (57P01-57P03), a lock not available (55P03), and a prepared
#: statement the connection and its server disagree about (26000: it does not exist,
#: 42P05: it exists already; nothing ran, and the connection is not used again, see
#: ``connections.PREPARED_LOST``)
_PG_TRANSIENT = ("08", "53", "40", "58", "57P01", "57P02", "57P03", "55P03", "26000", "42P05")
#: PostgreSQL codes of a lost race between two writers (retried inside the store)
_PG_CONTENTION = ("40001", "40P01", "55P03")
#: SQLite result codes (``sqlite_errorname``'s prefix) of a busy database
_SQLITE_CONTENTION = ("SQLITE_BUSY", "SQLITE_LOCKED")
#: S3 error codes worth retrying, whatever their HTTP status
_S3_TRANSIENT = frozenset(
    {
        "SlowDown",
        "Throttling",
        "ThrottlingException",
        "RequestTimeout",
        "RequestLimitExceeded",
        "InternalError",
        "ServiceUnavailable",
    }
)


async def translated(
    fault_of: Callable[[BaseException], tuple[InfrastructureError | None, bool]],
    reads: bool,
    fn: Callable[P, Awaitable[T]],
    /,
    *args: P.args,
    **kwargs: P.kwargs,
) -> T:
    """``await fn(*args, **kwargs)`` with a store's driver errors translated at its
    boundary: ``fault_of(exc)`` gives the core's error for ``exc`` (None: not the
    store's to translate, raised as it is) and whether the connection was lost;
    ``reads``, which change nothing, are tried once more after a lost connection. The
    async stores' one error boundary (:mod:`aaa_django.store.postgres`,
    :mod:`aaa_django.store.sqlite`). The function and its arguments, not a closure
    over them: a store call that waits (a group commit, a pool) outlives the
    collector's young generations, and each object it holds is one more that the
    full collections traverse (docs/engine.md)."""
    for last in (False, True):
        try:
            return await fn(*args, **kwargs)
        except Exception as exc:
            fault, lost = fault_of(exc)
            if fault is None:
                raise
            if last or not (reads and lost):
                raise fault from exc
    raise AssertionError("unreachable")


def translate(
    exc: BaseException,
    kind: type[F] = InfrastructureError,  # type: ignore[assignment]
    service: str | None = None,
) -> F | None:
    """The core's error (of class ``kind``) for a driver's ``exc``, or None when
    ``exc`` is not an infrastructure failure (a bug, a constraint the caller handles).
    Raise it ``from exc``, so the driver's error stays its cause."""
    if isinstance(exc, InfrastructureError):
        return exc if isinstance(exc, kind) else kind(str(exc), transient=exc.transient, service=service or exc.service)
    verdict = _transient(exc)
    if verdict is None:
        return None
    db = _is_db_error(exc)
    cause = exc.__cause__ if db and exc.__cause__ is not None else exc
    if service is None and kind.service == InfrastructureError.service:  # say what failed
        service = "database" if db else _service_of(exc)
    return kind(f"{type(cause).__name__}: {exc}", transient=verdict, service=service)


def _service_of(exc: BaseException) -> str | None:
    """What failed, by the driver's package, when the boundary did not say."""
    package = type(exc).__module__.split(".", 1)[0]
    return {"redis": "redis", "kombu": "broker", "botocore": "blob store"}.get(package)


def contention(exc: BaseException) -> bool:
    """Did a database write lose a race with another writer (SQLite's busy lock,
    PostgreSQL's serialization failure or deadlock)? The store tries again then."""
    cause = exc.__cause__
    name = getattr(cause, "sqlite_errorname", None)
    if isinstance(name, str):
        return name.startswith(_SQLITE_CONTENTION)
    if "database is locked" in str(exc):  # an SQLite without error names
        return True
    code = getattr(cause, "sqlstate", None)
    return isinstance(code, str) and code.startswith(_PG_CONTENTION)


def _transient(exc: BaseException) -> bool | None:
    """True (transient), False (persistent) or None (not an infrastructure failure)."""
    if _is_db_error(exc):
        return _db_transient(exc)
    for check in (_redis_transient, _broker_transient, _s3_transient):
        verdict = check(exc)
        if verdict is not None:
            return verdict
    if isinstance(exc, (ConnectionError, TimeoutError, BlockingIOError, InterruptedError)):
        return True
    if isinstance(exc, OSError):  # a storage's file system: permissions, a full disk
        return False
    return None


def _is_db_error(exc: BaseException) -> bool:
    """Django's wrapper of a database driver's error, or psycopg's own (the async
    store's connections are psycopg's, unwrapped)."""
    return any(
        m is not None and isinstance(exc, m.Error) for m in (sys.modules.get("django.db"), sys.modules.get("psycopg"))
    )


def _db_transient(exc: BaseException) -> bool | None:
    from django.db import DataError, IntegrityError, InterfaceError, OperationalError

    psycopg = sys.modules.get("psycopg")
    refused: tuple[type[BaseException], ...] = (IntegrityError, DataError)
    broken: type[BaseException] = InterfaceError
    unanswered: type[BaseException] = OperationalError
    cause = exc.__cause__
    if psycopg is not None and isinstance(exc, psycopg.Error):  # psycopg's own (the async store)
        refused = (psycopg.IntegrityError, psycopg.DataError)
        broken, unanswered, cause = psycopg.InterfaceError, psycopg.OperationalError, exc
    if isinstance(exc, refused):
        return None  # the data's or a race's: the caller's to handle
    if isinstance(exc, broken):
        return True  # the connection is closed or unusable
    name = getattr(cause, "sqlite_errorname", None)
    if isinstance(name, str):
        return name.startswith((*_SQLITE_CONTENTION, "SQLITE_IOERR", "SQLITE_PROTOCOL"))
    code = getattr(cause, "sqlstate", None)
    if isinstance(code, str):
        return code.startswith(_PG_TRANSIENT)
    # No SQLSTATE: the server never answered (a refused or lost connection).
    return isinstance(exc, unanswered)


def connection_lost(exc: BaseException) -> bool:
    """Did a psycopg call fail because its connection (or the server behind it) is
    gone: a connection exception (SQLSTATE class 08), a shutdown (57P01-57P03), or no
    answer at all? Every connection opened before it is suspect then."""
    psycopg = sys.modules.get("psycopg")
    if psycopg is None or not isinstance(exc, (psycopg.OperationalError, psycopg.InterfaceError)):
        return False
    code = exc.sqlstate
    return code is None or code.startswith(("08", "57P01", "57P02", "57P03"))


def _redis_transient(exc: BaseException) -> bool | None:
    errors = sys.modules.get("redis.exceptions")
    if errors is None or not isinstance(exc, errors.RedisError):
        return None
    if isinstance(exc, errors.AuthenticationError):
        return False
    return isinstance(
        exc,
        (
            errors.ConnectionError,
            errors.TimeoutError,
            errors.BusyLoadingError,
            errors.TryAgainError,
            errors.ReadOnlyError,
        ),
    )


def _broker_transient(exc: BaseException) -> bool | None:
    errors = sys.modules.get("kombu.exceptions")
    if errors is None or not isinstance(exc, errors.OperationalError):
        return None
    return True


def _s3_transient(exc: BaseException) -> bool | None:
    errors = sys.modules.get("botocore.exceptions")
    if errors is None:
        return None
    if isinstance(exc, errors.ClientError):
        response = getattr(exc, "response", None) or {}
        code = (response.get("Error") or {}).get("Code")
        status = (response.get("ResponseMetadata") or {}).get("HTTPStatusCode") or 0
        return code in _S3_TRANSIENT or status >= 500 or status in (408, 429)
    if isinstance(exc, (errors.ConnectionError, errors.HTTPClientError)):  # refused, reset, timed out
        return True
    if isinstance(exc, errors.BotoCoreError):  # no credentials, a bad endpoint...
        return False
    return None
