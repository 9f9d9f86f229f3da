"""``InProcessBus``: delivers appended events to the engine on the asyncio loop.

Each published event becomes a task running ``engine.handle(event)``. The algorithm
step of a run is serialised by a per-run lock (FIFO, so steps see events in publish
order); handlers (slow tools, model calls) run concurrently. ``duplicate=True``
delivers every event twice: at-least-once made visible, for tests.

A delivery that fails transiently (a store's outage, see
:func:`~aaa_django.runtime.retry.transient`) is delivered again after the
:class:`~aaa_django.runtime.retry.Redelivery` policy's delay, each retry logged as a
warning; one that fails for good, or outlasts the retries, ends its run ``failed``
naming the cause (:meth:`Engine.fail <aaa_django.runtime.Engine.fail>`).
"""

from __future__ import annotations

import asyncio
import logging
import random
import weakref
from collections.abc import Awaitable, Callable, Coroutine, Iterable
from contextlib import AbstractAsyncContextManager
from typing import (
    Any,
    Literal,
    Protocol,
    runtime_checkable,
)

from aaa_django.events import Event

from .engine_api import EngineAPI
from .retry import Redelivery, transient
from .turns import for_delivery

log = logging.getLogger("aaa_django.runtime")

#: what a bus runs for the engine beside deliveries (a timer's work)
Work = Coroutine[Any, Any, object]


class Bus(Protocol):
    """What the engine needs from a bus (in-process here; Celery in the Django layer).

    ``publish`` must eventually call ``engine.handle(e)`` for each event, at least
    once, anywhere (a bus may split it: ``engine.step(e)`` on an algorithm queue,
    ``engine.dispatch(e)`` on handler queues, then ``engine.delivered(e.stream)``
    once the delivery is over). ``serial(run)`` serialises the steps
    of one run (``contended``: the step's previous try found the log moved on;
    ``synced``: its view of the run is current); ``spawn`` runs the engine's timers' work.
    Optional: :class:`WatchesEnds`, for a bus that can hear of runs ended by other
    processes and call ``engine.wake(run_id)`` (the Celery bus).
    """

    def bind(self, engine: EngineAPI) -> None: ...

    async def publish(self, events: Iterable[Event]) -> None: ...

    def serial(
        self, key: str, *, contended: bool = False, synced: bool = False
    ) -> AbstractAsyncContextManager[object]: ...

    def spawn(self, coro: Work) -> None: ...

    async def drain(self, timeout: float | None = None) -> None: ...

    async def close(self, *, cancel: bool = True) -> None: ...


@runtime_checkable
class ExclusiveLeases(Protocol):
    """A bus whose deliveries of one event may run in several processes at once (the
    Celery bus) offers exclusive leases across them: ``async with bus.exclusive(name)``
    holds the one lease on ``name`` while inside, waiting while a live holder has it.
    A holder that dies loses its lease after a while (its TTL), so a waiter then gets
    it. The ``ToolHandler`` holds a guarded call's intent with one: a second delivery
    of the request waits for the first instead of calling the call uncertain. (In one
    process the handler itself sees a delivery that is already running.)
    """

    def exclusive(self, name: str) -> AbstractAsyncContextManager[None]: ...


@runtime_checkable
class DeliversHere(Protocol):
    """A bus with :class:`ExclusiveLeases` that can say, before an event is appended in
    this process, that its delivery will be taken here, on this process's loop,
    without a message (the Celery bus in a worker that takes the event's queue and has
    room): the model handler then records a request's first attempt in the request's
    own append, holding the attempt's lease from before that append, as it does on
    the in-process bus (which delivers everything where it was appended, and need not
    say). ``delivers_here(event)``: will it be taken here, if appended now?"""

    def delivers_here(self, event: Event) -> bool: ...


@runtime_checkable
class WatchesEnds(Protocol):
    """A bus that hears of runs ended by other processes (the Celery bus): the engine
    calls ``watch_ends()`` when it first waits, and the bus calls ``engine.wake``."""

    def watch_ends(self) -> None: ...


@runtime_checkable
class DurableTimers(Protocol):
    """A bus whose runs' due times (deadlines, approval expiries) are fired from durable
    state outside the engine: the Celery bus, whose workers fire what the run index's
    ``due_at`` says is due (``aaa_django.celery.duty``). An engine on such a bus keeps no loop
    timers; on any other bus it keeps one per run with a due time (see
    ``Engine.timers``). Either way a timer fires ``Engine.fire_due``."""

    durable_timers: Literal[True]


@runtime_checkable
class StepsInline(Protocol):
    """A bus on which a run's step on a handler's result may be taken where the result
    is made, before it is appended (``Engine.answer``): the step runs under
    ``serial(run)``, and its output goes with the result in one append guarded by the
    head of the log it read, so the same guard that keeps two steps from deciding on
    one log holds here. ``steps_here(event)``: may the step on ``event`` run in this
    process now (the in-process bus: always; the Celery bus: in a worker that takes
    the event's queue, where its delivery would be taken on the worker's loop too)?
    The result's delivery then skips the step (it was taken)."""

    def steps_here(self, event: Event) -> bool: ...


