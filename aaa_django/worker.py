"""The worker side of the Celery bus: one long-lived loop and engine per worker
process (thread), and the delivery of one event.

The task's own thread runs the loop for the length of a delivery (or, under a soft
time limit, the loop runs in a thread of its own: see :class:`WorkerRuntime`), and the
engine's store makes its queries on the loop's thread (``DjangoEventStore(inline=True)``),
on a connection that lives as long as the process (Celery's Django fixup closes the
task thread's own connections around every task): no thread hop per query.

A delivery is the engine's step (``engine.handle``) split as the bus protocol allows:
the run's step (see :meth:`DistributedBus.serial`): bring this worker's view of the
run up to date (from the message when it carries the event that follows the view,
else one read), then the engine's reaction and the algorithm's step
(``engine.react``), whose appends are guarded by the head of that view and which runs
again when the log moved on; after it, the handlers (``engine.dispatch``). Around it: a
busy lease when it runs long (the sweeper leaves the run alone), cancelling tool work
when the run ends in another worker, re-enqueueing what an interrupted earlier
delivery of the same event may have left unenqueued, and the run's deadline or an
approval's expiry as a Celery task with an ETA. See :mod:`aaa_django.bus` for the bus
itself.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import threading
import time
import weakref
from typing import Any, Iterator, Sequence

from .bus import DELIVER, DistributedBus, _published, celery_app, coordinator, open_store, queue_for
from .events import ConcurrencyError, Event
from .runtime import types as T

log = logging.getLogger("aaa_django.bus")

#: deliveries that may run a tool: they listen for their run's end
TOOL_WORK = frozenset({T.TOOL_REQUESTED, *T.APPROVAL_DECISIONS})
#: a delivery still running after this many seconds takes a busy lease (and, for tool
#: work, starts listening for its run's end); quicker ones never touch Redis for it
SLOW_DELIVERY = 0.05


class WorkerRuntime:
    """One event loop and one engine per store, per worker thread (prefork: process).

    The loop lives as long as the process, so the engine's caches, the Redis clients
    and the database connection are reused from one task to the next. Two ways to run
    it:

    - ``threaded=False`` (a delivery without a soft time limit, the default task):
      the task's own thread runs the loop for the length of the delivery, on database
      connections the runtime owns. They stand in for the thread's own connections
      only while the loop runs, so Celery's Django fixup, which closes the thread's
      connections around every task, never sees (nor closes) them.
    - ``threaded=True``: the loop runs in a thread of its own and the task's thread
      waits for it; a soft time limit (Celery raises it in the task's thread) then
      interrupts the wait, and the delivery is cancelled on its loop, never cut off
      halfway through the loop's own code. The loop thread owns its connections.
    """

    def __init__(self, *, threaded: bool = True) -> None:
        self.pid = os.getpid()
        self.loop = asyncio.new_event_loop()
        self.engines: dict[tuple, Any] = {}
        #: alias -> the connection an inline runtime's loop uses
        self._own: dict[str, Any] = {}
        self.thread: threading.Thread | None = None
        if threaded:
            self.thread = threading.Thread(target=self._serve, name="aaa-worker-loop", daemon=True)
            self.thread.start()

    def _serve(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.run_forever()

    def run(self, coro: Any) -> Any:
        """Run ``coro`` on the loop; return its result."""
        if self.thread is None:
            with self._connections():
                task = self.loop.create_task(coro)
                try:
                    return self.loop.run_until_complete(task)
                except BaseException:
                    if not task.done():  # interrupted from outside the loop: stop the delivery too
                        task.cancel()
                        with contextlib.suppress(BaseException):
                            self.loop.run_until_complete(task)
                    raise
        future = asyncio.run_coroutine_threadsafe(coro, self.loop)
        try:
            return future.result()
        except BaseException:
            future.cancel()  # the task's thread was interrupted (a time limit): stop too
            raise

    def call(self, fn: Any, *args: Any) -> Any:
        """Run the sync ``fn`` where the loop runs (e.g. on its DB connection)."""
        if self.thread is None:
            with self._connections():
                return fn(*args)
        from .store import _outside_loop

        return self.run(_outside_loop(fn)(*args))

    @contextlib.contextmanager
    def _connections(self) -> Iterator[None]:
        """Within: this thread's ``connections[alias]`` are the runtime's own."""
        from django.db import connections

        local = connections._connections
        saved: dict[str, Any] = {}
        for alias in connections:
            own = self._own.get(alias)
            if own is None:
                own = self._own[alias] = connections.create_connection(alias)
            saved[alias] = getattr(local, alias, None)
            setattr(local, alias, own)
        try:
            yield
        finally:
            for alias, previous in saved.items():
                if previous is None:
                    with contextlib.suppress(AttributeError):
                        delattr(local, alias)
                else:
                    setattr(local, alias, previous)

    def close(self) -> None:
        """Close the loop's database connections and stop the loop (a process that
        ends need not: the loop thread is a daemon; tests do)."""
        from django.db import connections

        if self.thread is None:
            for own in self._own.values():
                with contextlib.suppress(Exception):
                    own.close()
            self._own.clear()
        elif self.thread.is_alive():
            self.call(connections.close_all)
            self.loop.call_soon_threadsafe(self.loop.stop)
            self.thread.join(10)
        self.loop.close()

    def engine(self, spec: Sequence[Any]) -> Any:
        key = tuple(spec)
        engine = self.engines.get(key)
        if engine is None:
            engine = self.engines[key] = build_worker_engine(spec)
        return engine


#: this thread's runtimes, by kind (a thread that ends drops its own)
_local = threading.local()
#: every runtime of the process, seen weakly (see :func:`runtimes`)
_all: "weakref.WeakSet[WorkerRuntime]" = weakref.WeakSet()


def runtime(*, threaded: bool = True) -> WorkerRuntime:
    """This thread's :class:`WorkerRuntime` of that kind (new ones in a forked child)."""
    mine = getattr(_local, "runtimes", None)
    if mine is None or mine[0] != os.getpid():
        mine = _local.runtimes = (os.getpid(), {})
    rt = mine[1].get(threaded)
    if rt is None:
        rt = mine[1][threaded] = WorkerRuntime(threaded=threaded)
        _all.add(rt)
    return rt


