"""The step function: one event's delivery to its run.

:meth:`Steps.handle` (the engine's :meth:`~aaa_django.runtime.Engine.handle`) is what
a bus calls for every appended event, in whatever process takes it, in a turn of its
own (:mod:`~aaa_django.runtime.turns`) and within one delivery
(:mod:`~aaa_django.runtime.delivery`):

1. the event hydrated (claim-checked payloads come back from the blob store); a bus
   whose messages name a stored event (:class:`~.engine_api.Stored`: the Celery bus)
   has it read first, from the tail when the message brought the tail's view of the
   run up to date (``synced``), else with one read that brings it up to date;
2. the run's step (:meth:`Steps.step`), under the bus's serialisation of the run and
   guarded by the head of the log it read (tried again when the log moved on): the
   engine's own reaction decided from ``RUNMETA`` (limits, a run's end and what it
   means to its parent and children, starting a child), then the run's algorithm
   step, rebuilt from ``aaa.run.started`` through the registry, whose output is
   checked and appended (a step over a call budget ends the run instead);
3. the handlers subscribed to the event's type, concurrently (:meth:`Steps.dispatch`),
   unless the bus's ``dispatching(event)`` says they do not run here (a worker that no
   longer holds the run); after a run's end, what this process kept of the run goes.

What fails there is not the run's doing unless the algorithm raised (its run ends
``failed``): a store's or a handler's error propagates out of ``handle``, and the bus
delivers again or gives up (:meth:`Engine.fail <aaa_django.runtime.Engine.fail>`).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import traceback
from collections.abc import Callable

from aaa_django.data import is_claimed
from aaa_django.events import ConcurrencyError, Event, InfrastructureError, check_event

from . import bounded, limits, registry
from . import conversation as talk
from .ctx import Ctx, TakesSteps
from .engine_api import Handler, Stored
from .event_types import (
    ATTEMPT_RECORDS,
    CHILD_REQUESTED,
    MESSAGE_SENT,
    QUESTION_ASKED,
    RUN_COMPLETED,
    RUN_STARTED,
)
from .facade import Facade
from .meta import RunMeta
from .observe import around
from .outcome import BUDGET_EXCEEDED, FAILED, Outcome
from .retry import transient

log = logging.getLogger("aaa_django.runtime")

#: tries of a run's step whose appends find the log moved on (another process wrote);
#: past them the error is raised (a Celery delivery is then retried)
STEP_TRIES = 8


class Steps:
    """An engine's deliveries: the run's step and the handlers."""

    def __init__(self, engine: Facade) -> None:
        self.engine = engine

    async def handle(
        self,
        event: Event | Stored,
        *,
        synced: Callable[[], bool] | None = None,
        loaded: Callable[[Event | None], None] | None = None,
        dispatching: Callable[[Event], bool] | None = None,
    ) -> Event | None:
        """React to one appended event: the engine, the run's algorithm, the handlers
        (:meth:`Engine.handle <aaa_django.runtime.Engine.handle>`); returns the event
        delivered (hydrated), or None when the log no longer holds a stored event
        (erased) or the engine is closed.

        ``event``: the event itself (the in-process bus), or the stored event a
        message names (:class:`Stored`: the Celery worker), which is read first. For
        a stored event, ``synced()`` is asked in the delivery's scope before the read
        (True: the caller brought the tail's view of the run up to date, the read is
        served from memory), and ``loaded(event)`` is told what the read found (None
        too, and on errors). ``dispatching(event)``: asked after the step, before the
        handlers; False, they are not run here.

        Idempotent: delivering an event again (or an older one) writes nothing new.
        Raises what a store or a handler raised (see :mod:`aaa_django.runtime.engine`):
        the bus delivers again or gives up (:meth:`Engine.fail
        <aaa_django.runtime.Engine.fail>`).
        """
        engine = self.engine
        if isinstance(event, Stored):
            return await self._handle_stored(event, synced, loaded, dispatching)
        if engine._closed:
            return None
        if event.id in engine._stepped and not engine._handlers.get(event.type):
            # A result ``answer`` stepped on, and no handler of its own: delivered.
            del engine._stepped[event.id]
            engine.delivered(event.stream)
            return event
        try:
            async with engine.turns.turn():
                with engine.tail.delivery(), engine.observing(event), engine.delivering(event.stream):
                    # An event this engine appended (or read) is in its tail: the run's
                    # view is current without a read (the step's guard catches another
                    # process's write).
                    current = engine.tail.holds(event)
                    if is_claimed(event.data):
                        event = await engine.hydrate(event)
                    await self._step_and_dispatch(event, current, dispatching)
                    return event
        finally:
            engine.delivered(event.stream)

    async def _handle_stored(
        self,
        stored: Stored,
        synced: Callable[[], bool] | None,
        loaded: Callable[[Event | None], None] | None,
        dispatching: Callable[[Event], bool] | None,
    ) -> Event | None:
        engine = self.engine
        try:
            async with engine.turns.turn():
                with engine.tail.delivery(), engine.delivering(stored.stream):
                    event = await self._load(stored, bool(synced and synced()), loaded)
                    if event is None:
                        return None  # erased (or erased and written again): nothing to do
                    event = await engine.hydrate(event)
                    with engine.observing(event):  # log lines carry the event; observers watch it
                        # The read brought this process's view of the run up to date.
                        await self._step_and_dispatch(event, True, dispatching)
                    return event
        finally:
            engine.delivered(stored.stream)

    async def _load(self, stored: Stored, synced: bool, loaded: Callable[[Event | None], None] | None) -> Event | None:
        """The event ``stored`` names: from the tail when the view is ``synced``, else
        with one read that brings this process's view of the run up to date, which the
        step needs anyway; None when the log no longer holds it. ``loaded`` is told
        either way, also when the read fails."""
        tail, stream, seq = self.engine.tail, stored.stream, stored.seq
        event = None
        try:
            if not synced:
                tail.stale(stream)
            found = await self.engine.store.read(stream, after=seq - 1, limit=1)
            if synced and not (found and found[0].id == stored.id):
                # The view this delivery was told is current lacks its own event: never
                # take that for an erased one (its run would wait for a re-drive). Ask.
                # (A bug of the tail's if it happens: said, so that it is seen.)
                log.warning(
                    "run %s: the view of the run held for the delivery of seq %s (%s) lacked it; reading the run again",
                    stream,
                    seq,
                    stored.id,
                )
                tail.stale(stream)
                found = await self.engine.store.read(stream, after=seq - 1, limit=1)
            event = found[0] if found and found[0].id == stored.id else None
        finally:
            if loaded is not None:
                loaded(event)
        return event

    async def _step_and_dispatch(self, event: Event, synced: bool, dispatching: Callable[[Event], bool] | None) -> None:
        engine = self.engine
        await engine.step(event, synced=synced)
        if dispatching is not None and not dispatching(event):
            return  # the caller keeps the handlers from running here
        await engine.dispatch(event)

    async def step(self, event: Event, *, synced: bool = False) -> None:
        """The run's step for ``event`` (:meth:`react`; :meth:`Engine.step
        <aaa_django.runtime.Engine.step>`), under the bus's serialisation of the run, in
        a delivery (``store.delivery()``). Its appends to the run's
        stream are guarded by the head of the view it read: when another process
        appended meanwhile, nothing of the try is stored and the step runs again from
        the log as it is now (from the second try on, ``contended``: a bus may then
        take a stronger lock). ``synced``: the tail holds the run as it is, no read."""
        engine = self.engine
        if event.id in engine._stepped:
            del engine._stepped[event.id]  # ``answer`` took it, before the event was appended
            return
        tail, stream = engine.tail, event.stream
        for attempt in range(STEP_TRIES):
            current = synced and attempt == 0
            try:
                async with engine.bus.serial(stream, contended=attempt > 0, synced=current):
                    if not current:
                        tail.stale(stream)
                    with tail.guard(stream) if engine.guard_steps else contextlib.nullcontext():
                        await engine.react(event)
                return
            except ConcurrencyError:
                if attempt == STEP_TRIES - 1:
                    raise

    async def react(self, event: Event) -> None:
        """The engine's reaction and the algorithm step (the caller serialises runs)."""
        engine = self.engine
        run_id = event.stream
        meta = await engine.meta(run_id)
        if not meta.started:
            return
        if event.type == RUN_COMPLETED:
            await engine._children.after_end(event, meta)
            return
        if meta.completed:
            return  # recorded, changes nothing
        if event.type == RUN_STARTED:
            if not registry.known(meta.algorithm or ""):
                await engine.complete(
                    run_id,
                    Outcome(
                        FAILED, {"error": f"unknown algorithm {meta.algorithm!r}: import the module that registers it"}
                    ),
                    cause=event,
                )
                return
        breach = engine.limit_breach(meta)
        if breach is None and meta.close is not None:  # a conversation closed by a person
            breach = await talk.closing(engine, meta)
        if breach is not None:
            await engine.complete(run_id, breach, cause=event)
            return
        if event.type == CHILD_REQUESTED and event.data.get("child") in meta.children:
            await engine._children.start(event, meta)
        if meta.validated and event.type not in ATTEMPT_RECORDS:
            await self.algorithm_step(event, meta)

    async def algorithm_step(self, event: Event, meta: RunMeta) -> None:
        """The run's algorithm's step on ``event``, its output checked and appended: an
        algorithm that raises, or writes what the store would refuse, ends its run
        ``failed``; requests over a call budget end it ``budget_exceeded`` instead."""
        engine = self.engine
        run_id = event.stream
        started = await engine.started(run_id)
        if started is None:
            return
        try:
            algorithm = engine.algorithm(started)
            if event.type in getattr(algorithm, "ignores", ()):
                return
            ctx = Ctx(engine, started, event, meta, algorithm)
            if engine.watchers:
                name = started.data["algorithm"]
                with around(engine.watchers, lambda o: o.step(event, name)):
                    await algorithm.step(ctx, event)
            else:
                await algorithm.step(ctx, event)
        except InfrastructureError:
            raise  # not the algorithm's fault: the delivery fails (and is retried)
        except Exception as exc:
            value = {
                "error": f"{type(exc).__name__}: {exc}",
                "traceback": traceback.format_exc(),
            }
            await engine.complete(run_id, Outcome(FAILED, value), cause=event)
            return
        out = ctx._out
        if not out:
            return
        # The algorithm's own bad output is its failure, decided before anything else.
        # The store checks every event it is given (``check_event``, before writing any):
        # the output is checked here first only where the store would not see all of it
        # (a step over budget, an event past the run's end); else once, by the store,
        # and checked again here only if the append raised (one JSON encoding per
        # event, not two).
        over = limits.over_budget(meta, out)
        if over is not None or not _all_stored(out, run_id):
            bad = _bad_output(out)
            if bad is not None:
                await engine.complete(run_id, Outcome(FAILED, bad), cause=event)
                return
        if over is not None:  # the requests are refused, not recorded: never made
            await engine.complete(run_id, Outcome(BUDGET_EXCEEDED, over), cause=event)
            return
        try:
            await engine.append(out)
        except Exception:
            bad = _bad_output(out)
            if bad is None:
                raise  # not the output's fault
            await engine.complete(run_id, Outcome(FAILED, bad), cause=event)

    def algorithm(self, started: Event) -> TakesSteps:
        """The run's algorithm, rebuilt from its started event through the registry
        (:meth:`Engine.algorithm <aaa_django.runtime.Engine.algorithm>`).

        A pure function of the registered name and the JSON config (never any run
        state: algorithms hold none), so one instance serves every run started with
        the same name and config (``ALGORITHMS_KEPT`` of them, and of runs), built
        once: a ToolLoop builds its tools' schemas, a thousand runs of one agent do
        not build them a thousand times.
        """
        engine = self.engine
        algo = engine._algorithms.get(started.id)
        if algo is None:
            name, config = started.data["algorithm"], started.data.get("config") or {}
            key = (name, json.dumps(config, sort_keys=True, separators=(",", ":")))
            algo = engine._built.get(key)
            if algo is None:
                algo = registry.build(name, config)
            bounded.keep(engine._built, key, algo, bounded.ALGORITHMS_KEPT)
            bounded.keep(engine._algorithms, started.id, algo, bounded.ALGORITHMS_KEPT)
        return algo

    async def dispatch(self, event: Event) -> None:
        """Run the handlers subscribed to the event's type, concurrently (:meth:`Engine.dispatch
        <aaa_django.runtime.Engine.dispatch>`; the last part
        of a delivery: after a run's end, what this process kept of the run goes); then
        raise what one of them raised (a failure retrying cannot mend first), so the
        bus delivers the event again or gives up on it. Every handler runs either way:
        one that fails does not stop the others."""
        engine = self.engine
        handlers = engine._handlers.get(event.type) or []
        raised: list[BaseException | None] = []
        if len(handlers) == 1:
            raised = [await self._call(handlers[0], event)]
        elif handlers:
            raised = await asyncio.gather(*(self._call(h, event) for h in handlers))
        if event.type == RUN_COMPLETED:
            bounded.keep(engine._ended, event.stream, None, bounded.ENDED_KEPT)
            engine.forget(event.stream)
        elif event.type in (MESSAGE_SENT, QUESTION_ASKED) and (await engine.meta(event.stream)).status == "waiting":
            engine.forget(event.stream)  # waiting for a person: the run holds nothing but its rows
        failed = [exc for exc in raised if exc is not None]
        if failed:
            raise next((exc for exc in failed if not transient(exc)), failed[0])

    async def _call(self, handler: Handler, event: Event) -> BaseException | None:
        engine = self.engine
        try:
            if engine.watchers:
                with around(engine.watchers, lambda o: o.handler(handler, event)):
                    await handler(event)
            else:
                await handler(event)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            if not isinstance(exc, InfrastructureError):  # a handler bug: say where
                engine.errors.append(exc)
                log.exception("handler %r failed on %s %s", handler, event.type, event.id)
            return exc
        return None


def _all_stored(out: list[Event], run_id: str) -> bool:
    """Would an append of a step's output ``out`` hand all of it to the run's store (one
    stream, the run's; nothing after a completion)?"""
    for i, e in enumerate(out):
        if e.stream != run_id:
            return False
        if e.type == RUN_COMPLETED:
            return i == len(out) - 1
    return True


def _bad_output(out: list[Event]) -> dict | None:
    """What is wrong with a step's output (the run's ``failed`` value), or None."""
    try:
        for e in out:
            check_event(e)
    except Exception as exc:
        return {"error": f"{type(exc).__name__}: {exc}", "traceback": traceback.format_exc()}
    return None
