"""The distributed bus: every appended event is delivered by a Celery task.

``DistributedBus`` implements the engine's bus interface (``bind``, ``publish``,
``serial``, ``spawn``, ``drain``, ``close``) over Celery:

- **publish** enqueues one message per event *after the transaction that appended it
  commits* (``transaction.on_commit`` on the store's database alias), so a worker
  never looks for an event that is not there, and a rolled-back event is never
  delivered. A message carries ids only: the store, the stream, the seq, the id.
- **queues**: model requests go to ``aaa.llm``; tool requests and approval decisions
  to ``aaa.tools``; everything else (the engine's and the algorithms' reactions,
  validation) to ``aaa.algorithms``. A site sizes each with its own workers.
- **delivery** (the ``aaa.deliver`` task, ``acks_late`` and requeued when its worker
  dies) loads the event from the store and calls ``engine.handle(event)``: the same
  step function the in-process bus calls. Each worker thread keeps one event loop and
  one engine per store (built by ``build_engine`` and the site's ``WORKER_SETUP``).
- **serial**: a run's algorithm steps are serialised across processes by a Redis lock
  (see :mod:`aaa_django.coordination`); derived events have deterministic ids, so a
  step that runs twice writes once.
- **limits across workers**: a run's deadline and an approval's expiry are Celery
  tasks with an ETA that deliver the event again when it is due (the engine's own
  reaction then ends the run ``timeout`` / records the expiry); tool pools become
  cluster-wide leases; a tool call running in one worker is cancelled when its run
  ends in another (a Redis notice, with polling as the fallback).

The worker side (the per-process loop and engine, one delivery) is
:mod:`aaa_django.worker`; the sweeper (:mod:`aaa_django.sweeper`, task ``aaa.sweep``)
re-drives runs that nothing is working on any more.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import logging
from functools import partial
from typing import Any, Iterable, Sequence

from asgiref.sync import sync_to_async
from celery import shared_task
from django.db import connections, transaction

from .conf import aaa_settings
from .events import Event
from .runtime import types as T
from .sweeper import BEAT_SCHEDULE  # noqa: F401  (re-exported)

log = logging.getLogger("aaa_django.bus")

#: the task names
DELIVER, SWEEP = "aaa.deliver", "aaa.sweep"

#: event type -> kind of work (a key of ``AAA["CELERY_QUEUES"]``); others: "algorithms"
KIND_OF = {
    T.LLM_REQUESTED: "llm",
    T.TOOL_REQUESTED: "tools",
    T.APPROVAL_GRANTED: "tools",
    T.APPROVAL_DENIED: "tools",
    T.APPROVAL_EXPIRED: "tools",
}



def _queues() -> dict[str, str]:
    """Kind of work -> queue name, from ``AAA["CELERY_QUEUES"]`` over the defaults."""
    from .conf import DEFAULTS

    return {**DEFAULTS["CELERY_QUEUES"], **(aaa_settings()["CELERY_QUEUES"] or {})}


def queue_for(event_type: str, names: dict[str, str] | None = None) -> str:
    return (names or _queues())[KIND_OF.get(event_type, "algorithms")]


def celery_app() -> Any:
    """The site's Celery app. ``current_app`` is per thread (an app is current in the
    thread that made it), and the engine's loop may run in another thread: fall back
    to any app in the process that has a broker configured."""
    from celery import current_app
    from celery._state import _get_active_apps

    app = current_app._get_current_object()
    if app.conf.broker_url:
        return app
    for other in list(_get_active_apps()):
        if other.conf.broker_url:
            return other
    return app


def redis_url() -> str | None:
    """``AAA["REDIS_URL"]``, else the Celery broker URL when it is Redis."""
    url = aaa_settings()["REDIS_URL"]
    if url:
        return url
    broker = celery_app().conf.broker_url or ""
    return broker if broker.split(":", 1)[0] in ("redis", "rediss", "unix") else None


_coordinators: dict[tuple, Any] = {}


def coordinator():
    """The process's :class:`~aaa_django.coordination.Coordinator` for the settings."""
    from .coordination import Coordinator

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