class InProcessBus:
    """The embedded bus: asyncio tasks in this process (the default).

    ``redelivery``: when a delivery that failed transiently is tried again (default
    :class:`~aaa_django.runtime.retry.Redelivery`); ``sleep``: how the bus waits
    meanwhile (a test passes one that records the delays).
    """

    def __init__(
        self,
        *,
        duplicate: bool = False,
        redelivery: Redelivery | None = None,
        sleep: Callable[[float], Awaitable[object]] | None = None,
    ) -> None:
        self.copies = 2 if duplicate else 1
        self.redelivery = redelivery or Redelivery()
        self._sleep = sleep or asyncio.sleep
        self.engine: EngineAPI | None = None
        self._running: set[asyncio.Task] = set()
        self._locks: weakref.WeakValueDictionary[str, asyncio.Lock] = weakref.WeakValueDictionary()
        self.closed = False
        #: exceptions of deliveries given up on (a persistent failure, an outage that
        #: outlasted the retries, a bug), newest last
        self.errors: list[BaseException] = []
        #: deliveries made (each copy counts)
        self.delivered = 0
        #: ``(event id, retry number, delay, exception)`` of each redelivery, oldest first
        self.retried: list[tuple[str, int, float, BaseException]] = []

    def bind(self, engine: EngineAPI) -> None:
        """Attach the engine whose ``handle`` receives the events."""
        self.engine = engine

    async def publish(self, events: Iterable[Event]) -> None:
        """Schedule the delivery of ``events`` (in order); does not wait for them."""
        if self.closed or self.engine is None:
            return
        for e in events:
            for _ in range(self.copies):
                self._spawn(self._deliver(e))

    async def _deliver(self, event: Event) -> None:
        """``engine.handle(event)``, delivered again after a transient failure."""
        assert self.engine is not None
        retry = 0
        while True:
            try:
                await self.engine.handle(event)
                return
            except Exception as exc:
                retry += 1
                delay = self.redelivery.delay(retry, random.random()) if transient(exc) else None
                if delay is None:
                    await self._give_up(event, exc, retry)
                    raise
                self.retried.append((event.id, retry, delay, exc))
                log.warning(
                    "delivering %s %s of run %s failed (%s: %s); retry %d in %.2f s",
                    event.type,
                    event.id,
                    event.stream,
                    type(exc).__name__,
                    exc,
                    retry,
                    delay,
                )
                await self._sleep(delay)

    async def _give_up(self, event: Event, exc: BaseException, attempts: int) -> None:
        assert self.engine is not None
        try:
            await self.engine.fail(event.stream, exc, event=event, attempts=attempts)
        except Exception:  # the store is down too: the run is resumed from its log later
            log.exception("could not record why run %s failed", event.stream)

    @staticmethod
    def steps_here(event: Event) -> bool:
        """Every step of a run runs here, under :meth:`serial` (:class:`StepsInline`)."""
        return True

    def serial(self, key: str, *, contended: bool = False, synced: bool = False) -> asyncio.Lock:
        """The lock that serialises the algorithm steps of run ``key`` in this process."""
        lock = self._locks.get(key)
        if lock is None:
            lock = asyncio.Lock()
            self._locks[key] = lock
        return lock

    def spawn(self, coro: Work) -> None:
        """Run ``coro`` as a tracked task (timers use this: ``drain`` waits for it)."""
        if self.closed:
            coro.close()
            return
        self._spawn(coro)

    def _spawn(self, coro: Work) -> None:
        # A delivery of its own: it takes its own turn, queued by the stamp of the
        # work that caused it (see aaa_django.runtime.turns).
        task = asyncio.get_running_loop().create_task(coro, context=for_delivery())
        self._running.add(task)
        task.add_done_callback(self._done)

    def _done(self, task: asyncio.Task) -> None:
        self._running.discard(task)
        self.delivered += 1
        if task.cancelled():
            return
        exc = task.exception()
        if exc is not None:
            self.errors.append(exc)
            log.error("delivering an event failed for good", exc_info=exc)

    @property
    def pending(self) -> int:
        """Deliveries scheduled or running."""
        return len(self._running)

    async def drain(self, timeout: float | None = None) -> None:
        """Wait until no delivery is pending (new ones included): the bus is idle."""

        async def loop() -> None:
            while self._running:
                await asyncio.wait(set(self._running))

        await asyncio.wait_for(loop(), timeout)

    idle = drain

    async def close(self, *, cancel: bool = True) -> None:
        """Stop delivering; cancel (or await) what is in flight."""
        self.closed = True
        tasks = set(self._running)
        if cancel:
            for t in tasks:
                t.cancel()
        if tasks:
            await asyncio.gather(*tasks, return_exceptions=True)
