"""Timers: a run's due times, and what is recorded when one comes.

A deadline, an approval's or a question's expiry and a conversation's idle timeout
are due times (``RunMeta.due``) from the moment their event is stored until the run
ends. When one comes, :meth:`Timers.fire_due` records what is due: the run's one
``timeout`` completion, an approval's one ``aaa.approval.expired``, a question's one
``aaa.question.expired`` (ids are deterministic: firing twice, or in two processes,
records once).

What keeps the timers depends on the bus. On a bus with durable timers
(:class:`~aaa_django.runtime.bus.DurableTimers`: the Celery bus) the run index keeps
them and the workers fire them; on any other the engine holds a loop timer per run
with a due time, armed as soon as the due time is stored (:meth:`Timers.track`, from
the engine's appends) and disarmed by the run's end.
"""

from __future__ import annotations

import asyncio
import contextvars
import time

from aaa_django.events import Event

from . import conversation as talk
from .bus import DurableTimers
from .event_types import APPROVAL_EXPIRED, RUN_COMPLETED
from .facade import Facade
from .meta import due_time
from .outcome import TIMEOUT, Outcome


class Timers:
    """An engine's due times: fired on request (:meth:`fire_due`), and held as loop
    timers unless the bus keeps them (``keeps``)."""

    def __init__(self, engine: Facade) -> None:
        self.engine = engine
        #: this engine holds loop timers (its bus keeps none of its own)
        self.keeps = not isinstance(engine.bus, DurableTimers)
        #: run id -> (due time, loop timer)
        self.held: dict[str, tuple[float, asyncio.TimerHandle]] = {}

    async def fire_due(self, run_id: str, *, now: float | None = None) -> list[Event]:
        """Record what the run's due times call for at ``now`` (default: the clock):
        the run ends ``timeout`` once its deadline has passed; otherwise each pending
        approval past its expiry is recorded ``aaa.approval.expired``, and a question's
        expiry or a conversation's idle timeout what it calls for. Returns the events
        appended."""
        engine = self.engine
        now = time.time() if now is None else now
        meta = await engine.meta(run_id)
        if not meta.started or meta.completed:
            return []
        if meta.deadline is not None and now >= meta.deadline:
            started = await engine.started(run_id)
            outcome = Outcome(TIMEOUT, {"deadline": meta.deadline})
            return await engine.append([engine.completion(run_id, outcome, cause=started)])
        fired: list[Event] = []
        expired = [rid for rid, p in meta.approvals.items() if p.expires_at is not None and now >= p.expires_at]
        for rid in sorted(expired, key=lambda r: meta.approvals[r].seq):
            fired += await engine._commands.decide(run_id, rid, APPROVAL_EXPIRED, meta=meta, by=None, reason="expired")
        if meta.questions or meta.awaiting:  # questions' expiries, a conversation's idle timeout
            fired += await talk.fire_due(engine, run_id, now)
        return fired

    def due(self) -> dict[str, float]:
        """Run id -> the due time a loop timer is held for."""
        return {run_id: at for run_id, (at, _) in self.held.items()}

    def track(self, stored: list[Event]) -> None:
        """After an append: a timer armed for each due time stored, disarmed by an end."""
        for e in stored:
            if e.type == RUN_COMPLETED:
                self.disarm(e.stream)
            else:
                at = due_time(e)
                if at is not None:
                    self.arm(e.stream, at)

    def arm(self, run_id: str, at: float) -> None:
        """Hold a loop timer for the run at ``at`` unless it has one due no later."""
        if self.engine._closed or not self.keeps:
            return
        held = self.held.get(run_id)
        if held is not None:
            if held[0] <= at:
                return
            held[1].cancel()
        loop = asyncio.get_running_loop()
        handle: asyncio.TimerHandle

        def ring() -> None:
            if self.held.get(run_id, (None, None))[1] is handle:
                del self.held[run_id]
            self.engine.bus.spawn(self.ring(run_id))

        # In a context of its own: the delivery that armed it (its contextvars) is not
        # kept alive for as long as the run waits (a conversation, for hours).
        handle = loop.call_later(max(0.0, at - time.time()), ring, context=contextvars.Context())
        self.held[run_id] = (at, handle)

    async def ring(self, run_id: str) -> None:
        """A loop timer came: fire what is due, and arm the next one."""
        fired = await self.engine.fire_due(run_id)
        due = (await self.engine.meta(run_id)).due
        # Again for the next due time; or for this one when the loop's clock ran early
        # (nothing was due yet by the wall clock the engine decides by).
        if due is not None and (fired or due > time.time()):
            self.arm(run_id, due)

    def disarm(self, run_id: str) -> None:
        """Drop the run's loop timer, if one is held."""
        held = self.held.pop(run_id, None)
        if held is not None:
            held[1].cancel()

    def close(self) -> None:
        """Cancel every loop timer (the engine closes)."""
        for _, handle in self.held.values():
            handle.cancel()
        self.held.clear()
