"""The admin's actions, each one call on the engine (never an ORM write on the log).

Views are synchronous; the engine is async and its in-process bus must outlive the
request (a started run goes on after the response). So the calls go to the web
process's :class:`~aaa_django.site.host.EngineHost`, whose loop thread keeps the engine.
"""

from __future__ import annotations

from typing import Any, Callable, Coroutine, Mapping, TypeVar

from aaa_django.runtime import Engine, validation
from aaa_django.runtime.fork import fork as fork_run
from aaa_django.site.host import EngineHost, EngineUnavailable
from aaa_django.store import runindex

R = TypeVar("R")

__all__ = ["EngineUnavailable", "approve", "cancel", "deny", "erase", "fork", "redrive", "start",
           "start_errors"]


def call(fn: Callable[[Engine], Coroutine[Any, Any, R]], timeout: float | None = 30.0) -> R:
    """``await fn(engine)`` on the process's engine host."""
    return EngineHost.get().call(fn, timeout=timeout)


def who(user: Any) -> str:
    """How the admin records the person who acted (``by`` in the event)."""
    return f"{user.get_username()} (user {user.pk}, admin)"


def cancel(run_id: str, *, user: Any, reason: str | None) -> bool:
    return bool(call(lambda e: e.cancel(run_id, reason=reason or None, by=who(user))))


def approve(run_id: str, request_id: str, *, user: Any, reason: str | None) -> bool:
    return bool(call(lambda e: e.approve(run_id, request_id, by=who(user), reason=reason or None)))


def deny(run_id: str, request_id: str, *, user: Any, reason: str | None) -> bool:
    return bool(call(lambda e: e.deny(run_id, request_id, by=who(user), reason=reason or None)))


def redrive(run_id: str) -> bool:
    """Deliver an unfinished run's events again (idempotent); True if it was adopted."""
    return run_id in call(lambda e: e.resume([run_id]))


def erase(run_id: str, *, using: str = "default") -> int:
    """Erase the run's events, snapshots and blobs; drop its index row."""
    count = call(lambda e: e.erase(run_id))
    runindex.forget(using, run_id)
    return int(count)


def start(algorithm: Any, input: Any, *, user: Any, budget: Mapping[str, Any] | None = None,
          deadline: float | None = None) -> str:
    """Start a run owned by ``user``; return its id."""
    run = call(lambda e: e.start(algorithm, input, budget=budget, deadline=deadline,
                                 owner=str(user.pk)))
    return run.run_id


def start_errors(config: Any, budget: Mapping[str, Any] | None) -> list[dict[str, Any]]:
    """Why the engine's start checks would refuse a run with ``config`` and ``budget``
    (a cost budget over an unpriced model), as the REST API asks before starting one."""
    async def check(e: Engine) -> list[dict[str, Any]]:
        return validation.start_errors(e, config, budget)

    return call(check)


def fork(run_id: str, at: int, *, user: Any, config: Mapping[str, Any] | None,
         budget: Mapping[str, Any] | None, deadline: Any = ...) -> str:
    """Fork ``run_id`` at event ``at`` for ``user`` (see
    :func:`aaa_django.runtime.fork.fork`); return the new run's id."""
    run = call(lambda e: fork_run(e, run_id, at, config=config, budget=budget,
                                  deadline=deadline, owner=str(user.pk)))
    return run.run_id