def store_spec(store: Any) -> list[Any]:
    """A JSON description of ``store`` that a worker can open again: ``["django",
    alias, class]`` (the class too, so a worker keeps e.g. the run index in step as
    the web process does) or ``["redis", url, prefix]``."""
    from .redis_store import RedisEventStore
    from .store import DjangoEventStore
    from .tailcache import TailCachedStore

    if isinstance(store, TailCachedStore):
        store = store.inner
    if isinstance(store, DjangoEventStore):
        cls = type(store)
        return ["django", store.using, f"{cls.__module__}.{cls.__qualname__}"]
    if isinstance(store, RedisEventStore):
        kw = store.client.connection_pool.connection_kwargs
        url = (f"unix://{kw['path']}?db={kw.get('db', 0)}" if kw.get("path")
               else f"redis://{kw.get('host', 'localhost')}:{kw.get('port', 6379)}/{kw.get('db', 0)}")
        return ["redis", url, store.prefix]
    raise TypeError(f"the Celery bus cannot deliver events of {store!r}: use the Django or Redis store")


def open_store(spec: Sequence[Any], *, inline: bool = False) -> Any:
    """The store a :func:`store_spec` describes (``inline``: a Django store that
    queries on the calling thread, see :class:`~aaa_django.store.DjangoEventStore`)."""
    if spec[0] == "django":
        from django.utils.module_loading import import_string

        from .store import DjangoEventStore

        cls = import_string(spec[2]) if len(spec) > 2 else DjangoEventStore
        if not (isinstance(cls, type) and issubclass(cls, DjangoEventStore)):
            raise ValueError(f"{spec[2]} is not a DjangoEventStore")
        return cls(spec[1], inline=inline)
    if spec[0] == "redis":
        from .redis_store import RedisEventStore

        return RedisEventStore(spec[1], prefix=spec[2])
    raise ValueError(f"unknown store spec {spec!r}")


# -- the bus -------------------------------------------------------------------------------

#: ids published by the delivery running in this context (see ``_deliver``)
_published: contextvars.ContextVar[set[str] | None] = contextvars.ContextVar("aaa_published", default=None)


class _Held:
    """Messages published while a run's lock is held, sent once it is released."""

    __slots__ = ("messages", "ended", "open")

    def __init__(self) -> None:
        self.messages: list = []
        self.ended: list[str] = []
        self.open = True


#: the messages of the run step running in this context (see ``DistributedBus.serial``)
_held: contextvars.ContextVar[_Held | None] = contextvars.ContextVar("aaa_held", default=None)


