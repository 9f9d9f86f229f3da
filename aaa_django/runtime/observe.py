"""Watching an engine: the observers it calls around its work (pure core).

An engine has a list of observers, wired once (``Engine(observers=[...])`` or
``engine.observe(observer)``; each checked there). It calls them in every process
that delivers (the web process, a command, a Celery worker):

- ``await appended(events)``: after the store took new events (one stream's batch, in
  the order they were stored), before they are published: every observer has it
  (:class:`AppendObserver`);
- and of an :class:`Observer` (one that also watches the work: tracing), around what
  the engine does: ``delivery(event)``, around one event's delivery (the run's step
  and the handlers); ``step(event, algorithm)``, around the algorithm's step for that
  event; ``handler(handler, event)``, around each handler's call (a model call for
  ``aaa.llm.requested``, a tool call for ``aaa.tool.requested``, ...).

Which kind an observer is is found once, when it is wired (``isinstance`` of the
protocols); one that only needs appends (the Django signals, a process's run claims)
implements ``appended`` alone, and the engine's deliveries, steps and handlers pay
nothing for it: no context managers entered around each (on a Celery worker carrying
3,000 runs, entering the site's signal sender's three no-op hooks was 4% of py-spy's
samples of the worker's loop, ``benchmarks/bench_concurrency.py``).

Django signals (:mod:`aaa_django.observe.signals`) and OpenTelemetry
(:mod:`aaa_django.observe.otel`) are observers. Observers must not raise: what they
watch goes on whatever they do (an observer's error is logged and dropped).

The log context (:mod:`aaa_django.runtime.logcontext`) is not an observer: it is
always set, it costs one context variable per delivery.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager
from typing import Protocol, runtime_checkable

from aaa_django.events import Event

from .engine_api import Handler
from .logcontext import delivering

log = logging.getLogger("aaa_django.runtime")


@runtime_checkable
class AppendObserver(Protocol):
    """What an engine tells of its appends (see the module docstring)."""

    async def appended(self, events: Sequence[Event]) -> None: ...


@runtime_checkable
class Observer(AppendObserver, Protocol):
    """What an engine calls around its work, and tells of its appends (see the module
    docstring)."""

    def delivery(self, event: Event) -> AbstractContextManager[object]: ...

    def step(self, event: Event, algorithm: str) -> AbstractContextManager[object]: ...

    def handler(self, handler: Handler, event: Event) -> AbstractContextManager[object]: ...

    async def appended(self, events: Sequence[Event]) -> None: ...


@runtime_checkable
class TraceCarrier(Protocol):
    """What carries a run's trace context in a bus's messages (the OpenTelemetry
    observer): the headers a delivery message of an event carries, and what a
    delivery that received them does with them."""

    def headers(self, event: Event) -> dict[str, str]: ...

    def received(self, run_id: str, headers: Mapping[str, str] | None) -> None: ...


@runtime_checkable
class CarriesTrace(Protocol):
    """A bus whose messages can carry a run's trace context (the Celery bus)."""

    def carry(self, carrier: TraceCarrier) -> None: ...


class BaseObserver:
    """An observer that watches nothing: subclass it and override what you need."""

    def delivery(self, event: Event) -> AbstractContextManager[object]:
        return contextlib.nullcontext()

    def step(self, event: Event, algorithm: str) -> AbstractContextManager[object]:
        return contextlib.nullcontext()

    def handler(self, handler: Handler, event: Event) -> AbstractContextManager[object]:
        return contextlib.nullcontext()

    async def appended(self, events: Sequence[Event]) -> None:
        return None


def check_observer(observer: object) -> AppendObserver:
    """``observer`` if it is an :class:`AppendObserver` (an :class:`Observer` is one),
    else a TypeError saying so."""
    if not isinstance(observer, AppendObserver):
        raise TypeError(
            f"{observer!r} is not an engine observer: it needs an async appended, and to "
            "watch the work delivery, step and handler too (subclass "
            "aaa_django.runtime.observe.BaseObserver)"
        )
    return observer


def watchers(observers: Sequence[AppendObserver]) -> list[Observer]:
    """Those of ``observers`` that watch the work (:class:`Observer`), in order."""
    return [o for o in observers if isinstance(o, Observer)]


@contextlib.contextmanager
def around(observers: Sequence[Observer], hook: Callable[[Observer], AbstractContextManager[object]]) -> Iterator[None]:
    """Enter ``hook(observer)`` (e.g. ``lambda o: o.step(event, name)``) of each
    observer, in order, around the block; an observer that fails to enter or exit is
    logged and left out."""
    with contextlib.ExitStack() as stack:
        for observer in observers:
            try:
                stack.enter_context(_guarded(hook(observer), observer))
            except Exception:
                log.exception("observer %r failed entering", observer)
        yield


@contextlib.contextmanager
def _guarded(cm: AbstractContextManager[object], observer: Observer) -> Iterator[None]:
    cm.__enter__()
    try:
        yield
    except BaseException as exc:
        try:
            cm.__exit__(type(exc), exc, exc.__traceback__)
        except Exception:
            log.exception("observer %r failed", observer)
        raise
    try:
        cm.__exit__(None, None, None)
    except Exception:
        log.exception("observer %r failed", observer)


async def notify_appended(observers: Sequence[AppendObserver], events: Sequence[Event]) -> None:
    """``await observer.appended(events)`` for each observer; errors logged."""
    for observer in observers:
        try:
            await observer.appended(events)
        except Exception:
            log.exception("observer %r failed on appended events", observer)


def watching(observers: Sequence[Observer], event: Event) -> AbstractContextManager[None]:
    """Around one event's delivery (the run's step and the handlers): log records
    carry the event (:mod:`~aaa_django.runtime.logcontext`), the ``observers`` watch it
    (their ``delivery(event)``)."""
    if not observers:
        return delivering(event)
    return _watched(observers, event)


@contextlib.contextmanager
def _watched(observers: Sequence[Observer], event: Event) -> Iterator[None]:
    with delivering(event), around(observers, lambda o: o.delivery(event)):
        yield
