"""Fork: a new run from another run's log up to event N, with changed configuration.

``fork(engine, "run-x", 7, config={...}, budget=..., deadline=...)`` starts a run whose
``aaa.run.started`` is run-x's with the new configuration and ``"forked_from": {"run":
"run-x", "seq": 7, "event": <id of event 7>, "lineage": [...]}``, followed by copies of
run-x's events 2..7; then the engine delivers them, and the run goes on from there with
the new configuration: what was decided and answered up to event 7 stands (the same
model replies, the same tool results), what comes after is decided anew. Fork just
before the decision to redo (a model request made with the old prompt is copied as it
was, and answered as it was, if it is within the first N events).

**Ids.** Every id a run derives comes from its start: an algorithm's decisions from
:func:`decision_id` (the started event's id and a key), results from their request's
id, and so on (:mod:`.types`). A copied event gets the id the fork itself would derive
for it, so that redelivering a copied event, or deciding the same thing again,
absorbs into the copy instead of repeating it:

- an algorithm's decision ``x`` of run X becomes ``derive_id(started_Y, "aaa.fork", x)``,
  which is what :func:`decision_id` computes in Y from X's key (the lineage in the
  started event lists the start of every run the log came through);
- a result, an approval's decision, an intent (``derive_id(request, ...)``) is derived
  again from the new id of its cause; run-level ids from the new run's id;
- ids inside data (a request id an approval names, a child run id) follow the same map.

Child runs that had not ended by event N are started afresh by the fork (new ids);
those that had ended stay ended. The fork is a standalone run (no parent), owned by
whoever forked it; its spend so far is the copied events', counted against its budget.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from datetime import datetime
from types import EllipsisType
from typing import Any

from aaa_django.data import is_claimed
from aaa_django.events import Event, derive_id, new_id

from . import event_types, registry
from .budget import Budget
from .ctx import _budget, absolute_deadline
from .engine_api import EngineAPI
from .event_types import (
    CHILD_REQUESTED,
    RUN_COMPLETED,
    RUN_STARTED,
    completion_id,
    result_id,
    started_id,
)
from .lineage import FORK, FORKED_FROM, decision_id
from .run import Run

__all__ = ["FORKED_FROM", "ForkError", "decision_id", "fork", "merge_patch"]

_CHILD_PREFIX = "run-"


class ForkError(ValueError):
    """A fork that cannot be made; the message says why (nothing was written), and
    ``field`` which argument was wrong ("run", "at" or "config")."""

    def __init__(self, message: str, field: str = "at") -> None:
        super().__init__(message)
        self.field = field


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386 JSON merge patch: ``patch``'s keys replace ``target``'s, objects merge
    recursively, ``null`` removes a key."""
    if not isinstance(patch, Mapping):
        return patch
    out = dict(target) if isinstance(target, Mapping) else {}
    for key, value in patch.items():
        if value is None:
            out.pop(key, None)
        else:
            out[key] = merge_patch(out.get(key), value)
    return out


