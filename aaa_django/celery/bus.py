"""The distributed bus: every appended event is delivered by a Celery task.

``DistributedBus`` implements the engine's bus interface (``bind``, ``publish``,
``serial``, ``spawn``, ``drain``, ``close``) over Celery:

- **publish** enqueues one message per event *after the transaction that appended it
  commits* (``transaction.on_commit`` on the store's database alias), so a worker
  never looks for an event that is not there, and a rolled-back event is never
  delivered. A message carries the store, the stream, the seq and the id (and, see
  below, sometimes the event itself).
- **queues**: three kinds of work: model requests (``llm``), tool requests and
  approval decisions (``tools``), everything else (``algorithms``: the engine's and
  the algorithms' reactions, validation). All go to the Celery app's default queue,
  so ``celery -A proj worker`` takes them, unless ``AAA["CELERY_QUEUES"]`` names a
  queue for a kind (then a site sizes each with its own workers: ``-Q``).
- **delivery** (the ``aaa.deliver`` task, ``acks_late`` and requeued when its worker
  dies) loads the event from the store and calls ``engine.handle(event)``: the same
  step function the in-process bus calls. A message may also carry the event itself
  (when it is small, with the id of the event before it): a worker whose cache holds
  the run's log up to that event then needs no query to catch up. Each worker
  process keeps one event loop (in a thread of its own) and one engine per store
  (built by ``build_engine`` and the site's ``WORKER_SETUP``): a model or tool call
  waits there after its task has returned, and what a worker appends for a queue it
  takes is delivered on that loop without a message (see :mod:`aaa_django.celery.worker`).
- **serial**: a run's algorithm step is an optimistic transaction on the run's stream:
  it reads the log, decides, and appends only if the stream's head is still the one
  it read (the engine's tail guards the appends, see :mod:`aaa_django.events.tail`);
  when another step or a handler appended meanwhile, the step runs again on the new
  log, and from its second try on under the run's Redis lock (see
  :mod:`aaa_django.celery.coordination`), so a contended run still makes progress. Two
  workers never both decide from the same log; derived events have deterministic
  ids, so a step that runs twice writes once.
- **limits across workers**: a run's deadline and an approval's expiry are kept in
  the run index (``due_at``) and fired by the workers' periodic duty
  (:mod:`aaa_django.celery.duty`): no message waits for them; tool pools become
  cluster-wide leases; a tool call running in one worker is cancelled when its run
  ends in another (a Redis notice, with polling as the fallback).

The worker side (the per-process loop and engine, one delivery) is
:mod:`aaa_django.celery.worker`; the sweeper (:mod:`aaa_django.celery.sweeper`, task ``aaa.sweep``)
re-drives runs that nothing is working on any more; the duty (:mod:`aaa_django.celery.duty`,
task ``aaa.tick``) fires due times and sweeps on a schedule, in every worker.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import json
import logging
import threading
import weakref
from collections.abc import AsyncIterator, Callable, Iterable, Iterator, Sequence
from functools import partial
from typing import Any

from asgiref.sync import sync_to_async
from celery import Celery
from celery.app import app_or_default
from celery.signals import task_postrun, task_prerun
from django.db import transaction
from django.utils.module_loading import import_string

from aaa_django.conf import aaa_settings, redis_url
from aaa_django.events import Event, EventList, EventStore
from aaa_django.events.tail import TailCachedStore
from aaa_django.runtime import logcontext
from aaa_django.runtime.appends import not_delivered_here
from aaa_django.runtime.bus import Work
from aaa_django.runtime.engine_api import EngineAPI
from aaa_django.runtime.event_types import (
    APPROVAL_DENIED,
    APPROVAL_EXPIRED,
    APPROVAL_GRANTED,
    LLM_ATTEMPTED,
    LLM_REQUESTED,
    RUN_COMPLETED,
    TOOL_REQUESTED,
)
from aaa_django.runtime.observe import TraceCarrier
from aaa_django.site.holding import RunKeeper
from aaa_django.store import DjangoEventStore
from aaa_django.store.offload import Offload
from aaa_django.store.redis import RedisEventStore

from .coordination import Coordinator
from .publish import FastPublisher

log = logging.getLogger("aaa_django.bus")

#: the task names
DELIVER, SWEEP = "aaa.deliver", "aaa.sweep"
#: an event whose JSON is longer than this travels by id only (the worker reads it)
WIRE_MAX = 16_000
#: a message of an event up to this seq also carries the events before it
PREFIX_MAX = 4

#: event type -> kind of work (a key of ``AAA["CELERY_QUEUES"]``); others: "algorithms"
KIND_OF = {
    LLM_REQUESTED: "llm",
    TOOL_REQUESTED: "tools",
    APPROVAL_GRANTED: "tools",
    APPROVAL_DENIED: "tools",
    APPROVAL_EXPIRED: "tools",
}


def _dumps(value: object) -> str:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))


#: the kinds of work, each a key of ``AAA["CELERY_QUEUES"]``
KINDS = ("algorithms", "llm", "tools")


def _queues() -> dict[str, str]:
    """Kind of work -> queue name: ``AAA["CELERY_QUEUES"]``, and the Celery app's
    default queue (``task_default_queue``) for a kind it does not name, so a worker
    started as usual takes every kind until a site splits them."""
    named: dict[str, str] = aaa_settings()["CELERY_QUEUES"] or {}
    if all(named.get(k) for k in KINDS):
        return {k: named[k] for k in KINDS}
    default = celery_app().conf.task_default_queue
    return {k: named.get(k) or default for k in KINDS}


def queue_for(event_type: str, names: dict[str, str] | None = None) -> str:
    return (names or _queues())[KIND_OF.get(event_type, "algorithms")]


def celery_app() -> Celery:
    """The site's Celery app: the calling thread's current app, which is the site's
    (Celery's Django fixup makes the site's app the default; a site without it calls
    ``app.set_default()``). A worker's engines are given the app of the task that
    delivers (``DistributedBus(app=...)``).

    The app itself (``celery.app.app_or_default()``), not Celery's ``current_app``
    proxy, which resolves the calling thread's current app at every attribute read:
    the bus keeps what this returns and uses it from other threads (the engine
    host's, a worker's db threads), where the current app may be another, and its
    producers must be the one app's."""
    return app_or_default()