def runtimes() -> list[WorkerRuntime]:
    """This process's runtimes (all threads, both kinds)."""
    pid = os.getpid()
    return [rt for rt in list(_all) if rt.pid == pid]


def needs_thread(task: Any) -> bool:
    """Does a Celery task (``bind=True``'s ``self``) run under a soft time limit? Then
    its deliveries run on a loop thread (see :class:`WorkerRuntime`)."""
    limits = getattr(task.request, "timelimit", None) or (None, None)
    if limits[1]:
        return True  # this message's own limit
    default = _soft_limits.get(task.name)
    if default is None:  # the task's and the app's: fixed for the process
        default = _soft_limits[task.name] = bool(task.soft_time_limit or task.app.conf.task_soft_time_limit)
    return default


#: task name -> whether its soft time limit (the task's or the app's) is set
_soft_limits: dict[str, bool] = {}


def build_worker_engine(spec: Sequence[Any]) -> Any:
    """The engine a worker delivers with: the site's engine on ``spec``'s store, on a
    :class:`DistributedBus`, with the site's handlers (as the web process's
    ``EngineHost`` attaches them: ``AAA["LLM_CLIENT"]``, ``AAA["TOOLS"]``,
    ``AAA["WORKER_SETUP"]``) and their tool pools shared by the whole cluster."""
    from . import algos  # noqa: F401  (registers the built-in algorithms)
    from .engines import attach_site_handlers, build_engine
    from .events.tail import TailCachedStore

    using = spec[1] if spec[0] == "django" else "default"
    engine = build_engine(using=using, store=TailCachedStore(open_store(spec, inline=True)),
                          bus=DistributedBus(in_worker=True))
    attach_site_handlers(engine)
    share_pools(engine)
    return engine


