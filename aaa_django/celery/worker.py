"""The worker side of the Celery bus: one long-lived loop and engine per worker
process, and the delivery of one event.

Each worker process runs one event loop in a thread of its own, for its whole life,
whatever Celery pool it runs under (:class:`WorkerRuntime`); every delivery runs
there, and the task's thread only hands it over. A model or tool call is handed off:
the task returns (its message is acknowledged) once the run's step is done and the
call has started, and the call goes on waiting on the loop, hundreds at once. What
the worker appends for a queue it takes is delivered on the same loop, without a
message (:meth:`WorkerRuntime.take`). On PostgreSQL (psycopg 3) the loop awaits the
store (:class:`~aaa_django.store.postgres.PgEventStore`: its own async connections,
group commit); elsewhere the store's statements run on a few threads of the process
(:class:`~aaa_django.store.offload.OnThreads`). Either way the loop goes on while a
commit waits.

A delivery (:func:`~aaa_django.celery.delivering.deliver_event`) is the engine's own
:meth:`Engine.handle <aaa_django.runtime.Engine.handle>` of the stored event the
message names, with the worker's hooks (:mod:`aaa_django.celery.delivering`); the
engine it delivers with is built once per store (:mod:`aaa_django.celery.engines`). A
delivery that fails is tried again or given up on (:mod:`aaa_django.celery.failures`).
See :mod:`aaa_django.celery.bus` for the bus itself.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import contextvars
import functools
import logging
import os
import random
import threading
from collections.abc import Callable, Coroutine, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from celery import Celery
from celery.signals import worker_process_shutdown, worker_shutdown, worker_shutting_down
from django.db import connections

import aaa_django.algos  # noqa: F401  (registers the built-in algorithms)
from aaa_django.conf import aaa_settings
from aaa_django.events import Event
from aaa_django.runtime import Engine
from aaa_django.runtime.retry import transient
from aaa_django.runtime.turns import for_delivery
from aaa_django.site.holding import RunKeeper

from .bus import queue_for
from .delivering import HANDED_OFF, TIMED, deliver_event
from .engines import DB_THREADS, build_worker_engine, cluster_bus, share_pools, shared_pool
from .failures import REDELIVERY, fault_of, give_up
from .onloop import call_on, run_on
from .slow import Leases

#: (re-exported: their home is :mod:`~aaa_django.celery.delivering` and :mod:`~aaa_django.celery.engines`)
__all__ = [
    "DB_THREADS",
    "HANDED_OFF",
    "TIMED",
    "Drain",
    "WorkerRuntime",
    "build_worker_engine",
    "cluster_bus",
    "deliver_event",
    "runtime",
    "runtimes",
    "share_pools",
    "shared_pool",
]

log = logging.getLogger("aaa_django.bus")

T = TypeVar("T")


@dataclass(frozen=True)
class Drain:
    """What a worker's shutdown did with the deliveries on its loop
    (:meth:`WorkerRuntime.drain`)."""

    #: deliveries in flight when the shutdown began
    in_flight: int
    #: of those, the ones that ended within ``WORKER_DRAIN_SECONDS``
    finished: int
    #: deliveries still in flight after it (their calls die with the process)
    left: int
    #: busy leases released for those (their runs are re-driven by the sweeper)
    released: int

    def __str__(self) -> str:
        return (
            f"worker shutdown: {self.in_flight} deliveries in flight, {self.finished} finished, "
            f"{self.left} left, {self.released} busy leases released"
        )


class WorkerRuntime:
    """The worker process's event loop, in a thread of its own for the life of the
    process, and its engines (one per store).

    Every delivery of the process runs on this loop, whatever Celery pool calls it
    (prefork: the child's task thread; threads: any of them; solo): the task's thread
    only hands the delivery over and waits until it may acknowledge the message
    (:meth:`deliver`). A model or tool call goes on waiting on the loop after its
    task has returned, hundreds at once. The engine's caches, the Redis clients and
    the database connection (the loop thread's own: Celery's Django fixup closes only
    the task thread's around every task) are reused from one delivery to the next.

    ``max_in_flight``: deliveries the loop carries at once (``AAA["WORKER_IN_FLIGHT"]``);
    when they are all taken, the next task waits for one to end, holding its pool slot
    (the broker keeps the rest of the queue for other workers).

    A warm shutdown drains the loop (:meth:`drain`, on Celery's shutdown signals): the
    calls it holds are not Celery tasks, so Celery would not wait for them.
    """

    def __init__(self, *, max_in_flight: int | None = None) -> None:
        self.pid = os.getpid()
        self.loop = asyncio.new_event_loop()
        self.engines: dict[tuple, Engine] = {}
        self._engines_lock = threading.Lock()
        self.max_in_flight = int(max_in_flight or aaa_settings()["WORKER_IN_FLIGHT"])
        #: the deliveries on the loop now (their asyncio tasks; the loop's thread only)
        self.in_flight: set[asyncio.Task] = set()
        #: tasks waiting for room (futures, oldest first)
        self._waiting: list[asyncio.Future] = []
        #: deliveries whose task returned while they went on (a call handed off)
        self.handed_off = 0
        #: queues this worker takes: an event bound for one of them that this process
        #: appended is delivered here, on the loop, without a message (:meth:`take`)
        self.local_queues: frozenset[str] = frozenset()
        #: deliveries taken that way
        self.taken = 0
        #: the busy leases the deliveries hold
        self.leases = Leases()
        #: set once the worker shuts down: take() declines (the broker keeps the events)
        self.draining = False
        #: what the shutdown did (:meth:`drain`), once done
        self.drained: Drain | None = None
        self._drain_lock = threading.Lock()
        #: deliveries tried again on the loop (see :meth:`_carry`)
        self.retried = 0
        #: this process's leases on the runs it drives, one keeper per database alias
        #: (:mod:`aaa_django.site.holding`)
        self.keepers: dict[str, RunKeeper] = {}
        #: the threads that make the store's sync calls (see :func:`build_worker_engine`)
        self.db = concurrent.futures.ThreadPoolExecutor(DB_THREADS, thread_name_prefix="aaa-worker-db")
        self.thread = threading.Thread(target=self._serve, name="aaa-worker-loop", daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.run_forever()

    def run(self, coro: Coroutine[Any, Any, T]) -> T:
        """Run ``coro`` on the loop; return its result. An interruption of the waiting
        thread (a soft time limit, a signal) cancels it on the loop
        (:func:`~aaa_django.celery.onloop.run_on`)."""
        return run_on(self.loop, coro)

    def call(self, fn: Callable[..., T], *args: object) -> T:
        """Run the sync ``fn(*args)`` on the loop's thread (a profiler, a probe); the loop
        runs meanwhile, so Django's ORM refuses to run there (a store's sync calls run
        on :attr:`db`)."""
        return call_on(self.loop, fn, *args)

    def deliver(
        self,
        engine: Engine,
        stream: str,
        seq: int,
        event_id: str,
        *,
        redelivered: bool = False,
        wire: str | None = None,
        retries: int = 0,
    ) -> str:
        """Deliver one event on the loop (:func:`deliver_event`) and return as soon as
        its message may be acknowledged: ``"handed off"`` once the run's step is done
        and a model or tool call it carries is under way on the loop (see
        :data:`HANDED_OFF`; even if the call has ended meanwhile), else when the
        delivery ends (its result, or its error raised here: the task retries). A
        handed-off delivery that fails is retried or given up on here (:meth:`_carry`);
        ``retries``: how many times the task was retried already. Waits while the loop
        carries ``max_in_flight`` deliveries."""
        return self.run(self._begin(engine, stream, seq, event_id, redelivered, wire, retries))

    async def _begin(
        self, engine: Engine, stream: str, seq: int, event_id: str, redelivered: bool, wire: str | None, retries: int
    ) -> str:
        while len(self.in_flight) >= self.max_in_flight:
            room = self.loop.create_future()
            self._waiting.append(room)
            try:
                await room
            finally:
                if room in self._waiting:
                    self._waiting.remove(room)
        handed = self.loop.create_future()
        task = self._track(
            self._carry(
                engine, stream, seq, event_id, redelivered=redelivered, wire=wire, handed=handed, retries=retries
            )
        )
        try:
            await asyncio.wait({task, handed}, return_when=asyncio.FIRST_COMPLETED)
        except asyncio.CancelledError:
            if not handed.done():  # the task's thread gave up on it: stop the delivery too
                task.cancel()
            raise
        if not handed.done():
            return task.result()  # not a call: the delivery's result, or its error (the task retries)
        # The loop has it from here, whatever became of it already: a failure after
        # the hand-off is the loop's to retry or give up on (_carry), not the task's.
        self.handed_off += 1
        return "handed off"

    def take(self, engine: Engine, event: Event, *, made_here: bool = False) -> bool:
        """On the loop, from ``engine``'s bus: deliver ``event``, which this process has
        just appended, here (as a delivery of its own on the loop) rather than through
        the broker, when this worker takes the event's queue and the loop has room.
        The run's log is in this process's tail: the step reads nothing. If the
        process dies meanwhile, the sweeper re-drives the run, as for any delivery
        that no live process holds (a call past ``SLOW_DELIVERY`` holds the run's
        busy lease). ``made_here``: a model request whose first attempt this process
        recorded with it (and holds the lease of): taken with or without room, its
        call is this process's to make. False: send it."""
        if event.seq is None or not self.takes(engine, event, room=not made_here):
            return False
        # A context of its own: not the publishing delivery's (its tail state, its
        # record of what it published); its turn queues with the stamp of the work
        # that caused it (aaa_django.runtime.turns).
        self._track(
            self._carry(engine, event.stream, event.seq, event.id, event=event),
            context=for_delivery(contextvars.Context()),
        )
        self.taken += 1
        return True

    def takes(self, engine: Engine, event: Event, *, room: bool = True) -> bool:
        """Would :meth:`take` deliver ``event`` here, were it appended now: this worker
        takes its queue, the loop has room (unless ``room`` is False: not asked), and
        the process is not shutting down nor fenced off the run."""
        bus = cluster_bus(engine)
        # (a run adopted by another process while this one stood down: its event goes
        # to whoever drives it now)
        return not (
            self.draining
            or (room and (len(self.in_flight) >= self.max_in_flight or self._waiting))
            or queue_for(event.type, bus.queues) not in self.local_queues
            or (bus.holder is not None and event.stream in bus.holder.fenced)
        )

    def steps_here(self, engine: Engine, event: Event) -> bool:
        """May the run's step on ``event`` (a handler's result this process is about to
        append) be taken here, before its append (``Engine.answer``)? When this worker
        takes the event's queue and is not shutting down: the step is one this worker
        would take on delivery (its algorithms are registered here), and the result's
        delivery, taken here (:meth:`take`), skips it; one sent instead (no room on
        the loop) is stepped on again where it lands, which writes nothing new."""
        return not self.draining and queue_for(event.type, cluster_bus(engine).queues) in self.local_queues

    async def _carry(
        self,
        engine: Engine,
        stream: str,
        seq: int,
        event_id: str,
        *,
        redelivered: bool = False,
        wire: str | None = None,
        handed: asyncio.Future | None = None,
        event: Event | None = None,
        retries: int = 0,
    ) -> str:
        """:func:`deliver_event`, delivered again here after a transient failure once no
        message stands for it (handed off, or taken without one): as the ``aaa.deliver``
        task does before hand-off, after the :data:`REDELIVERY` policy's delays; one
        that fails for good, or outlasts the retries, ends its run ``failed`` naming
        the cause (:func:`give_up`). Before hand-off the error is the task's."""
        while True:
            try:
                return await deliver_event(
                    engine,
                    stream,
                    seq,
                    event_id,
                    redelivered=redelivered,
                    wire=wire,
                    handed=handed,
                    event=event,
                    leases=self.leases,
                )
            except Exception as exc:
                if handed is not None and not handed.done():
                    raise  # its task is still waiting: Celery retries it
                retries += 1
                fault = fault_of(exc)
                delay = REDELIVERY.delay(retries, random.random()) if transient(fault) else None
                if delay is None:
                    if await give_up(engine, stream, seq, event_id, fault, retries):
                        log.error(
                            "run %s failed: delivering seq %s (%s) failed for good: %s: %s",
                            stream,
                            seq,
                            event_id,
                            type(fault).__name__,
                            fault,
                        )
                    raise fault from exc
                log.warning(
                    "delivering %s seq %s (%s) on the worker's loop failed: %s: %s; retry %d of %d in %.2f s",
                    stream,
                    seq,
                    event_id,
                    type(fault).__name__,
                    fault,
                    retries,
                    REDELIVERY.retries,
                    delay,
                )
                self.retried += 1
                await asyncio.sleep(delay)
                # Again as a redelivery: read the run afresh, re-enqueue what the failed
                # one may have appended and not sent.
                redelivered, wire, handed, event = True, None, None, None

    def _track(self, coro: Coroutine[Any, Any, str], context: contextvars.Context | None = None) -> asyncio.Task[str]:
        task = self.loop.create_task(coro, context=context)
        self.in_flight.add(task)
        task.add_done_callback(self._ended)
        return task

    def _ended(self, task: asyncio.Task) -> None:
        self.in_flight.discard(task)
        for room in self._waiting:
            if not room.done():
                room.set_result(None)
                break
        if not task.cancelled() and task.exception() is not None:
            # (raised by deliver() too when the task still waited; logged for a handed-off one)
            log.warning("a delivery failed on the worker's loop: %r", task.exception())

    async def idle(self) -> None:
        """Wait until no delivery is in flight on the loop (run it on the loop)."""
        while self.in_flight:
            await asyncio.wait(set(self.in_flight))

    def stop_taking(self) -> None:
        """Deliver nothing more here without a message (:meth:`take`): from now on what
        this process appends goes through the broker, where it waits for a live worker.
        Safe in a signal handler."""
        self.draining = True

    def drain(self, seconds: float | None = None) -> Drain:
        """The worker's shutdown: stop taking deliveries (:meth:`stop_taking`), wait up
        to ``seconds`` (``AAA["WORKER_DRAIN_SECONDS"]``) for the deliveries in flight
        to end, then release the busy leases of those still in flight: their runs are
        re-driven by the sweeper as soon as they stall (``STALL_AFTER``), not once the
        leases expire (``LEASE_TTL``), and nothing is lost (every request is in the log;
        a result appended twice is absorbed). Logged, and kept in :attr:`drained`; a
        second call returns the first one's record."""
        with self._drain_lock:
            if self.drained is None:
                if seconds is None:
                    seconds = float(aaa_settings()["WORKER_DRAIN_SECONDS"])
                self.stop_taking()
                if self.thread.is_alive():
                    self.drained = self.run(self._drain(seconds))
                else:
                    self.drained = Drain(0, 0, 0, 0)
                if self.drained.in_flight:
                    log.warning("%s", self.drained)
            return self.drained

    async def _drain(self, seconds: float) -> Drain:
        started = set(self.in_flight)
        if started:
            log.warning("worker shutdown: waiting up to %g s for %d deliveries in flight", seconds, len(started))
            await asyncio.wait(started, timeout=seconds)
        left = len(self.in_flight)
        released = await self.leases.give_up()
        for keeper in self.keepers.values():
            # the runs still in hand: adopted at once by the next duty pass elsewhere
            await keeper.stop(release=True)
        return Drain(in_flight=len(started), finished=sum(t.done() for t in started), left=left, released=released)

    def close(self) -> None:
        """Close the database connections of the store's threads, and stop the loop (a
        process that ends need not; tests do); the keepers of its leases stop renewing
        them (they lapse) and close their connections."""
        if self.thread.is_alive():
            for keeper in self.keepers.values():
                self.run(keeper.stop())
            self.loop.call_soon_threadsafe(self.loop.stop)
            self.thread.join(10)
        self.loop.close()
        # one close_all on every thread of the pool: each waits for the others
        everyone = threading.Barrier(DB_THREADS, timeout=10)

        def close_all() -> None:
            with contextlib.suppress(threading.BrokenBarrierError):
                everyone.wait()
            connections.close_all()

        for done in [self.db.submit(close_all) for _ in range(DB_THREADS)]:
            done.result()
        self.db.shutdown()
        for keeper in self.keepers.values():
            keeper.close()

    def engine(self, spec: Sequence[str], app: Celery | None = None) -> Engine:
        """The engine for the store ``spec`` names (built on first use); ``app``: the
        Celery app that sends its deliveries (the delivering task's)."""
        key = tuple(spec)
        engine = self.engines.get(key)
        if engine is None:
            with self._engines_lock:
                engine = self.engines.get(key)
                if engine is None:
                    engine = build_worker_engine(spec, app=app, db=self.db)
                    if spec[0] == "django":
                        self._keep(engine, spec[1])
                    if app is not None:
                        # the queues this worker consumes (-Q): set before the pool starts
                        self.local_queues = frozenset(app.amqp.queues.consume_from or ())
                        cluster_bus(engine).local = self.take
                        cluster_bus(engine).local_steps = functools.partial(self.steps_here, engine)
                        cluster_bus(engine).local_takes = functools.partial(self.takes, engine)
                    self.engines[key] = engine
        return engine

    def _keep(self, engine: Engine, using: str) -> None:
        """Give ``engine`` this process's keeper of its leases on database ``using``
        (made on first use) and start its heartbeat on the loop: runs held across a
        stand-down are delivered again (``Engine.resume``)."""
        keeper = self.keepers.get(using)
        if keeper is None:
            keeper = self.keepers[using] = RunKeeper(using, name="worker")

            async def regained(runs: set[str]) -> None:
                # (a fenced run's deliveries go to the broker, to whoever takes them:
                # ``take`` sends rather than delivers them here)
                await engine.resume(sorted(runs))

            self.loop.call_soon_threadsafe(keeper.start, regained)
        cluster_bus(engine).holder = keeper

    def keeper(self, using: str = "default") -> RunKeeper | None:
        """This process's keeper of its leases on database ``using``, once an engine
        on it is built."""
        return self.keepers.get(using)


#: the process's runtime (a forked child makes its own)
_runtime: WorkerRuntime | None = None
_runtime_lock = threading.Lock()


def runtime() -> WorkerRuntime:
    """This process's :class:`WorkerRuntime` (made on first use, anew in a forked child)."""
    global _runtime
    rt = _runtime
    if rt is None or rt.pid != os.getpid():
        with _runtime_lock:
            rt = _runtime
            if rt is None or rt.pid != os.getpid():
                rt = _runtime = WorkerRuntime()
    return rt


def runtimes() -> list[WorkerRuntime]:
    """This process's runtime, if it has one (a list: none or one)."""
    rt = _runtime
    return [rt] if rt is not None and rt.pid == os.getpid() else []


@worker_shutting_down.connect
def _stop_taking(**_: object) -> None:
    # In the main process, from its signal handler (the runtime of a solo or threads
    # pool; a prefork child hears of the shutdown when its pool closes).
    for rt in runtimes():
        rt.stop_taking()


@worker_process_shutdown.connect  # a prefork child, as it exits
@worker_shutdown.connect  # the main process, once its pool has stopped (solo, threads)
def _drain(**_: object) -> None:
    for rt in runtimes():
        rt.drain()
