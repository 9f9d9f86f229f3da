"""Deliveries: one fold of a run's ``RUNMETA`` per delivery.

A delivery of an event to a run (the engine's :meth:`~aaa_django.runtime.Engine.handle`,
or an answer's step on a result before its append) reads the run's ``RUNMETA`` once:
the engine's reaction, the algorithm's step and the handlers decide from that one
fold, until this engine appends to the run (then the fold is old and read again).
Deliveries are per context (an asyncio task's): two deliveries to one run at once (a
tool call going on while a cancellation arrives) each read for themselves, and a task
started during a delivery that has ended is not in it.
"""

from __future__ import annotations

import contextlib
import contextvars
from dataclasses import dataclass

from .engine_api import EngineAPI
from .meta import RUNMETA, RunMeta


@dataclass(eq=False)
class Delivering:
    """A delivery to a run: the RUNMETA it read (None: read it again: this engine
    appended to the run since)."""

    meta: RunMeta | None = None


class Deliveries:
    """An engine's deliveries now, and the ``RUNMETA`` each read."""

    def __init__(self, engine: EngineAPI) -> None:
        self.engine = engine
        #: run id -> the deliveries to it now (a RUNMETA they keep is old once this
        #: engine appends to the run)
        self.running: dict[str, set[Delivering]] = {}
        #: the deliveries of this context (a task's), by run id: concurrent deliveries
        #: to one run (a tool call going on while a cancellation arrives) read
        #: RUNMETA each for itself
        self.current: contextvars.ContextVar[dict[str, Delivering] | None] = contextvars.ContextVar(
            f"aaa_delivery_{id(engine):x}", default=None
        )

    async def meta(self, run_id: str, *, fresh: bool = False) -> RunMeta:
        """The engine's view of a run (``RUNMETA``); read-only (:meth:`Engine.meta
        <aaa_django.runtime.Engine.meta>`).

        While the run is being delivered to (:meth:`Engine.delivering
        <aaa_django.runtime.Engine.delivering>`) it is read once and kept until this
        engine appends to the run: the engine's step and the handlers of a delivery
        decide from one fold. ``fresh``: read it again anyway (to see what other
        processes appended since).
        """
        delivering = (self.current.get() or {}).get(run_id)
        if delivering is not None and delivering not in self.running.get(run_id, ()):
            delivering = None  # inherited by a task from a delivery that has ended
        if delivering is not None and delivering.meta is not None and not fresh:
            return delivering.meta
        engine = self.engine
        meta = await RUNMETA.load(engine.store, run_id, cache=engine.cache)
        if delivering is not None:
            delivering.meta = meta
        return meta

    def scope(self, run_id: str) -> contextlib.AbstractContextManager[None]:
        """Within: a delivery to run ``run_id``."""
        return DeliveryScope(self, run_id)

    def appending(self, run_id: str) -> None:
        """This engine appends to ``run_id``: a RUNMETA kept for a delivery is old."""
        for delivery in self.running.get(run_id, ()):
            delivery.meta = None


class DeliveryScope:
    """:meth:`Deliveries.scope`'s context manager (a class, not a generator: entered
    once per delivery, in a third of the time)."""

    __slots__ = ("deliveries", "run_id", "delivering", "token")

    def __init__(self, deliveries: Deliveries, run_id: str) -> None:
        self.deliveries = deliveries
        self.run_id = run_id
        self.delivering: Delivering | None = None

    def __enter__(self) -> None:
        deliveries, run_id = self.deliveries, self.run_id
        current = deliveries.current.get() or {}
        outer = current.get(run_id)
        if outer is not None and outer in deliveries.running.get(run_id, ()):
            return  # within one already (the engine's handle in a bus's)
        # (a task started during a delivery that has ended inherits it: not one)
        delivering = self.delivering = Delivering()
        deliveries.running.setdefault(run_id, set()).add(delivering)
        self.token = deliveries.current.set({**current, run_id: delivering})

    def __exit__(self, *exc: object) -> None:
        delivering = self.delivering
        if delivering is None:
            return
        deliveries = self.deliveries
        deliveries.current.reset(self.token)
        others = deliveries.running.get(self.run_id)
        if others is not None:
            others.discard(delivering)
            if not others:
                del deliveries.running[self.run_id]