_coordinators: dict[tuple, Coordinator] = {}


def coordinator() -> Coordinator:
    """The process's :class:`~aaa_django.celery.coordination.Coordinator` for the settings."""
    conf = aaa_settings()
    url = redis_url()
    if not url:
        raise RuntimeError("the Celery bus needs Redis: set AAA['REDIS_URL'] or a redis:// broker")
    key = (url, conf["RUN_LOCK_TTL"], conf["LEASE_TTL"])
    c = _coordinators.get(key)
    if c is None:
        c = _coordinators[key] = Coordinator(url, lock_ttl=conf["RUN_LOCK_TTL"], lease_ttl=conf["LEASE_TTL"])
    return c


# -- stores by spec: how a message names the log ------------------------------------------


def store_spec(store: EventStore) -> list[str]:
    """A JSON description of ``store`` that a worker can open again: ``["django",
    alias, class]`` (the class too, so a worker keeps e.g. the run index in step as
    the web process does) or ``["redis", url, prefix]``."""
    if isinstance(store, TailCachedStore):
        store = store.inner
    if isinstance(store, DjangoEventStore):
        cls = type(store)
        return ["django", store.using, f"{cls.__module__}.{cls.__qualname__}"]
    if isinstance(store, RedisEventStore):
        kw = store.client.connection_pool.connection_kwargs
        url = (
            f"unix://{kw['path']}?db={kw.get('db', 0)}"
            if kw.get("path")
            else f"redis://{kw.get('host', 'localhost')}:{kw.get('port', 6379)}/{kw.get('db', 0)}"
        )
        return ["redis", url, store.prefix]
    raise TypeError(f"the Celery bus cannot deliver events of {store!r}: use the Django or Redis store")


