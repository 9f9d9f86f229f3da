"""``Facade``: the engine as its parts see it.

The engine (:class:`~aaa_django.runtime.Engine`) is a facade over parts that each own
one concern (:mod:`~.steps`, :mod:`~.appends`, :mod:`~.delivery`, :mod:`~.timers`,
:mod:`~.commands`, :mod:`~.children`, :mod:`~.reads`); each part is given the
engine. They depend on this interface, not on :mod:`aaa_django.runtime.engine`, which builds them (so
the runtime has no import cycle): the engine's public interface
(:class:`~.engine_api.EngineAPI`), what it is wired with, the per-run memories it
keeps (:mod:`~.bounded`), and the few operations one part asks of another.
"""

from __future__ import annotations

import contextlib
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Sequence
from typing import ParamSpec, Protocol, TypeVar

from aaa_django.data import BlobStore, NamespacedBlobStore
from aaa_django.events import Event

from .bus import Bus
from .ctx import TakesSteps
from .delivery import Deliveries
from .engine_api import EngineAPI, Handler
from .meta import RunMeta
from .observe import AppendObserver, Observer
from .outcome import Outcome
from .turns import Turns

#: a blob store call's parameters and result (``_blob_call``)
P = ParamSpec("P")
T = TypeVar("T")


class TimersPart(Protocol):
    """What the other parts ask of the timers (:class:`~.timers.Timers`)."""

    #: this engine holds loop timers (its bus keeps none)
    keeps: bool

    def track(self, stored: list[Event]) -> None: ...

    def arm(self, run_id: str, at: float) -> None: ...

    def disarm(self, run_id: str) -> None: ...


class CommandsPart(Protocol):
    """What the other parts ask of the commands (:class:`~.commands.Commands`)."""

    async def decide(
        self, run_id: str, request_id: str, type: str, *, meta: RunMeta | None = None, **extra: object
    ) -> list[Event]: ...


class ChildrenPart(Protocol):
    """What the other parts ask of the child runs (:class:`~.children.Children`)."""

    async def after_end(self, event: Event, meta: RunMeta) -> None: ...

    async def start(self, event: Event, meta: RunMeta) -> None: ...

    async def completion_event(self, run_id: str) -> Event | None: ...

    def cascade_cancel(self, completion: Event, child: str) -> Event: ...


class Facade(EngineAPI, Protocol):
    """What the engine's parts use of it (see the module docstring)."""

    bus: Bus
    blobs: BlobStore | None
    claim_threshold: int
    hot_fields: tuple[str, ...]
    observers: list[AppendObserver]
    watchers: list[Observer]
    turns: Turns
    guard_steps: bool
    errors: list[BaseException]
    _closed: bool
    _handlers: dict[str, list[Handler]]
    #: the per-run memories (:mod:`~.bounded`)
    _started: OrderedDict[str, Event]
    _hydrated: OrderedDict[str, Event]
    _algorithms: OrderedDict[str, TakesSteps]
    _built: OrderedDict[tuple[str, str], TakesSteps]
    _ended: OrderedDict[str, None]
    _completions: OrderedDict[str, Event]
    _stepped: OrderedDict[str, None]
    #: the blob store as a NamespacedBlobStore (``_namespaced``), the store's
    #: ``erase_many``: detected once
    _namespaced: bool
    _namespaces: NamespacedBlobStore | None
    _erase_many: Callable[[Sequence[str]], Awaitable[int]] | None
    #: the bus's ``watch_ends`` (``WatchesEnds``), or None
    _watch_ends: Callable[[], None] | None

    @property
    def _deliveries(self) -> Deliveries: ...

    @property
    def _timers(self) -> TimersPart: ...

    @property
    def _commands(self) -> CommandsPart: ...

    @property
    def _children(self) -> ChildrenPart: ...

    async def complete(self, run_id: str, outcome: Outcome, *, cause: Event | None = None) -> bool: ...

    async def fire_due(self, run_id: str, *, now: float | None = None) -> list[Event]: ...

    async def step(self, event: Event, *, synced: bool = False) -> None: ...

    async def react(self, event: Event) -> None: ...

    async def dispatch(self, event: Event) -> None: ...

    def algorithm(self, started: Event) -> TakesSteps: ...

    def delivered(self, run_id: str) -> None: ...

    def forget(self, run_id: str) -> None: ...

    def observing(self, event: Event) -> contextlib.AbstractContextManager[None]: ...

    def delivering(self, run_id: str) -> contextlib.AbstractContextManager[None]: ...

    async def _blob_call(self, fn: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T: ...
