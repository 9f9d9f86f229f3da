"""Commands: what a person (or a program acting for one) asks of a run.

Start a run (its ``aaa.run.started``), cancel it, grant or deny a pending approval,
erase runs that have ended. Each is recorded as an event with a deterministic id (a
run's one start, its one ``aaa.cancel.requested``, an approval's one decision), so
asking twice records once; what the run does about it is its step's to decide, from
``RUNMETA``, like anything else in its log. And adopt unfinished runs (``resume``: a
process that takes over another's delivers their events again; every reaction is
idempotent, so only what was left undone is done), and end a run ``failed`` when a
bus gives up on a delivery of its events. The engine's public methods (:meth:`Engine.start <aaa_django.runtime.Engine.start>`,
``describe``, ``fail``, ``cancel``, ``approve``, ``deny``, ``erase``, ``erase_runs``,
``resume``) are these.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping
from datetime import datetime
from typing import Any

from aaa_django.events import Event, derive_id, new_id

from . import conversation as talk
from . import offered, registry
from .budget import Budget
from .ctx import _budget, _plain, absolute_deadline
from .errors import RunNotEndedError
from .event_types import (
    APPROVAL_DENIED,
    APPROVAL_EXPIRED,
    APPROVAL_GRANTED,
    CANCEL_REQUESTED,
    RUN_STARTED,
    decision_id,
    started_id,
)
from .facade import Facade
from .meta import RunMeta
from .outcome import FAILED, Outcome
from .retry import failure


class Commands:
    """An engine's commands to its runs."""

    def __init__(self, engine: Facade) -> None:
        self.engine = engine

    def describe(self, algorithm: Any) -> tuple[str, dict[str, Any]]:
        """``(registered name, JSON config)`` of an algorithm instance, class or name;
        a class not registered yet is registered."""
        if isinstance(algorithm, str):
            registry.get(algorithm)
            return algorithm, {}
        cls = algorithm if isinstance(algorithm, type) else type(algorithm)
        name = getattr(cls, "name", None)
        if not name:
            raise TypeError(f"{cls.__qualname__} has no registered `name`")
        try:
            registry.get(name)
        except registry.UnknownAlgorithmError:
            registry.register(cls)
        config = algorithm.config() if not isinstance(algorithm, type) else {}
        return name, config

    async def start(
        self,
        algorithm: Any,
        input: object,
        *,
        budget: Budget | Mapping[str, Any] | None = None,
        deadline: float | datetime | None = None,
        parent: str | None = None,
        owner: str | None = None,
        run_id: str | None = None,
        conversation: bool | Mapping[str, Any] | None = None,
    ) -> str:
        """Append a run's ``aaa.run.started``; return the run's id (see
        :meth:`Engine.start <aaa_django.runtime.Engine.start>`)."""
        engine = self.engine
        name, config = self.describe(algorithm)
        conversation_settings = talk.settings(conversation)
        if conversation_settings is not None:
            talk.check_algorithm(name, config)
        run_id = run_id or f"run-{new_id()}"
        data = {
            "algorithm": name,
            "config": offered.resolve(engine, name, config),
            "input": _plain(input),
            "budget": _budget(budget),
            "deadline": absolute_deadline(deadline),
            "parent": parent,
            "owner": owner,
        }
        if conversation_settings is not None:
            data["conversation"] = conversation_settings
        await engine.append([Event(id=started_id(run_id), stream=run_id, type=RUN_STARTED, data=data)])
        return run_id

    async def fail(self, run_id: str, exc: BaseException, *, event: Event | None = None, attempts: int = 1) -> bool:
        """End a run ``failed`` because delivering ``event`` raised ``exc`` for good (see
        :meth:`Engine.fail <aaa_django.runtime.Engine.fail>`); True if this ended it."""
        engine = self.engine
        meta = await engine.meta(run_id)
        if not meta.started or meta.completed:
            return False
        value = failure(
            exc,
            event_id=event.id if event is not None else None,
            event_type=event.type if event is not None else None,
            attempts=attempts,
        )
        return await engine.complete(run_id, Outcome(FAILED, value), cause=event)

    async def cancel(self, run_id: str, *, reason: str | None = None, by: str | None = None) -> bool:
        """Ask for a run to end ``cancelled`` (its in-flight tool calls are cancelled).

        Returns False if the run has ended (or was asked already).
        """
        engine = self.engine
        meta = await engine.meta(run_id)
        if not meta.started or meta.completed:
            return False
        e = Event(
            id=derive_id(run_id, CANCEL_REQUESTED),
            stream=run_id,
            type=CANCEL_REQUESTED,
            data={"reason": reason, "by": by},
        )
        return bool(await engine.append([e]))

    async def approve(self, run_id: str, request_id: str, *, by: str | None = None, reason: str | None = None) -> bool:
        """Grant a pending approval (``request_id``: the ``aaa.approval.requested`` id).

        Returns False if there is no such pending approval or it was decided already;
        an approval given after its expiry records ``aaa.approval.expired`` instead.
        """
        return bool(await self.decide(run_id, request_id, APPROVAL_GRANTED, by=by, reason=reason))

    async def deny(self, run_id: str, request_id: str, *, by: str | None = None, reason: str | None = None) -> bool:
        """Deny a pending approval: the tool call fails with reason ``denied``."""
        return bool(await self.decide(run_id, request_id, APPROVAL_DENIED, by=by, reason=reason))

    async def decide(
        self, run_id: str, request_id: str, type: str, *, meta: RunMeta | None = None, **extra: object
    ) -> list[Event]:
        """Record the approval ``request_id``'s one decision (``type``; expired instead
        once past its expiry); the events appended (none: no such pending approval)."""
        meta = meta if meta is not None else await self.engine.meta(run_id)
        pending = meta.approvals.get(request_id)
        if pending is None or meta.completed:
            return []
        if pending.expires_at is not None and time.time() >= pending.expires_at:
            type = APPROVAL_EXPIRED
        data = {
            "request_id": request_id,
            "tool_request_id": pending.tool_request_id,
            "tool_request_seq": pending.tool_request_seq,
            "call_id": pending.call_id,
            "name": pending.name,
            **extra,
        }
        e = Event(id=decision_id(request_id), stream=run_id, type=type, data=data, causation=request_id)
        return await self.engine.append([e])

    async def erase(self, run_id: str) -> int:
        """Erase a run that has ended: its events, snapshots, blobs and in-process
        cached state.

        Returns the number of events erased. A run that has started and not ended is
        refused (:class:`RunNotEndedError`: cancel it, then erase it), so no handler
        still at work can write to it after (and a late result to an erased run is
        refused by the store: a run's stream starts with its start). Child runs are
        separate runs: erase them on their own.
        """
        meta = await self.engine.meta(run_id)
        if meta.started and not meta.completed:
            raise RunNotEndedError(f"run {run_id} has not ended: cancel it, then erase it")
        return await self.erase_runs([run_id])

    async def erase_runs(self, run_ids: Iterable[str]) -> int:
        """Erase runs as :meth:`erase` does, their logs in one transaction where the
        store can (:class:`~aaa_django.events.ErasesMany`); return the events erased.
        For runs known to have ended (retention selects them by their end): unlike
        :meth:`erase`, it does not read each run to check.

        The logs go first, then the blobs: a crash in between leaves blobs no stream
        refers to, which the orphan sweep (``aaa_django.site.retention``) removes.
        """
        engine = self.engine
        run_ids = list(dict.fromkeys(run_ids))
        if not run_ids:
            return 0
        refs: set = set()
        if engine.blobs is not None and not engine._namespaced:  # their refs, read before they go
            for run_id in run_ids:
                refs.update(ref for e in await engine.store.read(run_id) for ref in e.blobs)
        for run_id in run_ids:
            engine.forget(run_id)  # the tail's log of it first: the erase must not be read back
        if engine._erase_many is not None:
            count = await engine._erase_many(run_ids)
        else:
            count = 0
            for run_id in run_ids:
                count += await engine.store.erase(run_id)
        for run_id in run_ids:
            if engine._namespaces is not None:
                await engine._blob_call(engine._namespaces.delete_namespace, run_id)
            engine.forget(run_id)  # again: a read during the erase may have kept some of it
            engine._ended.pop(run_id, None)  # (an import may write it again)
            engine._completions.pop(run_id, None)
            engine._timers.disarm(run_id)
        if engine.blobs is not None:
            for ref in refs:
                await engine._blob_call(engine.blobs.delete, ref)
        gone = set(run_ids)
        for key in [k for k, e in engine._hydrated.items() if e.stream in gone]:
            del engine._hydrated[key]
        return count

    async def resume(self, run_ids: Iterable[str] | None = None) -> list[str]:
        """Adopt unfinished runs found in the store (all, or these) and drive them to
        the end (:meth:`Engine.resume <aaa_django.runtime.Engine.resume>`).

        For each run with a start and no completion its events are delivered again
        (every reaction is idempotent, so this only does what was left undone), a
        finished child's completion is delivered again to its waiting parent, and an
        orphan whose parent has ended is cancelled. Returns the adopted run ids.
        """
        engine = self.engine
        streams = list(run_ids) if run_ids is not None else await engine.store.streams()
        adopted = []
        for stream in streams:
            meta = await engine.meta(stream)
            if not meta.started or meta.completed:
                continue
            adopted.append(stream)
            if meta.due is not None:
                engine._timers.arm(stream, meta.due)
            await engine.bus.publish(await engine.store.read(stream))
            for child in meta.children:
                done = await engine._children.completion_event(child)
                if done is not None:
                    await engine.bus.publish([done])
            if meta.parent:
                parent_done = await engine._children.completion_event(meta.parent)
                if parent_done is not None:
                    await engine.append([engine._children.cascade_cancel(parent_done, stream)])
        return adopted
