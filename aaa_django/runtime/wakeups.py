"""Wake-ups: how whoever waits for a run to move learns that it did, at once.

One mechanism for every waiter of a process: :meth:`Engine.wait
<aaa_django.runtime.engine.Engine.wait>` (a run's end) and the REST API's event
streams (its next event) each hold a :class:`Subscription` to the run on a
:class:`Wakeups` hub, and whatever learns that the run moved calls ``wake(run_id)``:
the engine when it ends a run, a bus that hears of other processes' ends, and on
PostgreSQL the database's own notifications (:mod:`aaa_django.store.wakeups`, which also
says :meth:`~Wakeups.reliable`: every change is heard). A waiter reads when woken,
and polls at a pace of its own only for what no one announces.

A waiter that wants only the run's end (``Engine.wait``) subscribes ``ends_only``:
the database's notice of an append that did not end the run wakes the event streams
and not it (a run appends a dozen events or more before its end; each wake-up of a
wait is a read of the run). ``wake(run_id)`` wakes both kinds: whoever calls it
learnt that the run ended, or cannot tell (a lost listening connection wakes
everyone).

:class:`Hub` is the in-process hub (an engine's default; a database that cannot
notify).
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from typing import Protocol

__all__ = ["POLL_BACKOFF", "RELIABLE_POLL", "Hub", "Subscription", "Wakeups", "poll_intervals"]

#: the longest wait between two polls of a run, in ``poll_interval``s
POLL_BACKOFF = 8
#: while the wake-ups hub hears every process's changes (``Wakeups.reliable``), the
#: seconds between a wait's polls at the least: a poll is then only a safety net for a
#: notification lost on its way (the event streams' heartbeat, ``api.stream``, is the
#: same), not what ends the wait
RELIABLE_POLL = 15.0


def poll_intervals(first: float) -> Iterator[float]:
    """The waits between polls of a run's end: ``first``, then doubling, up to
    ``POLL_BACKOFF * first``, for ever."""
    interval = first
    while True:
        yield interval
        interval = min(interval * 2, first * POLL_BACKOFF)


class Subscription:
    """One waiter's interest in one run. ``clear()`` before each read, then ``wait()``
    (a thread) or ``await until()`` (a coroutine on ``loop``): they return True as soon
    as the run moved after the ``clear()``, False when ``timeout`` ran out."""

    def __init__(
        self, hub: Hub | None, stream: str, loop: asyncio.AbstractEventLoop | None, *, ends_only: bool = False
    ) -> None:
        self.hub, self.stream, self._loop = hub, stream, loop
        #: woken only by the run's end (or its erasure), not by each append
        self.ends_only = ends_only
        self._flag = threading.Event()
        self._aflag = asyncio.Event() if loop is not None else None

    def wake(self) -> None:
        """From any thread."""
        if self._aflag is None:
            self._flag.set()
            return
        try:
            self._loop.call_soon_threadsafe(self._aflag.set)  # type: ignore[union-attr]
        except RuntimeError:
            pass  # its loop has closed: the waiter is gone

    def clear(self) -> None:
        (self._aflag or self._flag).clear()

    def wait(self, timeout: float) -> bool:
        return self._flag.wait(timeout)

    async def until(self, timeout: float) -> bool:
        assert self._aflag is not None, "subscribed without a loop"
        try:
            # (a timeout on this task: no task of its own for the wait, as wait_for
            # makes on Python 3.11, for each of a thousand waits' every poll)
            async with asyncio.timeout(timeout):
                await self._aflag.wait()
        except TimeoutError:
            return False
        return True

    def close(self) -> None:
        if self.hub is not None:
            self.hub.unsubscribe(self)


class Wakeups(Protocol):
    """What tells a process's waiters that their run moved."""

    def subscribe(
        self, stream: str, loop: asyncio.AbstractEventLoop | None = None, *, ends_only: bool = False
    ) -> Subscription:
        """A subscription to ``stream``; ``ends_only``: one that an append which does
        not end the run need not wake (it may: a waiter reads when woken, and finds
        what it finds)."""
        ...

    def wake(self, stream: str | None = None) -> None:
        """Wake the subscriptions to ``stream`` (None: every one), from any thread."""
        ...

    def reliable(self) -> bool:
        """True while every change to a subscribed run wakes its subscriptions (a
        waiter then need not poll); False: only what this process learns does."""
        ...


class Hub:
    """Subscriptions by run, woken by ``wake`` (see the module). Not reliable: a
    change made elsewhere wakes no one here."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._subs: dict[str, set[Subscription]] = {}

    def subscribe(
        self, stream: str, loop: asyncio.AbstractEventLoop | None = None, *, ends_only: bool = False
    ) -> Subscription:
        sub = Subscription(self, stream, loop, ends_only=ends_only)
        with self._lock:
            self._subs.setdefault(stream, set()).add(sub)
        return sub

    def unsubscribe(self, sub: Subscription) -> None:
        with self._lock:
            subs = self._subs.get(sub.stream)
            if subs is not None:
                subs.discard(sub)
                if not subs:
                    del self._subs[sub.stream]

    def wake(self, stream: str | None = None) -> None:
        with self._lock:
            subs = (
                [s for group in self._subs.values() for s in group]
                if stream is None
                else list(self._subs.get(stream, ()))
            )
        for sub in subs:
            sub.wake()

    def _wake_kind(self, stream: str, ends_only: bool) -> None:
        """Wake the subscriptions to ``stream`` whose ``ends_only`` is ``ends_only``
        (a database's notices: of an append, of an end)."""
        with self._lock:
            subs = [s for s in self._subs.get(stream, ()) if s.ends_only is ends_only]
        for sub in subs:
            sub.wake()

    def reliable(self) -> bool:
        return False
