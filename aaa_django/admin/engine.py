"""The admin's actions, each one call on the engine (never an ORM write on the log).

Views are synchronous; the engine is async and its in-process bus must outlive the
request (a started run goes on after the response). So the calls go to the web
process's :class:`~aaa_django.site.host.EngineHost`, whose loop thread keeps the engine.
"""

from __future__ import annotations

from collections.abc import Callable, Coroutine, Iterable, Mapping
from datetime import datetime
from types import EllipsisType
from typing import TYPE_CHECKING, Any, TypeVar

from aaa_django.runtime import Engine, RunNotEndedError, validation
from aaa_django.runtime.fork import fork as fork_run
from aaa_django.site.host import EngineHost, EngineUnavailable, EngineWork
from aaa_django.store import runindex

R = TypeVar("R")

if TYPE_CHECKING:
    from django.contrib.auth.base_user import AbstractBaseUser

__all__ = [
    "EngineUnavailable",
    "approve",
    "cancel",
    "cancel_many",
    "deny",
    "erase",
    "erase_many",
    "fork",
    "redrive",
    "redrive_many",
    "run_again",
    "start",
    "start_errors",
]

#: runs handed to the engine in one call by the bulk actions (each call has its own timeout)
CHUNK = 100


def call(fn: EngineWork[R], timeout: float | None = 30.0) -> R:
    """``await fn(engine)`` on the process's engine host."""
    return EngineHost.get().call(fn, timeout=timeout)


def who(user: AbstractBaseUser) -> str:
    """How the admin records the person who acted (``by`` in the event)."""
    return f"{user.get_username()} (user {user.pk}, admin)"


def cancel(run_id: str, *, user: AbstractBaseUser, reason: str | None) -> bool:
    return bool(call(lambda e: e.cancel(run_id, reason=reason or None, by=who(user))))


def approve(run_id: str, request_id: str, *, user: AbstractBaseUser, reason: str | None) -> bool:
    return bool(call(lambda e: e.approve(run_id, request_id, by=who(user), reason=reason or None)))


def deny(run_id: str, request_id: str, *, user: AbstractBaseUser, reason: str | None) -> bool:
    return bool(call(lambda e: e.deny(run_id, request_id, by=who(user), reason=reason or None)))


def redrive(run_id: str) -> bool:
    """Deliver an unfinished run's events again (idempotent); True if it was adopted."""
    return run_id in call(lambda e: e.resume([run_id]))


def erase(run_id: str, *, using: str = "default") -> int:
    """Erase the run's events, snapshots and blobs; drop its index row."""
    count = call(lambda e: e.erase(run_id))
    runindex.forget(using, run_id)
    return int(count)


def cancel_many(run_ids: Iterable[str], *, user: AbstractBaseUser, reason: str | None) -> list[str]:
    """Ask each run to cancel; the ids of those asked (not those that had ended)."""

    async def each(e: Engine, ids: list[str]) -> list[str]:
        return [r for r in ids if await e.cancel(r, reason=reason or None, by=who(user))]

    return _chunked(each, run_ids)


def redrive_many(run_ids: Iterable[str]) -> list[str]:
    """Deliver each unfinished run's events again (``Engine.resume``); the adopted ids."""

    async def each(e: Engine, ids: list[str]) -> list[str]:
        return list(await e.resume(ids))

    return _chunked(each, run_ids)


def erase_many(run_ids: Iterable[str], *, using: str = "default") -> tuple[dict[str, int], list[str]]:
    """Erase each run that has ended (``Engine.erase``): ``({run id: events erased},
    [the ids refused because they have not ended])``."""
    erased: dict[str, int] = {}
    refused: list[str] = []

    async def each(e: Engine, ids: list[str]) -> list[str]:
        for r in ids:
            try:
                erased[r] = int(await e.erase(r))
            except RunNotEndedError:
                refused.append(r)
        return []

    try:
        _chunked(each, run_ids)
    finally:  # what was erased leaves the index, even if the engine stopped answering
        for r in erased:
            runindex.forget(using, r)
    return erased, refused


def _chunked(fn: Callable[[Engine, list[str]], Coroutine[Any, Any, list[str]]], run_ids: Iterable[str]) -> list[str]:
    ids = list(dict.fromkeys(run_ids))
    out: list[str] = []
    for i in range(0, len(ids), CHUNK):
        out += call(_on(fn, ids[i : i + CHUNK]))
    return out


def _on(fn: Callable[[Engine, list[str]], Coroutine[Any, Any, R]], ids: list[str]) -> EngineWork[R]:
    return lambda e: fn(e, ids)


def start(
    algorithm: object,
    input: object,
    *,
    user: AbstractBaseUser,
    budget: Mapping[str, object] | None = None,
    deadline: float | None = None,
) -> str:
    """Start a run owned by ``user``; return its id."""
    run = call(lambda e: e.start(algorithm, input, budget=budget, deadline=deadline, owner=str(user.pk)))
    return run.run_id


def run_again(run_id: str, *, user: AbstractBaseUser) -> str:
    """A new run of ``run_id``'s algorithm, input, config, budget and deadline (as long
    as the run had), for ``user``: a fork at its first event, so the new run records
    where it came from; return its id."""
    run = call(lambda e: fork_run(e, run_id, 1, owner=str(user.pk)))
    return run.run_id


def start_errors(config: object, budget: Mapping[str, object] | None) -> list[dict[str, Any]]:
    """Why the engine's start checks would refuse a run with ``config`` and ``budget``
    (a cost budget over an unpriced model), as the REST API asks before starting one."""

    async def check(e: Engine) -> list[dict[str, Any]]:
        return validation.start_errors(e, config, budget)

    return call(check)


def fork(
    run_id: str,
    at: int,
    *,
    user: AbstractBaseUser,
    config: Mapping[str, object] | None,
    budget: Mapping[str, object] | None,
    deadline: float | datetime | EllipsisType | None = ...,
) -> str:
    """Fork ``run_id`` at event ``at`` for ``user`` (see
    :func:`aaa_django.runtime.fork.fork`); return the new run's id."""
    run = call(lambda e: fork_run(e, run_id, at, config=config, budget=budget, deadline=deadline, owner=str(user.pk)))
    return run.run_id