def shared_pool(name: str, size: int) -> Any:
    """A ``ToolHandler`` ``pool_factory`` whose pools hold across the whole cluster:
    ``ToolHandler(registry, pools={"db": 2}, pool_factory=shared_pool)``."""
    return coordinator().pool(name, size)


def share_pools(engine: Any) -> int:
    """Make the pools of every ToolHandler on ``engine`` cluster-wide (workers do this
    to the handlers ``WORKER_SETUP`` attached); returns how many handlers changed."""
    from .tools.handler import ToolHandler

    # ToolHandlers subscribe with bound methods: find them through ``__self__``.
    subscribed = engine.subscribers(T.TOOL_REQUESTED)
    handlers = {id(h.__self__): h.__self__ for h in subscribed
                if isinstance(getattr(h, "__self__", None), ToolHandler)}
    coord = engine.bus._coordinator()
    for handler in handlers.values():
        handler.pool_factory = coord.pool
        getattr(handler, "_semaphores", {}).clear()  # none made yet; a worker starts fresh
    return len(handlers)


async def deliver_event(engine: Any, stream: str, seq: int, event_id: str, *, redelivered: bool = False,
                        wire: str | None = None) -> str:
    """Deliver one stored event to ``engine`` as a worker does; returns what happened
    (``"delivered"``, or ``"missing"`` when the log no longer holds that event).
    ``wire``: the event itself from the message (see :meth:`DistributedBus._args`)."""
    with engine.tail.delivery():
        # A first delivery whose message carries the event that follows this worker's
        # cached view of the run: the view is current without a query. Not after a
        # redelivery: the view may be old, and handlers would redo answered work.
        synced = not redelivered and wire is not None and _accept(engine.tail, stream, seq, event_id, wire)
        return await _deliver(engine, stream, seq, event_id, redelivered, synced)


def _accept(tail: Any, stream: str, seq: int, event_id: str, wire: str) -> bool:
    try:
        prev, data, *rest = json.loads(wire)
        event = Event.from_dict(data)
        # the events before it (a young run's message) matter only to a cache without the run
        new_to_us = rest and tail.cached(stream, 1) is None
        earlier = [Event.from_dict(d) for d in rest[0]] if new_to_us else []
    except (ValueError, TypeError, KeyError, AttributeError, IndexError):
        log.warning("a delivery of %s %s carried an unreadable event; reading it", stream, seq)
        return False
    if (event.id, event.stream, event.seq) != (event_id, stream, seq):
        return False
    return tail.accept(event, prev, earlier)


async def _deliver(engine: Any, stream: str, seq: int, event_id: str, redelivered: bool, synced: bool) -> str:
    bus: DistributedBus = engine.bus
    published: set[str] = set()
    token = _published.set(published)
    loop = asyncio.get_running_loop()
    loaded: asyncio.Future = loop.create_future()
    finished: asyncio.Future = loop.create_future()
    guard: list[asyncio.Future] = []
    try:
        # Most deliveries end well before SLOW_DELIVERY: a timer starts the guard of
        # the others, no task and no wait for the quick ones.
        timer = loop.call_later(SLOW_DELIVERY, lambda: guard.append(
            asyncio.ensure_future(_guard_slow(engine, stream, loaded, finished))))
        try:
            event = await _step(engine, stream, seq, event_id, loaded, synced)
        finally:
            timer.cancel()
            if not finished.done():
                finished.set_result(None)
            for g in guard:
                await g
        if event is None:
            return "missing"  # erased (or erased and written again): nothing to do
        if bus.pending:  # a timer that came due during the step (an approval's expiry)
            await bus.drain(30)
        if redelivered:
            await _republish_caused(engine, event, published)
    finally:
        _published.reset(token)
    await _schedule_timers(engine, event)
    return "delivered"


