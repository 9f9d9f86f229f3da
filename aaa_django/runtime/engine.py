"""The engine: starts runs, reacts to their events, enforces limits, ends them.

:class:`Engine` is the facade over parts that each own one concern, wired in its
constructor (what they use of it: :mod:`~aaa_django.runtime.facade`): the step
function, :meth:`Engine.handle`, which the bus calls for every appended event
(:mod:`~aaa_django.runtime.steps`; one ``RUNMETA`` fold a delivery:
:mod:`~aaa_django.runtime.delivery`); the appends, :meth:`Engine.append` and
:meth:`Engine.answer` (:mod:`~aaa_django.runtime.appends`); the limits
(:mod:`~aaa_django.runtime.limits`, pure); the timers that fire due times
(:mod:`~aaa_django.runtime.timers`); starting runs and the commands people give them
(:mod:`~aaa_django.runtime.commands`); child runs (:mod:`~aaa_django.runtime.children`);
and the reads of a run besides its ``RUNMETA`` (:mod:`~aaa_django.runtime.reads`).

What fails in a delivery is not the run's doing unless the algorithm raised (its run
ends ``failed``): an :class:`~aaa_django.events.InfrastructureError` (a store or the
broker failed; adapters translate their drivers' errors) or a handler's bug
propagates out of ``handle``, and the bus decides with
:func:`~aaa_django.runtime.retry.transient`: deliver again later, or give up and end
the run with :meth:`Engine.fail`, whose reason names the cause.

Every part writes new events with deterministic ids through :meth:`Engine.append`, so
delivering an event twice writes nothing new: the log is the only state.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import OrderedDict, defaultdict
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from contextlib import AbstractAsyncContextManager
from datetime import datetime
from typing import Any, ParamSpec, TypeVar

from aaa_django.data import DEFAULT_HOT_FIELDS, BlobStore, InMemoryBlobStore, NamespacedBlobStore
from aaa_django.events import ErasesMany, Event, EventStore, FoldCache, InMemoryEventStore, Projection, default_cache
from aaa_django.events.tail import Tail, TailCachedStore

from . import limits
from .appends import Appends
from .budget import Budget
from .bus import Bus, InProcessBus, WatchesEnds
from .children import Children
from .commands import Commands
from .ctx import TakesSteps
from .delivery import Deliveries
from .engine_api import ChecksStart, Handler, RecordsWithRequest, ServesTools, Stored
from .event_types import RUN_COMPLETED, completion_id
from .meta import RunMeta
from .observe import AppendObserver, Observer, check_observer, watchers, watching
from .outcome import Outcome
from .reads import Reads
from .run import Run
from .steps import Steps
from .timers import Timers
from .turns import Turns
from .validation import ValidationHandler
from .view import HydratedView
from .wakeups import Hub, Wakeups

#: a projection's state type
S = TypeVar("S")
#: a blob store call's parameters and result (:meth:`Engine._blob_call`)
P = ParamSpec("P")
T = TypeVar("T")
#: an observer (:meth:`Engine.observe` returns the one it was given)
Obs = TypeVar("Obs", bound=AppendObserver)

DEFAULT_CLAIM_THRESHOLD = 16_384
#: attempts of one model call recorded abandoned before the run ends ``failed``
#: (``AAA["MAX_ABANDONED_ATTEMPTS"]`` on a site): a crash loop cannot spend without limit
MAX_ABANDONED_ATTEMPTS = 3


class Engine:
    """Runs algorithms as event streams; ``async with Engine(...) as engine``.

    ``store`` defaults to an :class:`~aaa_django.events.InMemoryEventStore`; the engine
    reads and appends through a :class:`~aaa_django.events.tail.TailCachedStore` over
    it (unless ``store`` is one already): it knows what it has just appended and never
    reads it back; with ``blobs`` (a :class:`~aaa_django.data.BlobStore`: spec 004's
    four methods suffice; a :class:`~aaa_django.data.NamespacedBlobStore` keeps each
    run's payloads in a namespace of its own) event data over ``claim_threshold`` bytes
    of JSON is claim-checked (its stub keeps ``hot_fields`` and the fields ``RUNMETA``
    folds, :data:`~aaa_django.runtime.meta.FOLDED`); ``bus`` defaults to an
    :class:`InProcessBus`; ``cache`` (the in-process fold holder) defaults to the
    process's shared ``aaa_django.events.default_cache``. A
    :class:`~aaa_django.validate.ValidationHandler` is attached unless
    ``validate=False``. ``observers`` (:class:`~aaa_django.runtime.observe.Observer`,
    or :class:`~aaa_django.runtime.observe.AppendObserver` for one told of appends
    only) watch its work: signals, tracing (more with :meth:`observe`). ``wakeups``
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
        observers: Iterable[AppendObserver] = (),
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
        self._erase_many: Callable[[Sequence[str]], Awaitable[int]] | None = (
            base.erase_many if isinstance(base, ErasesMany) else None
        )
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
        #: by event type, the subscribed handlers that record with a request (detected
        #: in ``subscribe``): their record joins the request's append
        self.records_with: dict[str, list[RecordsWithRequest]] = {}
        #: what wakes this engine's waits (``wait``) when a run moves: its own hub
        #: unless given the process's (:mod:`aaa_django.runtime.wakeups`)
        self.wakeups: Wakeups = wakeups if wakeups is not None else Hub()
        #: which deliveries run now, the oldest work first (:mod:`aaa_django.runtime.turns`)
        self.turns: Turns = turns if turns is not None else Turns()
        #: the per-run memories (bounded: :mod:`~aaa_django.runtime.bounded`)
        self._started: OrderedDict[str, Event] = OrderedDict()
        self._hydrated: OrderedDict[str, Event] = OrderedDict()
        #: started event id -> its run's algorithm; (name, config JSON) -> the instance
        self._algorithms: OrderedDict[str, TakesSteps] = OrderedDict()
        self._built: OrderedDict[tuple[str, str], TakesSteps] = OrderedDict()
        #: runs whose end this engine delivered (``ENDED_KEPT``)
        self._ended: OrderedDict[str, None] = OrderedDict()
        #: run id -> the ``aaa.run.completed`` this engine appended (``COMPLETIONS_KEPT``)
        self._completions: OrderedDict[str, Event] = OrderedDict()
        #: ids of results stepped on before their append (``STEPPED_KEPT``)
        self._stepped: OrderedDict[str, None] = OrderedDict()
        self._closed = False
        #: what is told of this engine's appends, and of those what watches its work
        #: around it (see :mod:`aaa_django.runtime.observe`)
        self.observers: list[AppendObserver] = [check_observer(o) for o in observers]
        self.watchers: list[Observer] = watchers(self.observers)
        # The parts (each gets the engine; see the module docstring).
        self._deliveries = Deliveries(self)
        self._appends = Appends(self, answers=answers)
        self._steps = Steps(self)
        self._reads = Reads(self)
        self._timers = Timers(self)
        self._commands = Commands(self)
        self._children = Children(self)
        if validate:
            ValidationHandler().attach(self)

    # -- lifecycle ------------------------------------------------------------------

    async def __aenter__(self) -> Engine:
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None, *exc: object) -> None:
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
        self._timers.close()
        await self.bus.close(cancel=True)

    async def drain(self, timeout: float | None = None) -> None:
        """Wait until the bus has nothing in flight (tests)."""
        await self.bus.drain(timeout)

    idle = drain

    # -- subscriptions ------------------------------------------------------------------

    def subscribe(self, type: str, handler: Handler) -> None:
        """Call ``await handler(event)`` for every event of ``type`` (hydrated). A
        handler that checks a run's start (:class:`~.engine_api.ChecksStart`) is asked
        when each run starts, too; one that records with a request
        (:class:`~.engine_api.RecordsWithRequest`) is asked as each event of ``type`` is
        appended."""
        self._handlers[type].append(handler)
        if isinstance(handler, ChecksStart) and all(c is not handler for c in self.start_checks):
            self.start_checks.append(handler)
        if isinstance(handler, ServesTools) and all(s is not handler for s in self.tool_servers):
            self.tool_servers.append(handler)
        if isinstance(handler, RecordsWithRequest):
            self.records_with.setdefault(type, []).append(handler)

    def subscribers(self, type: str) -> list[Handler]:
        """The handlers subscribed to ``type``, in subscription order."""
        return list(self._handlers.get(type, ()))

    def observe(self, observer: Obs) -> Obs:
        """Add ``observer``: it is told of this engine's appends, and an
        :class:`~aaa_django.runtime.observe.Observer` is also called around its
        deliveries, steps and handlers (an
        :class:`~aaa_django.runtime.observe.AppendObserver` is not). Returns it."""
        self.observers.append(check_observer(observer))
        self.watchers = watchers(self.observers)
        return observer

    def observing(self, event: Event) -> contextlib.AbstractContextManager[None]:
        """Around one event's delivery (the run's step and the handlers): log records
        carry the event, the observers watch it (:func:`.observe.watching`)."""
        return watching(self.watchers, event)

    # -- starting and stopping runs -----------------------------------------------------

    def describe(self, algorithm: Any) -> tuple[str, dict[str, Any]]:
        """``(registered name, JSON config)`` of an algorithm instance, class or name
        (:meth:`.commands.Commands.describe`)."""
        return self._commands.describe(algorithm)

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
        run_id = await self._commands.start(
            algorithm,
            input,
            budget=budget,
            deadline=deadline,
            parent=parent,
            owner=owner,
            run_id=run_id,
            conversation=conversation,
        )
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

    async def fail(self, run_id: str, exc: BaseException, *, event: Event | None = None, attempts: int = 1) -> bool:
        """End a run ``failed`` because delivering ``event`` raised ``exc`` for good (a
        persistent infrastructure failure, an outage that outlasted the retries, a
        handler's bug): the outcome's value names the cause
        (:func:`~aaa_django.runtime.retry.failure`). A bus calls it when it gives up
        on a delivery. True if this ended the run."""
        return await self._commands.fail(run_id, exc, event=event, attempts=attempts)

    async def cancel(self, run_id: str, *, reason: str | None = None, by: str | None = None) -> bool:
        """Ask for a run to end ``cancelled``; False if it has ended (or was asked
        already) (:meth:`.commands.Commands.cancel`)."""
        return await self._commands.cancel(run_id, reason=reason, by=by)

    async def approve(self, run_id: str, request_id: str, *, by: str | None = None, reason: str | None = None) -> bool:
        """Grant a pending approval (``request_id``: the ``aaa.approval.requested`` id);
        False if there is none or it was decided already (:meth:`.commands.Commands.approve`)."""
        return await self._commands.approve(run_id, request_id, by=by, reason=reason)

    async def deny(self, run_id: str, request_id: str, *, by: str | None = None, reason: str | None = None) -> bool:
        """Deny a pending approval: the tool call fails with reason ``denied``."""
        return await self._commands.deny(run_id, request_id, by=by, reason=reason)

    async def erase(self, run_id: str) -> int:
        """Erase a run that has ended (its events, snapshots, blobs, cached state);
        returns the events erased. A run not ended is refused
        (:class:`RunNotEndedError`); child runs are erased on their own
        (:meth:`.commands.Commands.erase`)."""
        return await self._commands.erase(run_id)

    async def erase_runs(self, run_ids: Iterable[str]) -> int:
        """Erase runs known to have ended, in one transaction where the store can
        (:meth:`.commands.Commands.erase_runs`); returns the events erased."""
        return await self._commands.erase_runs(run_ids)

    async def resume(self, run_ids: Iterable[str] | None = None) -> list[str]:
        """Adopt unfinished runs found in the store (all, or these) and drive them to
        the end: their events delivered again, which does only what was left undone
        (:meth:`.commands.Commands.resume`). Returns the adopted run ids."""
        return await self._commands.resume(run_ids)

    adopt = resume

    # -- reading ------------------------------------------------------------------------

    async def meta(self, run_id: str, *, fresh: bool = False) -> RunMeta:
        """The engine's view of a run (``RUNMETA``); read-only. In a delivery to the run
        (:meth:`delivering`), the one it read, kept until this engine appends to the run
        (:meth:`.delivery.Deliveries.meta`); ``fresh``: read it again anyway."""
        return await self._deliveries.meta(run_id, fresh=fresh)

    def delivering(self, run_id: str) -> contextlib.AbstractContextManager[None]:
        """Within: a delivery to run ``run_id`` (see :meth:`meta`). The engine's
        :meth:`handle` is one; an answer's step on a result before its append is another."""
        return self._deliveries.scope(run_id)

    async def project(self, projection: Projection[S], run_id: str) -> S:
        """``projection`` folded over the run's hydrated events (holder + snapshots)."""
        return await projection.load(self.view, run_id, cache=self.cache)

    async def outcome(self, run_id: str) -> Outcome | None:
        """The run's outcome if it has ended, else None."""
        return await self._reads.outcome(run_id)

    async def wait(self, run_id: str, *, timeout: float | None = None) -> Outcome:
        """Wait for a run to end; return its outcome. A subscription to the run on
        :attr:`wakeups` (woken when this engine ends the run, when a bus that hears of
        other processes' ends does, and on the site's PostgreSQL when any process
        does), with polls that back off for an end no one announces
        (:meth:`.reads.Reads.wait`)."""
        return await self._reads.wait(run_id, timeout=timeout)

    async def started(self, run_id: str) -> Event | None:
        """The run's hydrated ``aaa.run.started`` (immutable, so cached)."""
        return await self._reads.started(run_id)

    async def hydrate(self, event: Event) -> Event:
        """The event with its claim-checked payload restored (a no-op for others)."""
        return await self._reads.hydrate(event)

    async def read_after(self, event: Event) -> list[Event]:
        """The (raw) events of the event's stream after it."""
        return await self.store.read(event.stream, after=event.seq or 0)

    async def find_after(self, event: Event, ids: Iterable[str], *, page: int = 64) -> dict[str, Event]:
        """Which of ``ids`` are in the event's stream after it (raw), by id, read page
        by page until all are found (:meth:`.reads.Reads.find_after`)."""
        return await self._reads.find_after(event, ids, page=page)

    async def over(self, event: Event) -> bool:
        """Whether the event's run has ended or a limit will end it: handlers do no new
        work then (a request over budget is never executed)."""
        meta = await self.meta(event.stream)
        return meta.completed or self.limit_breach(meta) is not None

    def limit_breach(self, meta: RunMeta, now: float | None = None) -> Outcome | None:
        """The outcome a limit imposes on the run now, if any (pure:
        :func:`.limits.breach`)."""
        return limits.breach(meta, self.max_abandoned, now)

    # -- writing ------------------------------------------------------------------------

    async def append(self, events: Iterable[Event]) -> list[Event]:
        """Claim-check, append (per stream, in order) and publish; return the new events
        (:mod:`~aaa_django.runtime.appends`). Events already in the store (same id) are
        absorbed and not published again; events the store refuses
        (``ClosedStreamError``: after a run's end, an erased run) are dropped."""
        return await self._appends.append(events)

    async def append_at(self, events: Iterable[Event], head: int) -> list[Event]:
        """Append ``events`` (of one run) only if the run's log still ends at seq
        ``head``: a decision made from the log as it was (a person's action, decided
        from RUNMETA at ``head``). Raises :class:`~aaa_django.events.ConcurrencyError`
        when something was appended since (decide again), and what the store raised
        (``ClosedStreamError``: the run has ended). Returns the new events, published."""
        return await self._appends.append_at(events, head)

    async def answer(self, events: Iterable[Event]) -> list[Event]:
        """Append a handler's result to its run (``events``: of one run) and, in the
        same append, what the run's step on it writes: one append and one commit
        instead of two, the same log, event for event; the result's delivery then skips
        the step. Only where the bus lets the step run here
        (:class:`~.bus.StepsInline`) and this engine holds the run's log; otherwise the
        result is appended alone, as :meth:`append` does, and stepped on when it is
        delivered (:meth:`.appends.Appends.answer`). Returns the new events."""
        return await self._appends.answer(events)

    async def _blob_call(self, fn: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
        # Blob stores are synchronous; only the in-memory one is safe to call inline.
        if isinstance(self.blobs, InMemoryBlobStore):
            return fn(*args, **kwargs)
        return await asyncio.to_thread(fn, *args, **kwargs)

    # -- the step function (:mod:`aaa_django.runtime.steps`) ----------------------------

    async def handle(
        self,
        event: Event | Stored,
        *,
        synced: Callable[[], bool] | None = None,
        loaded: Callable[[Event | None], None] | None = None,
        dispatching: Callable[[Event], bool] | None = None,
    ) -> Event | None:
        """React to one appended event (:mod:`~aaa_django.runtime.steps`: the engine,
        the run's algorithm, the handlers); returns the event delivered (hydrated), or
        None when the log no longer holds a stored event or the engine is closed.
        ``event``: the event itself, or the stored event a message names
        (:class:`Stored`), read first; ``synced``, ``loaded``, ``dispatching``: a bus's
        hooks around that read and before the handlers (:meth:`.steps.Steps.handle`).
        Idempotent; raises what a store or a handler raised (the bus delivers again or
        gives up: :meth:`fail`)."""
        return await self._steps.handle(event, synced=synced, loaded=loaded, dispatching=dispatching)

    def waiting(self) -> AbstractAsyncContextManager[None]:
        """``async with engine.waiting():`` around a handler's wait on something
        outside (a model, a tool, a person): the delivery's turn goes to other runs'
        work meanwhile, and what follows the wait queues by when it ended
        (:mod:`aaa_django.runtime.turns`). A wait not wrapped keeps the turn for
        ``turns.hold`` seconds at most: slower, never stuck."""
        return self.turns.waiting()

    async def step(self, event: Event, *, synced: bool = False) -> None:
        """The run's step for ``event`` (:meth:`react`), under the bus's serialisation
        of the run, guarded by the head of the log it read and run again when the log
        moved on (:meth:`.steps.Steps.step`). ``synced``: the tail holds the run as it
        is, no read."""
        await self._steps.step(event, synced=synced)

    async def react(self, event: Event) -> None:
        """The engine's reaction and the algorithm step (the caller serialises runs)."""
        await self._steps.react(event)

    def algorithm(self, started: Event) -> TakesSteps:
        """The run's algorithm, rebuilt from its started event through the registry;
        one instance per name and config, kept (:meth:`.steps.Steps.algorithm`)."""
        return self._steps.algorithm(started)

    async def dispatch(self, event: Event) -> None:
        """Run the handlers subscribed to the event's type, concurrently; then raise
        what one of them raised, after all have run (:meth:`.steps.Steps.dispatch`)."""
        await self._steps.dispatch(event)

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

    # -- timers (:mod:`aaa_django.runtime.timers`) -------------------------------------

    async def fire_due(self, run_id: str, *, now: float | None = None) -> list[Event]:
        """Record what the run's due times call for at ``now`` (default: the clock):
        its end ``timeout``, an approval's expiry... (:meth:`.timers.Timers.fire_due`);
        returns the events appended. Their ids are deterministic: firing twice, or in
        two processes, records once. The engine's loop timer calls it, or the workers'
        periodic duty over the run index."""
        return await self._timers.fire_due(run_id, now=now)

    def timers(self) -> dict[str, float]:
        """Run id -> the due time this engine holds a loop timer for. Empty on a bus
        with durable timers (the Celery bus): a waiting run costs its worker nothing."""
        return self._timers.due()

    # -- waiters ------------------------------------------------------------------------

    def wake(self, run_id: str) -> None:
        """Wake whoever waits for run ``run_id`` (``wait``, and the other waiters on
        :attr:`wakeups`) to look again."""
        self.wakeups.wake(run_id)