async def fork(
    engine: EngineAPI,
    run_id: str,
    at: int,
    *,
    config: Mapping[str, Any] | None = None,
    budget: Budget | Mapping[str, Any] | EllipsisType | None = ...,
    deadline: float | datetime | EllipsisType | None = ...,
    owner: str | None = None,
    new_run_id: str | None = None,
) -> Run:
    """Start a fork of ``run_id`` from its first ``at`` events (see the module).

    ``config``: the new algorithm configuration (whole; None keeps the run's);
    ``budget``: a new budget (default: the run's; None: none); ``deadline``: seconds
    from now or an aware datetime (default: as long as the run had; None: none).
    Raises :class:`ForkError` for an unknown run, an ``at`` outside the run before its
    end, or a configuration the algorithm refuses.
    """
    if isinstance(at, bool) or not isinstance(at, int) or at < 1:
        raise ForkError(f"fork at an event's seq (1 or more), not {at!r}")
    events = await engine.store.read(run_id, limit=at)
    if not events or events[0].type != RUN_STARTED:
        raise ForkError(f"no run {run_id!r}", "run")
    if len(events) < at:
        raise ForkError(f"run {run_id} has {len(events)} events; fork at 1..{len(events)}")
    ended = next((e for e in events if e.type == RUN_COMPLETED), None)
    if ended is not None:
        raise ForkError(
            f"event {at} is at or after the run's end (event {ended.seq}): fork from an event before {ended.seq}"
        )
    # Payloads in full: the fork's own claims put them in its own namespace (the
    # origin's claim refs are dropped, its blobs stay its own).
    events = [replace(await engine.hydrate(e), blobs=e.blobs[:-1]) if is_claimed(e.data) else e for e in events]
    started = events[0]
    d = started.data
    name = d["algorithm"]
    new_config = dict(d.get("config") or {}) if config is None else dict(config)
    try:
        registry.build(name, new_config)
    except Exception as exc:
        raise ForkError(f"the configuration does not suit {name}: {exc}", "config") from exc
    new_budget = d.get("budget") if budget is ... else _budget(budget)
    if deadline is ...:
        new_deadline = (
            absolute_deadline(d["deadline"] - started.time.timestamp()) if d.get("deadline") is not None else None
        )
    else:
        new_deadline = absolute_deadline(deadline)
    origin = d.get(FORKED_FROM) or {}
    y = new_run_id or f"run-{new_id()}"
    y_started = Event(
        id=started_id(y),
        stream=y,
        type=RUN_STARTED,
        tenant=started.tenant,
        data={
            **d,
            "config": new_config,
            "budget": new_budget,
            "deadline": new_deadline,
            "parent": None,
            "key": None,
            "owner": owner,
            FORKED_FROM: {
                "run": run_id,
                "seq": at,
                "event": events[-1].id,
                "lineage": [*origin.get("lineage", []), started.id],
            },
        },
    )
    copies = _Translation(run_id, started, y, y_started).copy(events[1:])
    await engine.append([y_started, *copies])
    return Run(engine, y)


class _Translation:
    """X's ids -> the fork's, event by event in log order."""

    def __init__(self, x: str, x_started: Event, y: str, y_started: Event) -> None:
        self.x, self.y = x, y
        self.y_started = y_started
        self.ids: dict[str, str] = {x_started.id: y_started.id}
        self.runs: dict[str, str] = {x: y}

    def copy(self, events: list[Event]) -> list[Event]:
        return [self._copy(e) for e in events]

    def _copy(self, e: Event) -> Event:
        if e.type == CHILD_REQUESTED and isinstance(e.data.get("child"), str):
            child = e.data["child"]
            bare = child[len(_CHILD_PREFIX) :] if child.startswith(_CHILD_PREFIX) else child
            self.runs[child] = _CHILD_PREFIX + derive_id(self.y_started.id, FORK, bare)
        new = self._id(e)
        self.ids[e.id] = new
        causation = self.ids.get(e.causation, e.causation) if e.causation else None
        return replace(e, id=new, stream=self.y, seq=None, data=self._fields(e.data), causation=causation)

    def _id(self, e: Event) -> str:
        c = e.causation
        if c is not None and c in self.ids:
            mc = self.ids[c]
            for derived in (
                lambda p: result_id(p),
                lambda p: event_types.decision_id(p),
                lambda p: derive_id(p, e.type, ""),
            ):
                if e.id == derived(c):
                    return derived(mc)
        for run_level in (completion_id, lambda r: derive_id(r, e.type)):
            if e.id == run_level(self.x):
                return run_level(self.y)
        # An algorithm's decision (or an event from outside): the id decision_id
        # gives in the fork.
        return derive_id(self.y_started.id, FORK, e.id)

    def _fields(self, data: dict[str, object]) -> dict[str, object]:
        return {k: self._data(v) for k, v in data.items()}

    def _data(self, value: object) -> object:
        if isinstance(value, str):
            return self.ids.get(value) or self.runs.get(value) or value
        if isinstance(value, dict):
            return {k: self._data(v) for k, v in value.items()}
        if isinstance(value, list):
            return [self._data(v) for v in value]
        return value