def open_store(spec: Sequence[str], *, offload: Offload | None = None) -> DjangoEventStore | RedisEventStore:
    """The store a :func:`store_spec` describes (``offload``: where a Django store's
    sync calls run for its async ones, see :mod:`aaa_django.store.offload`)."""
    if spec[0] == "django":
        cls = import_string(spec[2]) if len(spec) > 2 else DjangoEventStore
        if not (isinstance(cls, type) and issubclass(cls, DjangoEventStore)):
            raise ValueError(f"{spec[2]} is not a DjangoEventStore")
        return cls(spec[1], offload=offload)
    if spec[0] == "redis":
        return RedisEventStore(spec[1], prefix=spec[2])
    raise ValueError(f"unknown store spec {spec!r}")


# -- the bus -------------------------------------------------------------------------------

#: ids published by the delivery running in this context (:meth:`DistributedBus.recording`)
_published: contextvars.ContextVar[set[str] | None] = contextvars.ContextVar("aaa_published", default=None)


class DistributedBus:
    """The engine's bus over Celery (``AAA["BUS"] = "celery"``).

    ``queues`` overrides ``AAA["CELERY_QUEUES"]``; ``app``: the Celery app that sends
    (default: the site's, see :func:`celery_app`); ``serialize=False`` drops the lock
    of a contended step (with ``engine.guard_steps = False``, only to show, in a test,
    what they prevent); ``coordinator`` defaults to
    the one the settings describe. ``in_worker=True`` (the workers' own engines) sends
    at once: a worker's appends are never inside a caller's transaction, they have
    committed when ``publish`` is called.
    """

    #: engines on this bus keep no loop timers (``aaa_django.runtime.bus.DurableTimers``):
    #: the run index keeps a run's due times, and the workers' duty fires them
    durable_timers = True

    def __init__(
        self,
        *,
        coordinator: Coordinator | None = None,
        serialize: bool = True,
        queues: dict[str, str] | None = None,
        in_worker: bool = False,
        app: Celery | None = None,
    ) -> None:
        self.coordinator = coordinator
        self.serialize = serialize
        self.in_worker = in_worker
        self.engine: EngineAPI | None = None
        self.spec: list[str] | None = None
        self.queues = {**_queues(), **(queues or {})}
        self._app: Celery | None = app
        #: the publisher of each thread that sends (see :meth:`publisher`): held by the
        #: thread (a thread that ends drops its own, and its connection), seen here weakly
        self._fast = threading.local()
        self._fast_lock = threading.Lock()
        self._publishers: weakref.WeakSet[FastPublisher] = weakref.WeakSet()
        self.closed = False
        #: exceptions that escaped tasks spawned on this bus (timers), newest last
        self.errors: list[BaseException] = []
        #: messages sent (one per event)
        self.sent = 0
        #: ``local(engine, event, made_here=False) -> bool``: a worker's runtime
        #: delivering ``event`` on its own loop instead of sending it (see
        #: ``WorkerRuntime.take``); None: send all
        self.local: Any = None
        #: ``local_steps(event) -> bool``: may a run's step on ``event`` be taken in this
        #: process (a worker's runtime that takes the event's queue, see
        #: ``WorkerRuntime.steps_here``); None: nowhere but on delivery
        self.local_steps: Callable[[Event], bool] | None = None
        #: ``local_takes(event) -> bool``: would ``local`` take ``event``, appended now
        #: (see ``WorkerRuntime.takes``); None: nothing is taken here
        self.local_takes: Callable[[Event], bool] | None = None
        self._spawned: set[asyncio.Task] = set()
        self._listener: asyncio.Task | None = None
        #: what carries a run's trace context in the messages (OpenTelemetry), or None
        self.trace: TraceCarrier | None = None
        #: the worker process's leases on the runs it drives (``WorkerRuntime``), or None:
        #: a process that only starts runs holds none
        self.holder: RunKeeper | None = None

    def holds(self, run_id: str) -> bool:
        """May this process call out for ``run_id`` now
        (:class:`~aaa_django.runtime.holding.HoldsRuns`)? A worker asks its keeper
        (:mod:`aaa_django.site.holding`); a process without one (the web process,
        which only appends and enqueues) holds nothing and asks no one: True."""
        return self.holder is None or self.holder.holds(run_id)

    @contextlib.contextmanager
    def recording(self) -> Iterator[set[str]]:
        """Within: the ids of the events this bus publishes go into the set it yields
        (a worker's delivery: what an interrupted earlier delivery of its event may have
        left unpublished is what it did not publish itself). The set belongs to the
        context (deliveries run concurrently on a worker's loop; the tasks a delivery
        starts record into its set)."""
        published: set[str] = set()
        token = _published.set(published)
        try:
            yield published
        finally:
            _published.reset(token)

    def carry(self, carrier: TraceCarrier) -> None:
        """Carry a run's trace context in every delivery message (``carrier``: a
        :class:`~aaa_django.runtime.observe.TraceCarrier`, the OpenTelemetry observer)."""
        self.trace = carrier

    def bind(self, engine: EngineAPI) -> None:
        """Attach the engine; its store must be one a worker can open (Django, Redis)."""
        self.engine = engine
        self.spec = store_spec(engine.store)

    def coordination(self) -> Coordinator:
        """The cluster's coordinator (locks, leases, notices), made on first use."""
        if self.coordinator is None:
            self.coordinator = coordinator()
        return self.coordinator

    # -- publishing -------------------------------------------------------------------------

    async def publish(self, events: Iterable[Event]) -> None:
        """Enqueue a delivery of each event once its transaction commits (events the
        engine says are committed, an :class:`~aaa_django.events.EventList`'s
        ``committed``: at once)."""
        committed = isinstance(events, EventList) and events.committed
        events = list(events)
        if self.closed or not events:
            return
        assert self.spec is not None, "bind the bus to an engine first"
        seen = _published.get()
        if seen is not None:
            seen.update(e.id for e in events)
        ended = [e.stream for e in events if e.type == RUN_COMPLETED]
        if self.local is not None:  # a worker's loop delivers what it can itself
            # (a model request with its first attempt, recorded here with it: the
            # attempt's lease is this process's, so is the call)
            made_here = {e.causation: e for e in events if e.type == LLM_ATTEMPTED}
            events = [e for e in events if not self.local(self.engine, e, made_here=e.id in made_here)]
            if made_here and self.engine is not None:
                # Sent after all (the worker began shutting down, or was fenced off the
                # run, since ``delivers_here`` said it would take them): the attempts'
                # leases go now, and whoever takes a request finds its maker gone.
                await not_delivered_here(self.engine, [made_here[e.id] for e in events if e.id in made_here])
        carrier = self.trace
        messages = [
            (queue_for(e.type, self.queues), self._args(e, events), carrier.headers(e) if carrier is not None else None)
            for e in events
        ]
        if self.in_worker:
            # A broker round trip inline is cheaper than a thread hop. A failure raises:
            # the delivery is retried, and its retry enqueues what this one could not.
            self._send(messages, ended, swallow=False)
        elif self.spec[0] == "django" and not committed:
            # on_commit must be called in the thread that owns the store's connection
            # (and transaction): the thread-sensitive executor the store runs in. (One
            # thread for the whole process: 200 runs started at once queued on it.)
            await sync_to_async(self._on_commit, thread_sensitive=True)(messages, ended)
        else:
            # Committed already (the site's store commits every append it awaits):
            # sent from any thread of the loop's executor, several at once.
            await asyncio.to_thread(self._send, messages, ended)

    def _args(self, event: Event, batch: list[Event]) -> list[object]:
        """A delivery's arguments: where the event is, and, for an event this process
        has just appended, the event itself with the id of the one before it (when it
        knows that id and the event is small)."""
        args: list[object] = [self.spec, event.stream, event.seq, event.id]
        assert self.engine is not None, "bind the bus to an engine first"
        tail = self.engine.tail
        if not tail.fresh(event.id):
            return args  # not just appended here (a re-drive): the worker reads it
        seq = event.seq or 0

        def known(at: int) -> Event | None:
            found = next((e for e in batch if e.stream == event.stream and e.seq == at), None)
            return found if found is not None else tail.cached(event.stream, at)

        prev: str | None = None
        if seq > 1:
            before = known(seq - 1)
            if before is None:
                return args
            prev = before.id
        wire = [prev, event.to_dict()]
        if 1 < seq <= PREFIX_MAX:
            # A young run: the events before it too, so a worker that never saw the
            # run needs no read to catch up (each worker first sees a run early).
            earlier = [e for e in (known(at) for at in range(1, seq)) if e is not None]
            if len(earlier) == seq - 1:
                text = _dumps([*wire, [e.to_dict() for e in earlier]])
                if len(text) <= WIRE_MAX:
                    args.append(text)
                    return args
        text = _dumps(wire)
        if len(text) <= WIRE_MAX:
            args.append(text)
        return args

    def _on_commit(self, messages: list, ended: list[str]) -> None:
        assert self.spec is not None
        transaction.on_commit(partial(self._send, messages, ended), using=self.spec[1])

    def publisher(self) -> FastPublisher | None:
        """This thread's :class:`~aaa_django.celery.publish.FastPublisher` (one per thread
        that sends: a worker's loop thread; in a web process, the threads that commit
        appends), or None when ``AAA["CELERY_FAST_PUBLISH"]`` is off."""
        fast = getattr(self._fast, "publisher", None)
        if fast is None and aaa_settings()["CELERY_FAST_PUBLISH"]:
            if self._app is None:
                self._app = celery_app()
            fast = self._fast.publisher = FastPublisher(self._app)
            with self._fast_lock:
                self._publishers.add(fast)
        return fast

    def _send(self, messages: list, ended: list[str], *, swallow: bool = True) -> None:
        # messages: (queue, args) or (queue, args, headers: the run's trace context)
        try:
            if self._app is None:
                self._app = celery_app()
            # The repr that monitoring shows (and Celery would compute): where the
            # event is, not the event carried along.
            fast = self.publisher() if messages else None
            done = 0
            if fast is not None:  # in order; the first it leaves, and all after it, go by send_task
                for queue, args, *headers in messages:
                    if not fast.send(DELIVER, args, queue, repr(args[1:4]), *headers):
                        break
                    done += 1
            self.sent += done
            rest = messages[done:]
            if rest:
                with self._app.producer_or_acquire() as producer:  # one for the batch
                    for queue, args, *headers in rest:
                        self._app.send_task(
                            DELIVER,
                            args,
                            queue=queue,
                            producer=producer,
                            headers=headers[0] if headers else None,
                            argsrepr=repr(args[1:4]),
                            kwargsrepr="{}",
                            ignore_result=True,
                        )
                        self.sent += 1
            for run_id in ended:
                self.coordination().notify_ended(run_id)
        except Exception:
            if not swallow:
                raise
            # The events are stored: the sweeper delivers them when the broker is back.
            log.exception("could not enqueue %d deliveries; the sweeper will re-drive them", len(messages))

    # -- the engine's hooks -------------------------------------------------------------------

    @contextlib.asynccontextmanager
    async def serial(self, key: str, *, contended: bool = False, synced: bool = False) -> AsyncIterator[None]:
        """A step of run ``key`` (see :meth:`Engine.step`): its appends are guarded by
        the head of the view it read (the engine's tail); the first try takes no lock.
        ``contended``: an earlier try found the log moved on: this one holds the run's
        cluster-wide lock, so a contended run still makes progress."""
        async with self.coordination().lock(key) if self.serialize and contended else contextlib.AsyncExitStack():
            yield

    def steps_here(self, event: Event) -> bool:
        """May the step on a handler's result ``event`` be taken here, before it is
        appended (``Engine.answer``; :class:`~aaa_django.runtime.bus.StepsInline`)?
        In a worker that takes its queue: the step is guarded as every step is, and
        the result's delivery, taken on this loop, skips it. Elsewhere, no."""
        return self.local_steps is not None and self.local_steps(event)

    def delivers_here(self, event: Event) -> bool:
        """Will ``event``, appended now by this process, be delivered here, on this
        worker's loop, without a message (:class:`~aaa_django.runtime.bus.DeliversHere`)?
        In a worker that takes its queue, has room and is not shutting down; elsewhere,
        no. (What it says holds for the moment it is asked: a delivery sent after all
        is made where it lands, from the log.)"""
        return self.local_takes is not None and self.local_takes(event)

    def exclusive(self, name: str) -> contextlib.AbstractAsyncContextManager[None]:
        """``async with``: the one cluster-wide lease on ``name`` (see
        :class:`~aaa_django.runtime.bus.ExclusiveLeases`; ``LEASE_TTL``)."""
        return self.coordination().lease("exclusive", name, 1)

    def spawn(self, coro: Work) -> None:
        """Run ``coro`` (an engine timer firing) on this loop; ``drain`` waits for it."""
        if self.closed:
            coro.close()
            return
        task = asyncio.ensure_future(coro)
        self._spawned.add(task)
        task.add_done_callback(self._done)

    def _done(self, task: asyncio.Task) -> None:
        self._spawned.discard(task)
        error = task.exception() if not task.cancelled() else None
        if error is not None:
            self.errors.append(error)
            log.error("a spawned engine task failed", exc_info=error)

    @property
    def pending(self) -> int:
        return len(self._spawned)

    async def drain(self, timeout: float | None = None) -> None:
        """Wait for this process's spawned tasks. Deliveries run in the workers: wait
        for a run with ``run.result()``."""

        async def loop() -> None:
            while self._spawned:
                await asyncio.wait(set(self._spawned))

        await asyncio.wait_for(loop(), timeout)

    idle = drain

    def watch_ends(self) -> None:
        """Wake the engine's waiters (``engine.wait``, ``run.result()``) when any
        process ends a run: one subscription to the cluster's run-ended notices per
        bus, started on first use. Notices are not durable: ``wait`` still polls,
        at its ``poll_interval``."""
        if self._listener is None and not self.closed and self.engine is not None:
            self._listener = asyncio.ensure_future(self._listen())

    async def _listen(self) -> None:
        engine = self.engine
        assert engine is not None, "watch_ends starts the listener for a bound bus"
        delay = 0.1
        while not self.closed:
            try:
                async for run_id in self.coordination().ended_notices(lambda: self.closed):
                    delay = 0.1
                    engine.wake(run_id)
            except asyncio.CancelledError:
                raise
            except Exception:  # Redis away: the waiters poll meanwhile
                log.warning("run-ended notices unavailable; retrying in %.1f s", delay, exc_info=True)
                await asyncio.sleep(delay)
                delay = min(delay * 2, 5.0)

    async def close(self, *, cancel: bool = True) -> None:
        self.closed = True
        if self._listener is not None:
            self._listener.cancel()
            try:
                await asyncio.wait_for(self._listener, 5)
            except TimeoutError:
                log.warning("the run-ended listener did not stop within 5 s; left behind")
            except (asyncio.CancelledError, Exception):
                pass
            self._listener = None
        with self._fast_lock:
            publishers = list(self._publishers)
            self._publishers.clear()
        for fast in publishers:
            fast.close()
        tasks = set(self._spawned)
        if cancel:
            for t in tasks:
                t.cancel()
        if tasks:
            await asyncio.gather(*tasks, return_exceptions=True)


# Log records of a delivery carry its run id and seq (and its event type once read):
# Celery's own lines about the task too (its "succeeded" line is written after the task
# returns, before task_postrun). See aaa_django.runtime.logcontext.
_log_tokens: dict[str, contextvars.Token[logcontext.Delivery | None]] = {}


@task_prerun.connect
def _enter_log_context(task_id: str = "", task: Any = None, args: Sequence[Any] = (), **_: object) -> None:
    if task is not None and task.name == DELIVER and len(args) >= 3:
        _log_tokens[task_id] = logcontext.enter(logcontext.Delivery(args[1], args[2]))


@task_postrun.connect
def _leave_log_context(task_id: str = "", **_: object) -> None:
    token = _log_tokens.pop(task_id, None)
    if token is not None:
        logcontext.leave(token)
