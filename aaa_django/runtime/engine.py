"""The engine: starts runs, reacts to their events, enforces limits, ends them.

Everything goes through one step function, :meth:`Engine.handle`, which the bus calls
for every appended event (of any run, in any process):

1. hydrate the event (claim-checked payloads come back from the blob store);
2. under the run's lock: the engine's own reaction, decided from ``RUNMETA`` (limits,
   completion, starting and cancelling children, notifying the parent), then the
   run's algorithm step, rebuilt from ``aaa.run.started`` through the registry;
3. the handlers subscribed to the event's type (models, tools, validation).

What fails there is not the run's doing unless the algorithm raised (its run ends
``failed``): an :class:`~aaa_django.events.InfrastructureError` (a store or the broker
failed; adapters translate their drivers' errors) or a handler's bug propagates out of
``handle``, and the bus decides with :func:`~aaa_django.runtime.retry.transient`:
deliver again later, or give up and end the run with :meth:`Engine.fail`, whose
reason names the cause.

Each part writes new events with deterministic ids through :meth:`Engine.append`
(claim check, store append absorbing duplicates, publish of the new events only), so
delivering an event twice writes nothing new: the log is the only state.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import json
import logging
import time
import traceback
from collections import OrderedDict, defaultdict
from dataclasses import dataclass, replace
from datetime import datetime
from itertools import groupby
from typing import (
    Any,
    AsyncContextManager,
    Awaitable,
    Callable,
    Iterable,
    Iterator,
    Mapping,
    TypeVar,
)

from aaa_django.data import (
    DEFAULT_HOT_FIELDS,
    BlobStore,
    InMemoryBlobStore,
    NamespacedBlobStore,
    hydrate,
    is_claimed,
)
from aaa_django.data.claims import claim_payload, put_claim
from aaa_django.data.errors import BlobError
from aaa_django.events import (
    ClosedStreamError,
    ConcurrencyError,
    ErasesMany,
    Event,
    EventList,
    EventStore,
    FoldCache,
    InfrastructureError,
    InMemoryEventStore,
    Projection,
    check_event,
    default_cache,
    derive_id,
    new_id,
)
from aaa_django.events.store import caller_alone
from aaa_django.events.tail import Staged, Tail, TailCachedStore

from . import conversation as talk
from . import offered, registry
from .budget import Budget
from .bus import Bus, DurableTimers, InProcessBus, StepsInline, WatchesEnds
from .ctx import Ctx, _budget, _plain, absolute_deadline
from .engine_api import ChecksStart, ServesTools
from .errors import RunNotEndedError
from .event_types import (
    APPROVAL_DENIED,
    APPROVAL_EXPIRED,
    APPROVAL_GRANTED,
    ATTEMPT_RECORDS,
    CANCEL_REQUESTED,
    CHILD_COMPLETED,
    CHILD_REQUESTED,
    LLM_FAILED,
    LLM_REQUESTED,
    MESSAGE_SENT,
    QUESTION_ASKED,
    RUN_COMPLETED,
    RUN_STARTED,
    TOOL_FAILED,
    TOOL_REQUESTED,
    completion_id,
    decision_id,
    result_id,
    started_id,
)
from .logcontext import delivering
from .meta import FOLDED, RUNMETA, OpenCall, RunMeta, due_time
from .meta import apply as fold_runmeta
from .observe import Observer, around, check_observer, notify_appended
from .outcome import BUDGET_EXCEEDED, CANCELLED, FAILED, INVALID_INPUT, TIMEOUT, Outcome
from .retry import failure, transient
from .run import Run
from .turns import Turns
from .validation import ValidationHandler
from .view import HydratedView
from .wakeups import RELIABLE_POLL, Hub, Wakeups, poll_intervals

#: a projection's state type
S = TypeVar("S")
#: a bounded map's key
K = TypeVar("K")

log = logging.getLogger("aaa_django.runtime")

Handler = Callable[[Event], Awaitable[Any]]

DEFAULT_CLAIM_THRESHOLD = 16_384
#: attempts of one model call recorded abandoned before the run ends ``failed``
#: (``AAA["MAX_ABANDONED_ATTEMPTS"]`` on a site): a crash loop cannot spend without limit
MAX_ABANDONED_ATTEMPTS = 3
#: the ``reason`` of the result a run's end records for a call it cut off, by outcome
#: (any other outcome: ``run_ended``)
CUT_OFF_REASONS = {CANCELLED: "cancelled", TIMEOUT: "timeout", BUDGET_EXCEEDED: "budget_exceeded"}
#: tries of a run's step whose appends find the log moved on (another process wrote);
#: past them the error is raised (a Celery delivery is then retried)
STEP_TRIES = 8



# What an engine keeps per run, for the runs in flight: the first two are dropped when
# the run's end is delivered (:meth:`Engine.forget`); each is bounded, the oldest
# dropped first (a long-lived worker serves any number of runs).
#: runs whose hydrated ``aaa.run.started`` is kept
STARTED_KEPT = 4096
#: runs whose rebuilt algorithm is kept (a pure function of the started event), and
#: distinct (algorithm, config) instances
ALGORITHMS_KEPT = 1024
#: claim-checked events kept hydrated (their payloads read back from the blob store)
HYDRATED_KEPT = 256
#: runs whose end this engine delivered, remembered (their ids) so that a delivery of
#: one of them drops again what it read back (:meth:`Engine.delivered`)
ENDED_KEPT = 1024
#: runs whose ``aaa.run.completed`` this engine appended, kept: a wait for one of them
#: (woken by that append) has its outcome without reading the run back
COMPLETIONS_KEPT = 4096
#: results stepped on before their append (``Engine.answer``) whose delivery has not
#: come yet: it skips the step
STEPPED_KEPT = 4096


@dataclass(eq=False)
class _Delivering:
    """A delivery to a run: the RUNMETA it read (None: read it again: this engine
    appended to the run since)."""

    meta: RunMeta | None = None


class _DeliveryScope:
    """:meth:`Engine.delivering`'s context manager (a class, not a generator: entered
    once per delivery, in a third of the time)."""

    __slots__ = ("engine", "run_id", "delivering", "token")

    def __init__(self, engine: "Engine", run_id: str) -> None:
        self.engine = engine
        self.run_id = run_id
        self.delivering: _Delivering | None = None

    def __enter__(self) -> None:
        engine, run_id = self.engine, self.run_id
        current = engine._delivery.get() or {}
        outer = current.get(run_id)
        if outer is not None and outer in engine._delivering.get(run_id, ()):
            return  # within one already (the engine's handle in a bus's)
        # (a task started during a delivery that has ended inherits it: not one)
        delivering = self.delivering = _Delivering()
        engine._delivering.setdefault(run_id, set()).add(delivering)
        self.token = engine._delivery.set({**current, run_id: delivering})

    def __exit__(self, *exc: object) -> None:
        delivering = self.delivering
        if delivering is None:
            return
        engine = self.engine
        engine._delivery.reset(self.token)
        others = engine._delivering.get(self.run_id)
        if others is not None:
            others.discard(delivering)
            if not others:
                del engine._delivering[self.run_id]


class Engine:
    """Runs algorithms as event streams; ``async with Engine(...) as engine``.

    ``store`` defaults to an :class:`~aaa_django.events.InMemoryEventStore`; the engine
    reads and appends through a :class:`~aaa_django.events.tail.TailCachedStore` over
    it (unless ``store`` is one already): it knows what it has just appended and
    never reads it back; with
    ``blobs`` (a :class:`~aaa_django.data.BlobStore`: spec 004's four methods suffice;
    a :class:`~aaa_django.data.NamespacedBlobStore` keeps each run's payloads in a
    namespace of its own) event data over
    ``claim_threshold`` bytes of JSON is claim-checked (its stub keeps ``hot_fields``
    and the fields ``RUNMETA`` folds, :data:`~aaa_django.runtime.meta.FOLDED`); ``bus``
    defaults to an
    :class:`InProcessBus`; ``cache`` (the in-process fold holder) defaults to the
    process's shared ``aaa_django.events.default_cache``. A
    :class:`~aaa_django.validate.ValidationHandler` is attached unless
    ``validate=False``. ``observers`` (:class:`~aaa_django.runtime.observe.Observer`)
    watch its work: signals, tracing (more with :meth:`observe`). ``wakeups``
    (:class:`~aaa_django.runtime.wakeups.Wakeups`): the hub its waits subscribe to,
    shared with the process's other waiters (the site's: its database's, which hears
    other processes' appends on PostgreSQL); by default one of its own. ``answers``:
    a handler's result and what the run's step on it writes go in one append
    (:meth:`answer`), where the bus runs every step in this process (the in-process
    bus, and a Celery worker's for the queues it takes); False: each result is appended
    alone and stepped on when it is delivered (the same log, twice the appends).
    ``max_abandoned``: a run one of whose model calls has this many attempts recorded
    abandoned (``aaa.llm.abandoned``: their process died with them in flight) ends
    ``failed`` (see :meth:`limit_breach`).
    """

    def __init__(
        self,
        store: EventStore | None = None,
        blobs: BlobStore | None = None,
        claim_threshold: int = DEFAULT_CLAIM_THRESHOLD,
        bus: Bus | None = None,
        cache: FoldCache | None = None,
        *,
        validate: bool = True,
        hot_fields: Iterable[str] = DEFAULT_HOT_FIELDS,
        close_timeout: float = 2.0,
        poll_interval: float = 0.5,
        observers: Iterable[Observer] = (),
        wakeups: Wakeups | None = None,
        turns: Turns | None = None,
        answers: bool = True,
        max_abandoned: int = MAX_ABANDONED_ATTEMPTS,
    ) -> None:
        if isinstance(max_abandoned, bool) or not isinstance(max_abandoned, int) or max_abandoned < 1:
            raise ValueError(f"max_abandoned must be an int >= 1, got {max_abandoned!r}")
        #: abandoned attempts of one model call that end the run ``failed``
        self.max_abandoned = max_abandoned
        store = store if store is not None else InMemoryEventStore()
        tail: Tail = store if isinstance(store, Tail) else TailCachedStore(store)
        #: the site's store under the tail: what it offers beyond the EventStore protocol
        #: (``ErasesMany``, a due index, the database it is on) is found on it, never
        #: through the tail, which forwards nothing it does not declare
        self.base_store: EventStore = tail.inner
        self.store: EventStore = tail
        #: the store's tail (detected once, here): what this engine holds of the log
        self.tail: Tail = tail
        #: a run's step appends only if the run's log is still the one it read (False:
        #: only to show, in a test, what the guard prevents)
        self.guard_steps = True
        #: the store's ``erase_many`` (many streams in one transaction), or None
        base = self.base_store
        self._erase_many = base.erase_many if isinstance(base, ErasesMany) else None
        self.blobs = blobs
        #: the blob store keeps namespaces (a run's blobs are erased in one call)
        self._namespaced = isinstance(blobs, NamespacedBlobStore)
        #: the same store as a NamespacedBlobStore, when it is one (detected once)
        self._namespaces: NamespacedBlobStore | None = blobs if isinstance(blobs, NamespacedBlobStore) else None
        self.claim_threshold = claim_threshold
        self.hot_fields = tuple(hot_fields)
        self.bus: Bus = bus if bus is not None else InProcessBus()
        #: the bus's ``watch_ends`` (it hears of runs other processes end), or None
        self._watch_ends = self.bus.watch_ends if isinstance(self.bus, WatchesEnds) else None
        self.cache = cache if cache is not None else default_cache
        self.bus.bind(self)
        self.view = HydratedView(self.store, self.hydrate, unavailable=True)
        self.close_timeout = close_timeout
        self.poll_interval = poll_interval
        #: exceptions raised by handlers other than infrastructure failures (bugs: a
        #: handler turns failures into events)
        self.errors: list[BaseException] = []
        self._handlers: dict[str, list[Handler]] = defaultdict(list)
        #: the subscribed handlers that check a run's start (detected in ``subscribe``)
        self.start_checks: list[ChecksStart] = []
        #: the subscribed handlers that run tools (detected in ``subscribe``): a run's
        #: model is offered theirs (:mod:`~aaa_django.runtime.offered`)
        self.tool_servers: list[ServesTools] = []
        #: what wakes this engine's waits (``wait``) when a run moves: its own hub
        #: unless given the process's (:mod:`aaa_django.runtime.wakeups`)
        self.wakeups: Wakeups = wakeups if wakeups is not None else Hub()
        #: which deliveries run now, the oldest work first (:mod:`aaa_django.runtime.turns`)
        self.turns: Turns = turns if turns is not None else Turns()
        #: run id -> (due time, loop timer): on a bus without durable timers only
        self._timers: dict[str, tuple[float, asyncio.TimerHandle]] = {}
        self._keeps_timers = not isinstance(self.bus, DurableTimers)
        self._started: OrderedDict[str, Event] = OrderedDict()
        self._hydrated: OrderedDict[str, Event] = OrderedDict()
        #: started event id -> its run's algorithm; (name, config JSON) -> the instance
        self._algorithms: OrderedDict[str, Any] = OrderedDict()
        self._built: OrderedDict[tuple[str, str], Any] = OrderedDict()
        #: the runs being delivered to (see :meth:`delivering`)
        #: run id -> the deliveries to it now (a RUNMETA they keep is old once this
        #: engine appends to the run)
        self._delivering: dict[str, set[_Delivering]] = {}
        #: the deliveries of this context (a task's), by run id: concurrent deliveries
        #: to one run (a tool call going on while a cancellation arrives) read
        #: RUNMETA each for itself
        self._delivery: contextvars.ContextVar[dict[str, _Delivering] | None] = \
            contextvars.ContextVar(f"aaa_delivery_{id(self):x}", default=None)
        self._ended: OrderedDict[str, None] = OrderedDict()
        #: run id -> the ``aaa.run.completed`` this engine appended (``COMPLETIONS_KEPT``)
        self._completions: OrderedDict[str, Event] = OrderedDict()
        #: the bus, when a result may be stepped on before its append, with the step's
        #: output (``answer``; asked for, and the bus says where, ``StepsInline``)
        self._steps_inline: StepsInline | None = (
            self.bus if answers and isinstance(self.bus, StepsInline) else None)
        #: ids of results stepped on before their append (``STEPPED_KEPT``)
        self._stepped: OrderedDict[str, None] = OrderedDict()
        #: the run, and the output kept, of a step on a result not yet appended (``answer``)
        self._capture: contextvars.ContextVar[tuple[str, list[Event]] | None] = \
            contextvars.ContextVar(f"aaa_capture_{id(self):x}", default=None)
        self._closed = False
        #: what watches this engine's work (see :mod:`aaa_django.runtime.observe`)
        self.observers: list[Observer] = [check_observer(o) for o in observers]
        if validate:
            ValidationHandler().attach(self)

    # -- lifecycle ------------------------------------------------------------------

    async def __aenter__(self) -> "Engine":
        return self

    async def __aexit__(self, exc_type: Any, *exc: Any) -> None:
        await self.close(drain=exc_type is None)

    async def close(self, *, drain: bool = True) -> None:
        """Stop: let in-flight deliveries finish (up to ``close_timeout``), then cancel
        them and every timer. What was not done is in the log for :meth:`resume`."""
        if self._closed:
            return
        if drain:
            with contextlib.suppress(asyncio.TimeoutError):
                await self.bus.drain(self.close_timeout)
        self._closed = True
        for _, handle in self._timers.values():
            handle.cancel()
        self._timers.clear()
        await self.bus.close(cancel=True)

    async def drain(self, timeout: float | None = None) -> None:
        """Wait until the bus has nothing in flight (tests)."""
        await self.bus.drain(timeout)

    idle = drain

    # -- subscriptions ------------------------------------------------------------------

    def subscribe(self, type: str, handler: Handler) -> None:
        """Call ``await handler(event)`` for every event of ``type`` (hydrated). A
        handler that checks a run's start (:class:`~.engine_api.ChecksStart`) is asked
        when each run starts, too."""
        self._handlers[type].append(handler)
        if isinstance(handler, ChecksStart) and all(c is not handler for c in self.start_checks):
            self.start_checks.append(handler)
        if isinstance(handler, ServesTools) and all(s is not handler for s in self.tool_servers):
            self.tool_servers.append(handler)

    def subscribers(self, type: str) -> list[Handler]:
        """The handlers subscribed to ``type``, in subscription order."""
        return list(self._handlers.get(type, ()))

    def observe(self, observer: Observer) -> Observer:
        """Add ``observer`` (an :class:`~aaa_django.runtime.observe.Observer`): it is
        called around this engine's deliveries, steps and handlers, and after its
        appends. Returns it."""
        self.observers.append(check_observer(observer))
        return observer

    def observing(self, event: Event) -> contextlib.AbstractContextManager[None]:
        """Around one event's delivery (the run's step and the handlers; a bus that
        splits the delivery wraps both): log records carry the event
        (:mod:`~aaa_django.runtime.logcontext`), the observers watch it."""
        if not self.observers:
            return delivering(event)
        return self._observed(event)

    @contextlib.contextmanager
    def _observed(self, event: Event) -> Iterator[None]:
        with delivering(event), around(self.observers, lambda o: o.delivery(event)):
            yield

    # -- starting and stopping runs -----------------------------------------------------

    def describe(self, algorithm: Any) -> tuple[str, dict[str, Any]]:
        """``(registered name, JSON config)`` of an algorithm instance, class or name."""
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
        input: Any,
        *,
        budget: Budget | Mapping[str, Any] | None = None,
        deadline: float | datetime | None = None,
        parent: str | None = None,
        owner: str | None = None,
        run_id: str | None = None,
        conversation: bool | Mapping[str, Any] | None = None,
    ) -> Run:
        """Start a run: append its ``aaa.run.started`` and return a :class:`Run`.

        ``deadline`` is seconds from now or an aware ``datetime``; it is stored as an
        absolute time so any process can enforce it. An algorithm that offers its
        model tools is offered this engine's, or those its config names, as JSON specs
        in the started event (:mod:`~aaa_django.runtime.offered`). ``conversation``
        (True, or ``{"idle": seconds}``): the run waits for a person's next message
        after each answer (:mod:`.conversation`; an algorithm that does not hold
        conversations raises :class:`~.conversation.ConversationError`).
        """
        name, config = self.describe(algorithm)
        conversation_settings = talk.settings(conversation)
        if conversation_settings is not None:
            talk.check_algorithm(name, config)
        run_id = run_id or f"run-{new_id()}"
        data = {
            "algorithm": name,
            "config": offered.resolve(self, name, config),
            "input": _plain(input),
            "budget": _budget(budget),
            "deadline": absolute_deadline(deadline),
            "parent": parent,
            "owner": owner,
        }
        if conversation_settings is not None:
            data["conversation"] = conversation_settings
        await self.append([Event(id=started_id(run_id), stream=run_id, type=RUN_STARTED, data=data)])
        return Run(self, run_id)

    def run(self, run_id: str) -> Run:
        """A handle on an existing run."""
        return Run(self, run_id)

    def completion(self, run_id: str, outcome: Outcome, *, cause: Event | None = None) -> Event:
        """The run's one ``aaa.run.completed`` event (not yet appended)."""
        return Event(
            id=completion_id(run_id),
            stream=run_id,
            type=RUN_COMPLETED,
            data=outcome.to_dict(),
            causation=cause.id if cause is not None else None,
            tenant=cause.tenant if cause is not None else None,
        )

    async def complete(self, run_id: str, outcome: Outcome, *, cause: Event | None = None) -> bool:
        """End a run with ``outcome`` unless it ended already; True if this ended it."""
        return bool(await self.append([self.completion(run_id, outcome, cause=cause)]))

    async def fail(self, run_id: str, exc: BaseException, *, event: Event | None = None,
                   attempts: int = 1) -> bool:
        """End a run ``failed`` because delivering ``event`` raised ``exc`` for good (a
        persistent infrastructure failure, an outage that outlasted the retries, a
        handler's bug): the outcome's value names the cause
        (:func:`~aaa_django.runtime.retry.failure`). A bus calls it when it gives up
        on a delivery. True if this ended the run."""
        meta = await self.meta(run_id)
        if not meta.started or meta.completed:
            return False
        value = failure(exc, event_id=event.id if event is not None else None,
                        event_type=event.type if event is not None else None, attempts=attempts)
        return await self.complete(run_id, Outcome(FAILED, value), cause=event)

    async def cancel(self, run_id: str, *, reason: str | None = None, by: str | None = None) -> bool:
        """Ask for a run to end ``cancelled`` (its in-flight tool calls are cancelled).

        Returns False if the run has ended (or was asked already).
        """
        meta = await self.meta(run_id)
        if not meta.started or meta.completed:
            return False
        e = Event(
            id=derive_id(run_id, CANCEL_REQUESTED),
            stream=run_id,
            type=CANCEL_REQUESTED,
            data={"reason": reason, "by": by},
        )
        return bool(await self.append([e]))

    async def approve(
        self, run_id: str, request_id: str, *, by: str | None = None, reason: str | None = None
    ) -> bool:
        """Grant a pending approval (``request_id``: the ``aaa.approval.requested`` id).

        Returns False if there is no such pending approval or it was decided already;
        an approval given after its expiry records ``aaa.approval.expired`` instead.
        """
        return bool(await self._decide(run_id, request_id, APPROVAL_GRANTED, by=by, reason=reason))

    async def deny(
        self, run_id: str, request_id: str, *, by: str | None = None, reason: str | None = None
    ) -> bool:
        """Deny a pending approval: the tool call fails with reason ``denied``."""
        return bool(await self._decide(run_id, request_id, APPROVAL_DENIED, by=by, reason=reason))

    async def _decide(self, run_id: str, request_id: str, type: str, *, meta: RunMeta | None = None,
                      **extra: Any) -> list[Event]:
        meta = meta if meta is not None else await self.meta(run_id)
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
        e = Event(id=decision_id(request_id), stream=run_id, type=type, data=data,
                  causation=request_id)
        return await self.append([e])

    async def erase(self, run_id: str) -> int:
        """Erase a run that has ended: its events, snapshots, blobs and in-process
        cached state.

        Returns the number of events erased. A run that has started and not ended is
        refused (:class:`RunNotEndedError`: cancel it, then erase it), so no handler
        still at work can write to it after (and a late result to an erased run is
        refused by the store: a run's stream starts with its start). Child runs are
        separate runs: erase them on their own.
        """
        meta = await self.meta(run_id)
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
        run_ids = list(dict.fromkeys(run_ids))
        if not run_ids:
            return 0
        refs: set = set()
        if self.blobs is not None and not self._namespaced:  # their refs, read before they go
            for run_id in run_ids:
                refs.update(ref for e in await self.store.read(run_id) for ref in e.blobs)
        for run_id in run_ids:
            self.forget(run_id)  # the tail's log of it first: the erase must not be read back
        if self._erase_many is not None:
            count = await self._erase_many(run_ids)
        else:
            count = 0
            for run_id in run_ids:
                count += await self.store.erase(run_id)
        for run_id in run_ids:
            if self._namespaces is not None:
                await self._blob_call(self._namespaces.delete_namespace, run_id)
            self.forget(run_id)  # again: a read during the erase may have kept some of it
            self._ended.pop(run_id, None)  # (an import may write it again)
            self._completions.pop(run_id, None)
            self._disarm(run_id)
        if self.blobs is not None:
            for ref in refs:
                await self._blob_call(self.blobs.delete, ref)
        gone = set(run_ids)
        for key in [k for k, e in self._hydrated.items() if e.stream in gone]:
            del self._hydrated[key]
        return count

    async def resume(self, run_ids: Iterable[str] | None = None) -> list[str]:
        """Adopt unfinished runs found in the store and drive them to the end.

        For each run with a start and no completion its events are delivered again
        (every reaction is idempotent, so this only does what was left undone), a
        finished child's completion is delivered again to its waiting parent, and an
        orphan whose parent has ended is cancelled. Returns the adopted run ids.
        """
        streams = list(run_ids) if run_ids is not None else await self.store.streams()
        adopted = []
        for stream in streams:
            meta = await self.meta(stream)
            if not meta.started or meta.completed:
                continue
            adopted.append(stream)
            if meta.due is not None:
                self._arm(stream, meta.due)
            await self.bus.publish(await self.store.read(stream))
            for child in meta.children:
                done = await self._completion_event(child)
                if done is not None:
                    await self.bus.publish([done])
            if meta.parent:
                parent_done = await self._completion_event(meta.parent)
                if parent_done is not None:
                    await self.append([self._cascade_cancel(parent_done, stream)])
        return adopted

    adopt = resume

    # -- reading ------------------------------------------------------------------------

    async def meta(self, run_id: str, *, fresh: bool = False) -> RunMeta:
        """The engine's view of a run (``RUNMETA``); read-only.

        While the run is being delivered to (:meth:`delivering`) it is read once and
        kept until this engine appends to the run: the engine's step and the handlers
        of a delivery decide from one fold. ``fresh``: read it again anyway (to see
        what other processes appended since).
        """
        delivering = (self._delivery.get() or {}).get(run_id)
        if delivering is not None and delivering not in self._delivering.get(run_id, ()):
            delivering = None  # inherited by a task from a delivery that has ended
        if delivering is not None and delivering.meta is not None and not fresh:
            return delivering.meta
        meta = await RUNMETA.load(self.store, run_id, cache=self.cache)
        if delivering is not None:
            delivering.meta = meta
        return meta

    def delivering(self, run_id: str) -> contextlib.AbstractContextManager[None]:
        """Within: a delivery to run ``run_id`` (see :meth:`meta`). The engine's
        :meth:`handle` is one; a bus that splits it (the Celery worker) opens it around
        its parts."""
        return _DeliveryScope(self, run_id)

    def _appending(self, run_id: str) -> None:
        """This engine appends to ``run_id``: a RUNMETA kept for a delivery is old."""
        for delivery in self._delivering.get(run_id, ()):
            delivery.meta = None

    async def project(self, projection: Projection[S], run_id: str) -> S:
        """``projection`` folded over the run's hydrated events (holder + snapshots)."""
        return await projection.load(self.view, run_id, cache=self.cache)

    async def outcome(self, run_id: str) -> Outcome | None:
        """The run's outcome if it has ended, else None."""
        e = await self._completion_event(run_id)
        return Outcome.from_dict(e.data) if e is not None else None

    async def wait(self, run_id: str, *, timeout: float | None = None) -> Outcome:
        """Wait for a run to end. The wait is a subscription to the run on
        :attr:`wakeups`, woken at once when this engine ends the run, when a bus that
        hears of other processes' ends does (:class:`~.bus.WatchesEnds`), and on the
        site's PostgreSQL when any process ends it (not at each append: the
        subscription is ``ends_only``); it reads the run's end when woken (an end this
        engine appended it has, without a read), and polls for an end no one
        announces, first after ``poll_interval``, then at intervals doubling up to
        ``POLL_BACKOFF`` times it (:func:`poll_intervals`): a poll is a read of the
        run, and a thousand runs waited on at once must not read their logs a
        thousand times a second. A run this engine is driving (it holds its log, it
        has not ended it) is not read when the wait begins: its end wakes the wait,
        and the first poll, ``poll_interval`` later (even while the hub hears
        everything: an end another process appended before the wait began woke
        nobody), reads it. While the hub hears every process's changes
        (``wakeups.reliable()``: the site's PostgreSQL listening), a poll is only a
        safety net, at least ``RELIABLE_POLL`` apart."""
        if self._watch_ends is not None:
            self._watch_ends()
        # (ends_only: on PostgreSQL, the run's appends before its end wake no read)
        sub = self.wakeups.subscribe(run_id, asyncio.get_running_loop(), ends_only=True)

        # A run whose log this engine holds, and whose end it has not appended, is one
        # it is driving: its end wakes the wait, so the first look reads nothing (a
        # read racing the run's own appends, on a store of one writer, delays them).
        driving = run_id not in self._completions and self.tail.held(run_id) is not None

        async def loop() -> Outcome:
            first = driving
            for interval in poll_intervals(self.poll_interval):
                sub.clear()  # (before the read: what moves the run after it wakes us)
                if first:  # (the first poll then comes after poll_interval, whatever the hub)
                    first = False
                else:
                    outcome = await self.outcome(run_id)
                    if outcome is not None:
                        return outcome
                    if self.wakeups.reliable():
                        interval = max(interval, RELIABLE_POLL)
                await sub.until(interval)
            raise AssertionError("unreachable")  # (poll_intervals never ends)

        try:
            return await asyncio.wait_for(loop(), timeout)
        finally:
            sub.close()

    async def started(self, run_id: str) -> Event | None:
        """The run's hydrated ``aaa.run.started`` (immutable, so cached)."""
        e = self._started.get(run_id)
        if e is None:
            first = await self.store.read(run_id, limit=1)
            if not first or first[0].type != RUN_STARTED:
                return None
            e = await self.hydrate(first[0])
            _keep(self._started, run_id, e, STARTED_KEPT)
        return e

    async def hydrate(self, event: Event) -> Event:
        """The event with its claim-checked payload restored (a no-op for others)."""
        if not is_claimed(event.data):
            return event
        cached = self._hydrated.get(event.id)
        if cached is not None and cached.seq == event.seq:
            return cached
        if self.blobs is None or not event.blobs:
            raise BlobError(f"event {event.id} is claim-checked but the engine has no blob store")
        data = await self._blob_call(hydrate, event.data, event.blobs[-1], store=self.blobs)
        full = replace(event, data=data)
        _keep(self._hydrated, event.id, full, HYDRATED_KEPT)
        return full

    async def read_after(self, event: Event) -> list[Event]:
        """The (raw) events of the event's stream after it."""
        return await self.store.read(event.stream, after=event.seq or 0)

    async def find_after(self, event: Event, ids: Iterable[str], *, page: int = 64) -> dict[str, Event]:
        """Which of ``ids`` are in the event's stream after it (raw), by id.

        Reads page by page and stops once all are found: a result usually follows its
        request closely, so checking "answered already?" stays cheap in a long log.
        """
        want = set(ids)
        found: dict[str, Event] = {}
        after = event.seq or 0
        while want:
            batch = await self.store.read(event.stream, after=after, limit=page)
            for e in batch:
                if e.id in want:
                    found[e.id] = e
                    want.discard(e.id)
            if len(batch) < page:
                break
            after = batch[-1].seq or after + len(batch)
        return found

    async def over(self, event: Event) -> bool:
        """Whether the event's run has ended or a limit will end it: handlers do no new
        work then (a request over budget is never executed)."""
        meta = await self.meta(event.stream)
        return meta.completed or self.limit_breach(meta) is not None

    def limit_breach(self, meta: RunMeta, now: float | None = None) -> Outcome | None:
        """The outcome a limit imposes on the run now, if any (pure)."""
        if meta.cancel is not None:
            return Outcome(CANCELLED, meta.cancel)
        if meta.input_errors is not None:
            return Outcome(INVALID_INPUT, {"errors": meta.input_errors})
        if meta.deadline is not None and (time.time() if now is None else now) >= meta.deadline:
            return Outcome(TIMEOUT, {"deadline": meta.deadline})
        if meta.budget is not None:
            over = meta.budget.exceeded(meta.spend)
            if over is not None:
                return Outcome(BUDGET_EXCEEDED, over)
        for request_id, call in meta.calls.items():
            if call.abandoned >= self.max_abandoned:
                return Outcome(FAILED, {
                    "error": f"model call {request_id} had {call.abandoned} attempts abandoned (the process "
                             "making each died, or lost the run, with it in flight): it is not sent again",
                    "reason": "abandoned_attempts", "request_id": request_id,
                    "abandoned": call.abandoned, "limit": self.max_abandoned})
        return None

    # -- writing ------------------------------------------------------------------------

    async def append(self, events: Iterable[Event]) -> list[Event]:
        """Claim-check, append (per stream, in order) and publish; return the new events.

        Events already in the store (same id) are absorbed and not published again.
        Nothing is appended after a run's ``aaa.run.completed``, nor to a run that was
        erased or never started: the store refuses it (``ClosedStreamError``), and the
        refused events are dropped here (a late result of an ended run). The bus is
        given them as an :class:`~aaa_django.events.EventList` that says whether they
        are all committed (not, when appended inside a caller's transaction: the
        Celery bus then enqueues them at its commit).
        """
        capture = self._capture.get()
        stored = EventList()
        for stream, group in groupby(events, key=lambda e: e.stream):
            batch = _through_completion(group)
            if capture is not None:
                # A step on a result not yet appended (``answer``): its output joins the
                # result's append; an append anywhere else cannot wait for it.
                if stream != capture[0]:
                    raise _NotInline(stream)
                capture[1].extend(batch)
                stored.extend(batch)
                continue
            try:
                added = await self._append_stream(stream, batch)
            except ClosedStreamError as exc:
                log.debug("not appended to %s: %s", stream, exc)
                continue
            if isinstance(added, EventList) and not added.committed:
                stored.committed = False
            stored.extend(added)
        if capture is None:
            await self._appended(stored)
        return stored

    async def append_at(self, events: Iterable[Event], head: int) -> list[Event]:
        """Append ``events`` (of one run) only if the run's log still ends at seq
        ``head``: a decision made from the log as it was (a person's action, decided
        from RUNMETA at ``head``). Raises :class:`~aaa_django.events.ConcurrencyError`
        when something was appended since (decide again), and what the store raised
        (``ClosedStreamError``: the run has ended). Returns the new events, published."""
        events = list(events)
        if not events:
            return []
        stream = events[0].stream
        if any(e.stream != stream for e in events):
            raise ValueError("append_at takes the events of one run")
        added = await self._append_stream(stream, _through_completion(events), expected_seq=head)
        stored = added if isinstance(added, EventList) else EventList(added)
        await self._appended(stored)
        return stored

    async def _append_stream(self, stream: str, batch: list[Event], *, expected_seq: int | None = None,
                             folded: tuple[RunMeta, int] | None = None) -> list[Event]:
        """``batch`` (of ``stream``) claim-checked and appended; its due times kept, the
        observers told. A batch that ends the run records first what it cuts off
        (:meth:`_cut_off`; ``folded``: the run's RUNMETA with the batch's first N
        events, when the caller has it). Raises what the store raised."""
        if batch and batch[-1].type == RUN_COMPLETED:
            batch = await self._cut_off(stream, batch, folded)
        if self.blobs is not None:
            batch = [await self._claim(e) for e in batch]
        self._appending(stream)
        alone = caller_alone.set(self.turns.alone())  # (a hint to the store: see caller_alone)
        try:
            added = await (self.store.append(batch) if expected_seq is None
                           else self.store.append(batch, expected_seq=expected_seq))
        finally:
            caller_alone.reset(alone)
            self._appending(stream)  # (a read meanwhile may have kept the log before it)
        if added and self._keeps_timers:
            # As soon as a due time is stored, as the run index's ``due_at`` is
            # (in the append's transaction): never a moment when the log says a
            # timer is running and this engine holds none.
            self._track_due(added)
        if added and self.observers:
            await notify_appended(self.observers, added)
        return added

    async def _cut_off(self, stream: str, batch: list[Event],
                       folded: tuple[RunMeta, int] | None = None) -> list[Event]:
        """``batch``, which ends with the run's ``aaa.run.completed``, with a result
        before the completion for each model or tool call still waiting for one (the
        run's log, then the batch, folded): ``aaa.llm.failed`` / ``aaa.tool.failed``,
        ``reason`` ``cancelled``, ``timeout``, ``budget_exceeded``, ``abandoned`` (the
        call whose abandoned attempts ended the run) or ``run_ended``, and
        ``"cut_off": true``, so a log reads whole. A model call with an attempt in
        flight is counted at that attempt's estimate (``"estimated": true``): its
        reply, if it comes, is not part of the log. Each has the request's one result
        id: a handler's own result, appended meanwhile, wins."""
        completion = batch[-1]
        # (in a step, the RUNMETA it decided from: no read)
        meta, done = folded if folded is not None else (await self.meta(stream), 0)
        if not meta.started or meta.completed:
            return batch  # (the store refuses the batch)
        state = meta
        if len(batch) - 1 > done:
            state = meta.__deepcopy__()
            for e in batch[done:-1]:
                state = fold_runmeta(state, e)
        if not state.calls:
            return batch
        outcome = completion.data.get("outcome")
        value = completion.data.get("value")
        cut = [_cut_off_result(completion, rid, call, outcome, value) for rid, call in state.calls.items()]
        return [*batch[:-1], *cut, completion]

    async def _appended(self, stored: EventList) -> None:
        """After an append: a run's end kept and its waiters woken; the new events
        published."""
        for e in stored:
            if e.type == RUN_COMPLETED:
                _keep(self._completions, e.stream, e, COMPLETIONS_KEPT)
                self.wake(e.stream)
            elif e.type in (MESSAGE_SENT, QUESTION_ASKED):  # it may wait for a person now
                self.wake(e.stream)
        if stored:
            await self.bus.publish(stored)

    async def answer(self, events: Iterable[Event]) -> list[Event]:
        """Append a handler's result to its run (``events``: of one run, e.g. a model's
        ``aaa.llm.completed``) and, in the same append, what the run's step on it
        writes: the step runs first, under the run's serialisation, on the run's log
        as this engine holds it with the result after it (``Tail.staging``: seen in
        this context only, as not committed), its output is kept instead of appended,
        and the result and the output go as one batch guarded by the held head. One
        append, one commit, instead of two; the log is the same, event for event. The
        result's delivery then skips the step (it was taken); its handlers run as
        ever. Returns the new events, as :meth:`append`.

        Only where the bus lets the step run here (:class:`~.bus.StepsInline`: the
        in-process bus; the Celery bus in a worker that takes the result's queue) and
        this engine holds the run's log; anything the step
        would write elsewhere (another run), an append that finds the log moved on
        or the run ended, or an output the store refuses: the result is appended
        alone, as :meth:`append` does, and stepped on when it is delivered."""
        events = list(events)
        inline = self._steps_inline
        if (inline is None or self._closed or not events or any(e.stream != events[0].stream for e in events)
                or not inline.steps_here(events[0])):
            return await self.append(events)
        stream = events[0].stream
        async with self.bus.serial(stream, synced=True):
            head = self.tail.held(stream)
            stored = None if head is None else await self._answer(stream, head, events)
        return stored if stored is not None else await self.append(events)

    async def _answer(self, stream: str, head: int, events: list[Event]) -> EventList | None:
        """:meth:`answer` under the run's lock, its log held to ``head``: the new events,
        or None (nothing appended: append the result alone)."""
        staged = [e.with_seq(head + i) for i, e in enumerate(events, 1)]
        out: list[Event] = []
        token = self._capture.set((stream, out))
        try:
            with self.tail.delivery(), self.delivering(stream), self.tail.staging(stream, staged) as kept:
                self._appending(stream)  # a RUNMETA kept before lacks the result
                for e in staged:
                    with self.observing(e):  # (its step, as if in its own delivery)
                        await self.react(e)
                stepped = await self.meta(stream)  # (the step's, with the results: kept, no read)
        except (_NotInline, Exception) as exc:  # (the result's delivery steps again, and sees it)
            log.debug("run %s: the step on a result not taken before its append (%r)", stream, exc)
            return None
        finally:
            self._capture.reset(token)
            self._appending(stream)
        try:
            added = await self._append_stream(stream, _through_completion([*events, *out]), expected_seq=head,
                                              folded=(stepped, len(events)))
        except InfrastructureError:
            raise  # as the result's own append would
        except Exception as exc:  # the log moved on, the run ended, an output the store refuses
            log.debug("run %s: a result and its step's output not appended together (%r)", stream, exc)
            return None
        stored = added if isinstance(added, EventList) else EventList(added)
        results = {e.id for e in events}
        for e in stored:
            if e.id in results:
                _keep(self._stepped, e.id, None, STEPPED_KEPT)
        if stored.committed:
            self._publish_folds(stream, kept)
        await self._appended(stored)  # (the new events' deliveries are on their way)
        if stored.committed:
            await self._save_snapshots(stream, kept)
        return stored

    def _holds(self, stream: str, seq: int, event_id: str) -> Event | None:
        """The event at ``seq`` of ``stream`` in this engine's tail, if it is ``event_id``."""
        e = self.tail.cached(stream, seq)
        return e if e is not None and e.id == event_id else None

    def _publish_folds(self, stream: str, kept: Staged) -> None:
        """The states the step's reads folded over the staged result, published now that
        it is appended (each where the log holds, at its cursor, the event it was folded
        up to)."""
        for cache, key, entry in kept.folds:
            e = self._holds(stream, entry.cursor, entry.event_id)
            if e is not None and e.time == entry.event_time:
                cache.publish(key, entry)

    async def _save_snapshots(self, stream: str, kept: Staged) -> None:
        """The snapshots the step's reads would have saved, saved now (where the log
        holds the event each was taken at). A failed save costs a longer fold later,
        nothing else (as a projection's own)."""
        for snapshot in kept.snapshots:
            if self._holds(stream, snapshot.seq, snapshot.event_id) is not None:
                try:
                    await self.store.save_snapshot(snapshot)
                except Exception:
                    log.warning("saving a snapshot of %s failed", stream, exc_info=True)

    async def _claim(self, e: Event) -> Event:
        if self.blobs is None or e.type == RUN_COMPLETED or not e.data:
            return e
        raw = claim_payload(e.data, self.claim_threshold)
        if raw is None:
            return e  # small (the common case): nothing to write, no hop to the store's thread
        stub, ref = await self._blob_call(
            put_claim, e.data, raw, store=self.blobs, namespace=e.stream,
            hot_fields=(*self.hot_fields, *FOLDED.get(e.type, ())),
            namespaced=self._namespaced,
        )
        return replace(e, data=stub, blobs=(*e.blobs, ref))

    async def _blob_call(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        # Blob stores are synchronous; only the in-memory one is safe to call inline.
        if isinstance(self.blobs, InMemoryBlobStore):
            return fn(*args, **kwargs)
        return await asyncio.to_thread(fn, *args, **kwargs)

    # -- the step function --------------------------------------------------------------

    async def handle(self, event: Event) -> None:
        """React to one appended event: the engine, the run's algorithm, the handlers.

        Idempotent: delivering an event again (or an older one) writes nothing new.
        Raises what a store or a handler raised (see the module docstring): the bus
        delivers again or gives up (:meth:`fail`).
        """
        if self._closed:
            return
        if event.id in self._stepped and not self._handlers.get(event.type):
            # A result ``answer`` stepped on, and no handler of its own: delivered.
            del self._stepped[event.id]
            self.delivered(event.stream)
            return
        try:
            async with self.turns.turn():
                with self.tail.delivery(), self.observing(event), self.delivering(event.stream):
                    # An event this engine appended (or read) is in its tail: the run's
                    # view is current without a read (the step's guard catches another
                    # process's write).
                    synced = self.tail.holds(event)
                    if is_claimed(event.data):
                        event = await self.hydrate(event)
                    await self.step(event, synced=synced)
                    await self.dispatch(event)
        finally:
            self.delivered(event.stream)

    def waiting(self) -> AsyncContextManager[None]:
        """``async with engine.waiting():`` around a handler's wait on something
        outside (a model, a tool, a person): the delivery's turn goes to other runs'
        work meanwhile, and what follows the wait queues by when it ended
        (:mod:`aaa_django.runtime.turns`). A wait not wrapped keeps the turn for
        ``turns.hold`` seconds at most: slower, never stuck."""
        return self.turns.waiting()

    async def step(self, event: Event, *, synced: bool = False) -> None:
        """The run's step for ``event`` (:meth:`react`), under the bus's serialisation
        of the run, in a delivery (``store.delivery()``). Its appends to the run's
        stream are guarded by the head of the view it read: when another process
        appended meanwhile, nothing of the try is stored and the step runs again from
        the log as it is now (from the second try on, ``contended``: a bus may then
        take a stronger lock). ``synced``: the tail holds the run as it is, no read."""
        if event.id in self._stepped:
            del self._stepped[event.id]  # ``answer`` took it, before the event was appended
            return
        tail, stream = self.tail, event.stream
        for attempt in range(STEP_TRIES):
            current = synced and attempt == 0
            try:
                async with self.bus.serial(stream, contended=attempt > 0, synced=current):
                    if not current:
                        tail.stale(stream)
                    with tail.guard(stream) if self.guard_steps else contextlib.nullcontext():
                        await self.react(event)
                return
            except ConcurrencyError:
                if attempt == STEP_TRIES - 1:
                    raise

    async def react(self, event: Event) -> None:
        """The engine's reaction and the algorithm step (the caller serialises runs)."""
        run_id = event.stream
        meta = await self.meta(run_id)
        if not meta.started:
            return
        if event.type == RUN_COMPLETED:
            await self._after_completion(event, meta)
            return
        if meta.completed:
            return  # recorded, changes nothing
        if event.type == RUN_STARTED:
            if not registry.known(meta.algorithm or ""):
                await self.complete(run_id, Outcome(FAILED, {
                    "error": f"unknown algorithm {meta.algorithm!r}: "
                             "import the module that registers it"}), cause=event)
                return
        breach = self.limit_breach(meta)
        if breach is None and meta.close is not None:  # a conversation closed by a person
            breach = await talk.closing(self, meta)
        if breach is not None:
            await self.complete(run_id, breach, cause=event)
            return
        if event.type == CHILD_REQUESTED and event.data.get("child") in meta.children:
            await self._start_child(event, meta)
        if meta.validated and event.type not in ATTEMPT_RECORDS:
            await self._step(event, meta)

    async def _step(self, event: Event, meta: RunMeta) -> None:
        run_id = event.stream
        started = await self.started(run_id)
        if started is None:
            return
        try:
            algorithm = self.algorithm(started)
            if event.type in getattr(algorithm, "ignores", ()):
                return
            ctx = Ctx(self, started, event, meta, algorithm)
            if self.observers:
                name = started.data["algorithm"]
                with around(self.observers, lambda o: o.step(event, name)):
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
            await self.complete(run_id, Outcome(FAILED, value), cause=event)
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
        over = _over_budget(meta, out)
        if over is not None or not _all_stored(out, run_id):
            bad = _bad_output(out)
            if bad is not None:
                await self.complete(run_id, Outcome(FAILED, bad), cause=event)
                return
        if over is not None:  # the requests are refused, not recorded: never made
            await self.complete(run_id, Outcome(BUDGET_EXCEEDED, over), cause=event)
            return
        try:
            await self.append(out)
        except Exception:
            bad = _bad_output(out)
            if bad is None:
                raise  # not the output's fault
            await self.complete(run_id, Outcome(FAILED, bad), cause=event)

    def algorithm(self, started: Event) -> Any:
        """The run's algorithm, rebuilt from its started event through the registry.

        A pure function of the registered name and the JSON config (never any run
        state: algorithms hold none), so one instance serves every run started with
        the same name and config (``ALGORITHMS_KEPT`` of them, and of runs), built
        once: a ToolLoop builds its tools' schemas, a thousand runs of one agent do
        not build them a thousand times.
        """
        algo = self._algorithms.get(started.id)
        if algo is None:
            name, config = started.data["algorithm"], started.data.get("config") or {}
            key = (name, json.dumps(config, sort_keys=True, separators=(",", ":")))
            algo = self._built.get(key)
            if algo is None:
                algo = registry.build(name, config)
            _keep(self._built, key, algo, ALGORITHMS_KEPT)
            _keep(self._algorithms, started.id, algo, ALGORITHMS_KEPT)
        return algo

    async def dispatch(self, event: Event) -> None:
        """Run the handlers subscribed to the event's type, concurrently (the last part
        of a delivery: after a run's end, what this process kept of the run goes); then
        raise what one of them raised (a failure retrying cannot mend first), so the
        bus delivers the event again or gives up on it. Every handler runs either way:
        one that fails does not stop the others."""
        handlers = self._handlers.get(event.type) or []
        raised: list[BaseException | None] = []
        if len(handlers) == 1:
            raised = [await self._call(handlers[0], event)]
        elif handlers:
            raised = await asyncio.gather(*(self._call(h, event) for h in handlers))
        if event.type == RUN_COMPLETED:
            _keep(self._ended, event.stream, None, ENDED_KEPT)
            self.forget(event.stream)
        elif event.type in (MESSAGE_SENT, QUESTION_ASKED) and (await self.meta(event.stream)).status == "waiting":
            self.forget(event.stream)  # waiting for a person: the run holds nothing but its rows
        failed = [exc for exc in raised if exc is not None]
        if failed:
            raise next((exc for exc in failed if not transient(exc)), failed[0])

    def delivered(self, run_id: str) -> None:
        """A delivery of an event of ``run_id`` is over (the bus calls this, whatever
        its outcome). If the run's end was delivered here already, what the delivery
        read back of the run (it overlapped the end, or came after it: a re-drive, a
        message delivered again) is dropped again."""
        if run_id in self._ended:
            self.forget(run_id)

    def forget(self, run_id: str) -> None:
        """Drop what this process keeps of a run (its log in the tail, its folded
        states, its rebuilt algorithm): read again only if asked for. The engine calls
        it once a run's end is delivered (and after any later delivery of the run), so
        a long-lived process holds the runs in flight, not every run it has served."""
        self.tail.forget(run_id)
        self.cache.forget_stream(self.store.cache_key, run_id)
        started = self._started.pop(run_id, None)
        if started is not None:
            self._algorithms.pop(started.id, None)

    async def _call(self, handler: Handler, event: Event) -> BaseException | None:
        try:
            if self.observers:
                with around(self.observers, lambda o: o.handler(handler, event)):
                    await handler(event)
            else:
                await handler(event)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            if not isinstance(exc, InfrastructureError):  # a handler bug: say where
                self.errors.append(exc)
                log.exception("handler %r failed on %s %s", handler, event.type, event.id)
            return exc
        return None

    # -- the engine's own reactions -----------------------------------------------------

    async def _after_completion(self, event: Event, meta: RunMeta) -> None:
        run_id = event.stream
        self.wake(run_id)
        out: list[Event] = []
        if meta.parent:
            out.append(event.derive(
                CHILD_COMPLETED,
                {
                    "child": run_id,
                    "key": meta.child_key,
                    "outcome": event.data.get("outcome"),
                    "value": event.data.get("value"),
                },
                stream=meta.parent,
            ))
        out.extend(self._cascade_cancel(event, child) for child in sorted(meta.children))
        if out:
            await self.append(out)

    def _cascade_cancel(self, completion: Event, child: str) -> Event:
        return completion.derive(
            CANCEL_REQUESTED,
            {"reason": f"parent run ended {completion.data.get('outcome')}",
             "by": completion.stream},
            key=child,
            stream=child,
        )

    async def _start_child(self, event: Event, meta: RunMeta) -> None:
        d = event.data
        data = {
            "algorithm": d["algorithm"],
            "config": offered.resolve(self, d["algorithm"], d.get("config") or {}),
            "input": d.get("input"),
            "budget": d.get("budget"),
            "deadline": d.get("deadline"),
            "parent": event.stream,
            "key": d.get("key"),
            "owner": meta.owner,
        }
        child = d["child"]
        await self.append([Event(id=started_id(child), stream=child, type=RUN_STARTED,
                                 data=data, causation=event.id, tenant=event.tenant)])

    async def _completion_event(self, run_id: str) -> Event | None:
        known = self._completions.get(run_id)
        if known is not None:  # appended here: a run's end is final
            return known
        meta = await self.meta(run_id, fresh=True)  # (waiters look for other processes' ends)
        if not meta.completed or not meta.completion_seq:
            return None
        events = await self.store.read(run_id, after=meta.completion_seq - 1, limit=1)
        return events[0] if events else None

    # -- timers: deadlines and approval expiries -------------------------------------

    async def fire_due(self, run_id: str, *, now: float | None = None) -> list[Event]:
        """Record what the run's due times call for at ``now`` (default: the clock):
        the run ends ``timeout`` once its deadline has passed; otherwise each pending
        approval past its expiry is recorded ``aaa.approval.expired``. Returns the
        events appended. Their ids are deterministic (the run's one completion, an
        approval's one decision), so firing twice, or in two processes, records once.
        Whatever keeps a run's timer calls this when ``RunMeta.due`` comes: the
        engine's loop timer, or the workers' periodic duty over the run index."""
        now = time.time() if now is None else now
        meta = await self.meta(run_id)
        if not meta.started or meta.completed:
            return []
        if meta.deadline is not None and now >= meta.deadline:
            started = await self.started(run_id)
            outcome = Outcome(TIMEOUT, {"deadline": meta.deadline})
            return await self.append([self.completion(run_id, outcome, cause=started)])
        fired: list[Event] = []
        expired = [rid for rid, p in meta.approvals.items() if p.expires_at is not None and now >= p.expires_at]
        for rid in sorted(expired, key=lambda r: meta.approvals[r].seq):
            fired += await self._decide(run_id, rid, APPROVAL_EXPIRED, meta=meta, by=None, reason="expired")
        if meta.questions or meta.awaiting:  # questions' expiries, a conversation's idle timeout
            fired += await talk.fire_due(self, run_id, now)
        return fired

    def timers(self) -> dict[str, float]:
        """Run id -> the due time this engine holds a loop timer for. Empty on a bus
        with durable timers (the Celery bus): a waiting run costs its worker nothing."""
        return {run_id: at for run_id, (at, _) in self._timers.items()}

    def _track_due(self, stored: list[Event]) -> None:
        for e in stored:
            if e.type == RUN_COMPLETED:
                self._disarm(e.stream)
            else:
                at = due_time(e)
                if at is not None:
                    self._arm(e.stream, at)

    def _arm(self, run_id: str, at: float) -> None:
        """Hold a loop timer for the run at ``at`` unless it has one due no later."""
        if self._closed or not self._keeps_timers:
            return
        held = self._timers.get(run_id)
        if held is not None:
            if held[0] <= at:
                return
            held[1].cancel()
        loop = asyncio.get_running_loop()
        handle: asyncio.TimerHandle

        def ring() -> None:
            if self._timers.get(run_id, (None, None))[1] is handle:
                del self._timers[run_id]
            self.bus.spawn(self._ring(run_id))

        # In a context of its own: the delivery that armed it (its contextvars) is not
        # kept alive for as long as the run waits (a conversation, for hours).
        handle = loop.call_later(max(0.0, at - time.time()), ring, context=contextvars.Context())
        self._timers[run_id] = (at, handle)

    async def _ring(self, run_id: str) -> None:
        fired = await self.fire_due(run_id)
        due = (await self.meta(run_id)).due
        # Again for the next due time; or for this one when the loop's clock ran early
        # (nothing was due yet by the wall clock the engine decides by).
        if due is not None and (fired or due > time.time()):
            self._arm(run_id, due)

    def _disarm(self, run_id: str) -> None:
        held = self._timers.pop(run_id, None)
        if held is not None:
            held[1].cancel()

    # -- waiters ------------------------------------------------------------------------

    def wake(self, run_id: str) -> None:
        """Wake whoever waits for run ``run_id`` (``wait``, and the other waiters on
        :attr:`wakeups`) to look again."""
        self.wakeups.wake(run_id)


class _NotInline(BaseException):
    """A step on a result not yet appended (``Engine.answer``) would append to another
    run: it is taken when the result is delivered instead. (Not an ``Exception``: it
    passes the step's own error boundary.)"""


def _keep(kept: OrderedDict[K, Any], key: K, value: Any, most: int) -> None:
    """``kept[key] = value`` as its newest entry; the oldest dropped past ``most``."""
    kept.pop(key, None)
    kept[key] = value
    if len(kept) > most:
        kept.popitem(last=False)


def _through_completion(events: Iterable[Event]) -> list[Event]:
    """``events`` up to their run's completion: a step's output after it is not part of
    the run (and the store would refuse the whole batch)."""
    out = []
    for e in events:
        out.append(e)
        if e.type == RUN_COMPLETED:
            break
    return out


def _cut_off_result(completion: Event, request_id: str, call: OpenCall, outcome: Any, value: Any) -> Event:
    """The result a run's end (``completion``) records for a call it cut off."""
    abandoned = (outcome == FAILED and isinstance(value, dict) and value.get("reason") == "abandoned_attempts"
                 and value.get("request_id") == request_id)
    reason = "abandoned" if abandoned else CUT_OFF_REASONS.get(outcome, "run_ended")
    data: dict[str, Any]
    if call.kind == "llm":
        data = {"request_id": request_id, "tag": call.tag, "thread": call.thread or "main", "reason": reason,
                "error": f"the run ended ({outcome}) before the model call had a result", "cut_off": True}
        if call.in_flight is not None:  # sent, and never to be recorded: counted at its estimate
            data.update(attempt=call.attempts, estimated=True, **call.in_flight.data())
        kind = LLM_FAILED
    else:
        data = {"call_id": call.call_id, "name": call.name, "reason": reason,
                "error": f"the run ended ({outcome}) before the tool call had a result", "cut_off": True}
        kind = TOOL_FAILED
    return Event(id=result_id(request_id), stream=completion.stream, type=kind, data=data,
                 causation=request_id, tenant=completion.tenant)


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


def _over_budget(meta: RunMeta, out: list[Event]) -> dict | None:
    """The call budget a step's requests would exceed, if any (a step that ends its run
    asks for nothing more)."""
    if meta.budget is None:
        return None
    counts = {LLM_REQUESTED: 0, TOOL_REQUESTED: 0, RUN_COMPLETED: 0}
    for e in out:
        if e.type in counts and e.stream == meta.run_id:
            counts[e.type] += 1
    if counts[RUN_COMPLETED]:
        return None
    return meta.budget.refuses(meta.spend, model_calls=counts[LLM_REQUESTED],
                               tool_calls=counts[TOOL_REQUESTED])
