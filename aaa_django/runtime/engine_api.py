"""``EngineAPI``: what the parts an engine hands itself to may call on it.

A run handle (:class:`~aaa_django.runtime.run.Run`), a step's context
(:class:`~aaa_django.runtime.ctx.Ctx`), a bus and a handler each get the engine;
they depend on this interface, not on :mod:`aaa_django.runtime.engine`, which
builds them (so the runtime has no import cycle). :class:`~aaa_django.runtime.Engine`
implements it; the type checker holds it to that where the engine hands itself over.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar, runtime_checkable

from aaa_django.events import Event, EventStore, FoldCache, Projection, Tail

from .meta import RunMeta
from .outcome import Outcome
from .wakeups import Wakeups

#: a projection's state type
S = TypeVar("S")

#: a subscriber: called with every event of the types it subscribed to
Handler = Callable[[Event], Awaitable[object]]


@dataclass(frozen=True)
class Stored:
    """A stored event as a delivery's message names it: its run (``stream``), ``seq``
    and ``id``. The engine's :meth:`~aaa_django.runtime.Engine.handle` reads it."""

    stream: str
    seq: int
    id: str


@runtime_checkable
class ChecksStart(Protocol):
    """A handler that refuses some runs at their start, beside their input's schema
    (the model handler: a cost budget over a model it has no price for would never
    trip). The engine detects it once, when it subscribes (``Engine.subscribe``); the
    validation of a run's start asks it (``runtime.validation.start_errors``)."""

    def start_errors(self, config: object, budget: object) -> list[dict[str, Any]]:
        """Why a run with ``config`` and ``budget`` cannot start (pydantic's error
        shape: ``loc``, ``type``, ``msg``); empty when it can."""
        ...


@runtime_checkable
class ServesTools(Protocol):
    """A handler that runs tools (the ``ToolHandler``): the JSON specs of the tools it
    serves. The engine detects it once, when it subscribes (``Engine.subscribe``); a
    run that offers its model tools is offered these (:mod:`~aaa_django.runtime.offered`)."""

    def tool_specs(self) -> list[dict[str, Any]]:
        """``{"name", "description", "parameters"}`` of each tool it runs."""
        ...


@runtime_checkable
class RecordsWithRequest(Protocol):
    """A handler that, when it will take a request in this process, records the first
    thing it does with it in the same append as the request (the model handler: the
    request's first attempt, ``aaa.llm.attempted``, which must be on the log before the
    call is sent). One durable commit a request instead of two; the log is the same,
    event for event. The engine detects it once, when it subscribes
    (``Engine.subscribe``); :meth:`~.appends.Appends.append_stream` asks it for each
    event of the types it subscribed to."""

    async def with_request(self, batch: Sequence[Event], index: int) -> Event | None:
        """The event to append right after ``batch[index]`` (a request about to be
        appended, after ``batch[:index]``), or None: nothing (the request is then
        handled as ever when it is delivered)."""
        ...

    async def not_delivered_here(self, records: Sequence[Event]) -> None:
        """Of what :meth:`with_request` returned, the events whose requests this process
        will not deliver after all: the append did not store them (it failed, was
        refused, or found them stored already), or the bus sends their requests
        elsewhere (:func:`~.appends.not_delivered_here`); what the handler holds for
        them goes now."""
        ...


class EngineAPI(Protocol):
    """The engine's public interface (see :class:`~aaa_django.runtime.Engine`)."""

    store: EventStore
    #: the site's store under the tail (reads past what the engine holds)
    base_store: EventStore
    #: the store's tail: what this engine holds of the log
    tail: Tail
    cache: FoldCache
    #: what wakes waiters when a run moves, and their first wait between two polls
    wakeups: Wakeups
    poll_interval: float
    #: the subscribed handlers that check a run's start (:class:`ChecksStart`)
    start_checks: list[ChecksStart]
    #: the subscribed handlers that run tools (:class:`ServesTools`)
    tool_servers: list[ServesTools]
    #: by event type, the subscribed handlers that record with a request
    #: (:class:`RecordsWithRequest`)
    records_with: dict[str, list[RecordsWithRequest]]

    def subscribe(self, type: str, handler: Handler) -> None: ...

    def describe(self, algorithm: Any) -> tuple[str, dict[str, Any]]: ...

    def completion(self, run_id: str, outcome: Outcome, *, cause: Event | None = None) -> Event: ...

    async def cancel(self, run_id: str, *, reason: str | None = None, by: str | None = None) -> bool: ...

    async def fail(self, run_id: str, exc: BaseException, *, event: Event | None = None, attempts: int = 1) -> bool: ...

    async def meta(self, run_id: str, *, fresh: bool = False) -> RunMeta: ...

    async def project(self, projection: Projection[S], run_id: str) -> S: ...

    async def outcome(self, run_id: str) -> Outcome | None: ...

    async def wait(self, run_id: str, *, timeout: float | None = None) -> Outcome: ...

    async def hydrate(self, event: Event) -> Event: ...

    async def read_after(self, event: Event) -> list[Event]: ...

    async def find_after(self, event: Event, ids: Iterable[str], *, page: int = 64) -> dict[str, Event]: ...

    async def over(self, event: Event) -> bool: ...

    async def append(self, events: Iterable[Event]) -> list[Event]: ...

    async def append_at(self, events: Iterable[Event], head: int) -> list[Event]: ...

    async def started(self, run_id: str) -> Event | None: ...

    def limit_breach(self, meta: RunMeta, now: float | None = None) -> Outcome | None: ...

    async def answer(self, events: Iterable[Event]) -> list[Event]: ...

    async def handle(
        self,
        event: Event | Stored,
        *,
        synced: Callable[[], bool] | None = None,
        loaded: Callable[[Event | None], None] | None = None,
        dispatching: Callable[[Event], bool] | None = None,
    ) -> Event | None: ...

    def wake(self, run_id: str) -> None: ...