async def _step(engine: Any, stream: str, seq: int, event_id: str, loaded: asyncio.Future,
                synced: bool = False) -> Event | None:
    """``engine.handle`` for the event at ``seq``: the event, from the tail (the message
    carried it: ``synced``) or one read that brings this worker's view of the run up
    to date, which the step needs anyway; then the run's step (:meth:`Engine.step`:
    guarded by that view, tried again when the log moved on) and the handlers."""
    try:
        if not synced:
            engine.tail.stale(stream)
        found = await engine.store.read(stream, after=seq - 1, limit=1)
        event = found[0] if found and found[0].id == event_id else None
        loaded.set_result(event)
        if event is None:
            return None
        event = await engine.hydrate(event)
    finally:
        if not loaded.done():
            loaded.set_result(None)
    with engine.observing(event):  # log lines carry the event; observers watch it
        await engine.step(event, synced=True)
        await engine.dispatch(event)
    return event


async def _guard_slow(engine: Any, stream: str, loaded: asyncio.Future, work: asyncio.Future) -> None:
    """A long delivery: hold a busy lease (the sweeper leaves the run alone) and, for
    tool work, cancel it when the run ends in another worker. ``loaded``: the event
    once read; ``work``: done when the delivery is."""
    coord = engine.bus._coordinator()
    watcher = None
    try:
        async with coord.busy(stream):
            await asyncio.wait({loaded, work}, return_when=asyncio.FIRST_COMPLETED)
            event = loaded.result() if loaded.done() else None
            if event is not None and event.type in TOOL_WORK and not work.done():
                watcher = asyncio.ensure_future(_cancel_on_end(engine, stream))
            await asyncio.wait({work})
    finally:
        if watcher is not None:
            watcher.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await watcher


async def _cancel_on_end(engine: Any, run_id: str) -> None:
    stale = engine.tail.stale

    async def ended() -> bool:
        stale(run_id)  # this delivery's cached view of the run would not see the end
        return (await engine.meta(run_id)).completed

    await engine.bus._coordinator().wait_ended(run_id, ended)
    stale(run_id)
    meta = await engine.meta(run_id)
    if not meta.completed:
        return
    found = await engine.store.read(run_id, after=(meta.completion_seq or 1) - 1, limit=1)
    if found and found[0].type == T.RUN_COMPLETED:
        # The handlers' reaction to the end (ToolHandler cancels this run's calls).
        await engine.dispatch(await engine.hydrate(found[0]))


async def _republish_caused(engine: Any, event: Event, published: set[str]) -> None:
    """After a redelivery: events this one caused that are stored but were appended by
    the earlier, interrupted delivery may never have been enqueued (it died between
    commit and enqueue). Publish them again; delivering twice is harmless."""
    caused = [e for e in await engine.read_after(event) if e.causation == event.id and e.id not in published]
    if caused:
        await engine.bus.publish(caused)


async def _schedule_timers(engine: Any, event: Event) -> None:
    """A deadline or an approval expiry in the future: deliver the event again then."""
    at = None
    if event.type == T.RUN_STARTED:
        meta = await engine.meta(event.stream)
        if not meta.completed:
            at = meta.deadline
    elif event.type == T.APPROVAL_REQUESTED:
        meta = await engine.meta(event.stream)
        pending = meta.approvals.get(event.id)
        if pending is not None and not meta.completed:
            at = pending.expires_at
    if at is None:
        return
    args = [engine.bus.spec, event.stream, event.seq, event.id]
    eta = max(at, time.time()) + 0.05  # the engine decides "due" by its own clock: not early
    headers = engine.bus.trace.headers(event) if engine.bus.trace is not None else None
    await asyncio.to_thread(
        celery_app().send_task, DELIVER, args, eta=_utc(eta), queue=queue_for(event.type, engine.bus.queues),
        headers=headers,
    )


def _utc(ts: float):
    from datetime import datetime, timezone

    return datetime.fromtimestamp(ts, tz=timezone.utc)


def transient_errors() -> tuple[type[BaseException], ...]:
    """Errors after which a delivery is retried: the database, Redis or the broker
    went away for a moment."""
    from django.db import InterfaceError, OperationalError

    errors: list[type[BaseException]] = [InterfaceError, OperationalError, ConcurrencyError]
    with contextlib.suppress(ImportError):
        import kombu.exceptions
        import redis

        errors += [redis.ConnectionError, redis.TimeoutError, kombu.exceptions.OperationalError]
    return tuple(errors)