class DistributedBus:
    """The engine's bus over Celery (``AAA["BUS"] = "celery"``).

    ``queues`` overrides ``AAA["CELERY_QUEUES"]``; ``serialize=False`` drops the per-run
    lock (only to show, in a test, what the lock prevents); ``coordinator`` defaults to
    the one the settings describe. ``in_worker=True`` (the workers' own engines) sends
    at once: a worker's appends are never inside a caller's transaction, they have
    committed when ``publish`` is called.
    """

    def __init__(self, *, coordinator: Any = None, serialize: bool = True,
                 queues: dict[str, str] | None = None, in_worker: bool = False) -> None:
        self.coordinator = coordinator
        self.serialize = serialize
        self.in_worker = in_worker
        self.engine: Any = None
        self.spec: list[Any] | None = None
        self.queues = {**_queues(), **(queues or {})}
        self._app: Any = None
        self.closed = False
        #: exceptions that escaped tasks spawned on this bus (timers), newest last
        self.errors: list[BaseException] = []
        #: messages sent (one per event)
        self.sent = 0
        self._spawned: set[asyncio.Task] = set()

    def bind(self, engine: Any) -> None:
        """Attach the engine; its store must be one a worker can open (Django, Redis)."""
        self.engine = engine
        self.spec = store_spec(engine.store)

    def _coordinator(self):
        if self.coordinator is None:
            self.coordinator = coordinator()
        return self.coordinator

    # -- publishing -------------------------------------------------------------------------

    async def publish(self, events: Iterable[Event]) -> None:
        """Enqueue a delivery of each event once its transaction commits."""
        events = list(events)
        if self.closed or not events:
            return
        assert self.spec is not None, "bind the bus to an engine first"
        seen = _published.get()
        if seen is not None:
            seen.update(e.id for e in events)
        messages = [
            (queue_for(e.type, self.queues), [self.spec, e.stream, e.seq, e.id]) for e in events
        ]
        ended = [e.stream for e in events if e.type == T.RUN_COMPLETED]
        if self.in_worker:
            held = _held.get()
            if held is not None and held.open:
                # Inside a run's step: sent when the lock is released, or the next
                # delivery of the run would find it still held and have to wait.
                held.messages.extend(messages)
                held.ended.extend(ended)
                return
            # A broker round trip inline is cheaper than a thread hop. A failure raises:
            # the delivery is retried, and its retry enqueues what this one could not.
            self._send(messages, ended, swallow=False)
        elif self.spec[0] == "django":
            # on_commit must be called in the thread that owns the store's connection
            # (and transaction): the thread-sensitive executor the store runs in.
            await sync_to_async(self._on_commit, thread_sensitive=True)(messages, ended)
        else:
            await asyncio.to_thread(self._send, messages, ended)

    def _on_commit(self, messages: list, ended: list[str]) -> None:
        transaction.on_commit(partial(self._send, messages, ended), using=self.spec[1])

    def _send(self, messages: list, ended: list[str], *, swallow: bool = True) -> None:
        try:
            if self._app is None:
                self._app = celery_app()
            if messages:
                with self._app.producer_or_acquire() as producer:  # one for the batch
                    for queue, args in messages:
                        self._app.send_task(DELIVER, args, queue=queue, producer=producer)
                        self.sent += 1
            for run_id in ended:
                self._coordinator().notify_ended(run_id)
        except Exception:
            if not swallow:
                raise
            # The events are stored: the sweeper delivers them when the broker is back.
            log.exception("could not enqueue %d deliveries; the sweeper will re-drive them", len(messages))

    # -- the engine's hooks -------------------------------------------------------------------

    @contextlib.asynccontextmanager
    async def serial(self, key: str):
        """Hold the cluster-wide lock that serialises run ``key``'s steps. Once held,
        a worker's read cache catches up with the log before the step reads it. In a
        worker, what the step publishes is sent once the lock is released."""
        held = _Held() if self.in_worker else None
        token = _held.set(held) if held is not None else None
        try:
            async with self._coordinator().lock(key) if self.serialize else contextlib.AsyncExitStack():
                stale = getattr(self.engine.store, "stale", None) if self.engine is not None else None
                if stale is not None:
                    stale(key)
                yield
        finally:
            if held is not None:
                _held.reset(token)
                held.open = False  # a timer armed in the step publishes on its own later
                if held.messages or held.ended:
                    # Stored already: send them even when the step failed after appending.
                    self._send(held.messages, held.ended, swallow=False)

    def spawn(self, coro: Any) -> None:
        """Run ``coro`` (an engine timer firing) on this loop; ``drain`` waits for it."""
        if self.closed:
            coro.close()
            return
        task = asyncio.ensure_future(coro)
        self._spawned.add(task)
        task.add_done_callback(self._done)

    def _done(self, task: asyncio.Task) -> None:
        self._spawned.discard(task)
        if not task.cancelled() and task.exception() is not None:
            self.errors.append(task.exception())
            log.error("a spawned engine task failed", exc_info=task.exception())

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

    async def close(self, *, cancel: bool = True) -> None:
        self.closed = True
        tasks = set(self._spawned)
        if cancel:
            for t in tasks:
                t.cancel()
        if tasks:
            await asyncio.gather(*tasks, return_exceptions=True)


@shared_task(name=DELIVER, bind=True, acks_late=True, reject_on_worker_lost=True, ignore_result=True)
def deliver(self: Any, spec: list[Any], stream: str, seq: int, event_id: str) -> str:
    """Deliver one stored event to this worker's engine (``engine.handle``)."""
    from .worker import deliver_event, runtime, transient_errors

    rt = runtime()
    engine = rt.engine(spec)
    redelivered = bool((self.request.delivery_info or {}).get("redelivered")) or self.request.retries > 0
    try:
        return rt.run(deliver_event(engine, stream, seq, event_id, redelivered=redelivered))
    except transient_errors() as exc:
        # A database or Redis hiccup: drop a broken connection, try again later.
        if spec[0] == "django":  # in the thread that holds the store's connection
            rt.call(lambda: connections[spec[1]].close_if_unusable_or_obsolete())
        raise self.retry(exc=exc, countdown=min(2 ** self.request.retries * 0.1, 10), max_retries=12)


def _site_store(using: str) -> Any:
    """The store the site's engines use (it keeps the run index in step)."""
    from .store import DjangoEventStore

    return DjangoEventStore(using)


@shared_task(name=SWEEP, ignore_result=True)
def sweep(stall_after: float | None = None, using: str = "default") -> dict[str, Any]:
    """The sweeper as a Celery (beat) task: re-drive stalled runs; returns a summary."""
    from .sweeper import sweep as sweep_runs
    from .worker import runtime

    rt = runtime()
    engine = rt.engine(store_spec(_site_store(using)))
    report = rt.run(sweep_runs(engine, stall_after=stall_after))
    return report.summary()
