"""The in-process holder of folded states (incremental folds from a high-water mark).

Each entry is an immutable :class:`Folded` value: the cursor (seq of the last folded
event), the id of the event at the cursor, and the state. A reader advances it by
folding only the events after the cursor, after proving the entry is a prefix of its
own view of the log (the same event id at the cursor). The log stays the only fact:
the holder is a cache that any reader can rebuild, and a self-check every
``check_every`` reads compares it with the whole-log fold.

**Only when idle** (spec 003): a check that comes due waits until the process has read
and folded nothing for ``idle_after`` seconds (15 by default), so it never competes
with the turns of a busy process; then the due checks run, one after another, and
stop as soon as work comes back (the rest wait for the next quiet spell).
"""

from __future__ import annotations

import asyncio
import contextvars
import logging
import threading
import time
import weakref
from collections import OrderedDict
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from datetime import datetime
from typing import Any

#: a holder entry's key: (the store's cache_key, stream, projection key, version)
CacheKey = tuple[str, str, str, int]
#: a self-check the holder runs later
Check = Callable[[], Coroutine[Any, Any, object]]

log = logging.getLogger("aaa_django.events")

#: seconds without a read or a fold before the holder's self-checks run (spec 003: 15)
IDLE_AFTER = 15.0


@dataclass(frozen=True, slots=True)
class Folded:
    """A projection state folded up to ``cursor`` (an immutable value)."""

    cursor: int
    event_id: str
    state: Any
    #: events folded into ``state`` since it was last saved as a snapshot
    unsaved: int = 0
    #: time of the event at the cursor: with the id, what proves a reader's log is the
    #: same log (an erased stream rewritten with the same ids has other times)
    event_time: datetime | None = None


# Each field's slot, set directly (as ``events.event.stored_event`` does): a frozen
# dataclass's __init__ sets every field through object.__setattr__; a holder entry is
# made at every read that folds something.
_SET = tuple(Folded.__dict__[name].__set__ for name in ("cursor", "event_id", "state", "unsaved", "event_time"))
_new = object.__new__


def folded(cursor: int, event_id: str, state: Any, unsaved: int, event_time: datetime | None) -> Folded:
    """``Folded(cursor, event_id, state, unsaved, event_time)``, in less time."""
    entry = _new(Folded)
    s_cursor, s_event_id, s_state, s_unsaved, s_event_time = _SET
    s_cursor(entry, cursor)
    s_event_id(entry, event_id)
    s_state(entry, state)
    s_unsaved(entry, unsaved)
    s_event_time(entry, event_time)
    return entry


#: states a holder keeps by default: a few projections of each run in flight, for as
#: many runs as an engine keeps the logs of (``aaa_django.events.tail.MAX_STREAMS``)
MAX_ENTRIES = 65_536


class FoldCache:
    """One shared holder per process: the latest :class:`Folded` per key.

    Keys are ``(store.cache_key, stream, projection name, version)``. Publishing swaps
    one reference under a lock and never moves an entry backwards, so a slow reader
    cannot replace a newer state with its older one. **Bound**: ``max_entries``
    states (least recently used dropped); the engine forgets a run's states when the
    run ends (:meth:`forget_stream`), so a long-lived process holds the runs in flight.

    Self-checks (``check_every``-th read) run when the process is idle: nothing read
    or folded through this holder for ``idle_after`` seconds (the event loop that
    scheduled a check looks every ``idle_poll`` seconds while one is due); with
    ``idle_after=0``, at once, in a task beside the read; with ``background=False``,
    inside the read itself (tests).
    """

    def __init__(
        self,
        *,
        max_entries: int = MAX_ENTRIES,
        check_every: int = 100,
        background: bool = True,
        idle_after: float = IDLE_AFTER,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.max_entries = max_entries
        self.check_every = check_every
        #: run the self-check off the read path (True) or inside it (False)
        self.background = background
        #: seconds without a read or fold before due checks run (0: at once)
        self.idle_after = idle_after
        #: how often a loop with due checks looks whether the process is idle yet
        self.idle_poll = min(idle_after, 1.0)
        self.clock = clock
        #: when this holder last served a read or took a fold (``clock`` time)
        self.active_at = clock()
        #: the due checks, by the event loop that scheduled them (their stores' reads
        #: belong to it), the latest of a key only
        self._due: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, OrderedDict[CacheKey, Check]] = (
            weakref.WeakKeyDictionary()
        )
        #: loops with a look for idleness armed
        self._armed: weakref.WeakSet[asyncio.AbstractEventLoop] = weakref.WeakSet()
        self._running: set[asyncio.Task[object]] = set()
        self._entries: OrderedDict[CacheKey, Folded] = OrderedDict()
        #: (cache_key, stream) -> its keys in ``_entries`` (forgetting a stream is cheap)
        self._streams: dict[tuple[str, str], set[CacheKey]] = {}
        self._lock = threading.Lock()
        self._reads = 0
        # Counters for tests, benchmarks and the admin.
        self.hits = 0
        self.misses = 0
        self.rejected = 0  # a prior that was not a prefix of the reader's view
        self.checks = 0
        self.resets = 0

    def get(self, key: CacheKey) -> Folded | None:
        self.active_at = self.clock()
        with self._lock:
            entry = self._entries.get(key)
            if entry is not None:
                self._entries.move_to_end(key)
            return entry

    def publish(self, key: CacheKey, entry: Folded) -> None:
        self.active_at = self.clock()
        with self._lock:
            old = self._entries.get(key)
            if old is not None and old.cursor > entry.cursor:
                return
            if old is None:
                self._streams.setdefault(_stream_of(key), set()).add(key)
            self._entries[key] = entry
            self._entries.move_to_end(key)
            while len(self._entries) > self.max_entries:
                self._drop(next(iter(self._entries)))

    def _drop(self, key: CacheKey) -> None:
        del self._entries[key]
        of = _stream_of(key)
        keys = self._streams.get(of)
        if keys is not None:
            keys.discard(key)
            if not keys:
                del self._streams[of]

    def reset(self, key: CacheKey | None = None) -> None:
        """Forget one entry (or all): the next read folds from a snapshot or the log."""
        with self._lock:
            if key is None:
                self._entries.clear()
                self._streams.clear()
                for due in self._due.values():
                    due.clear()
            elif key in self._entries:
                self._drop(key)

    def forget_stream(self, cache_key: str, stream: str) -> None:
        """Drop every entry of a stream (it was erased, or its run ended), and its due
        self-checks: a waiting check holds its entry's state."""
        with self._lock:
            for key in self._streams.pop((cache_key, stream), ()):
                self._entries.pop(key, None)
                for due in self._due.values():
                    due.pop(key, None)

    def check_due(self) -> bool:
        """Count a read; True on every ``check_every``-th one."""
        with self._lock:
            self._reads += 1
            return bool(self.check_every) and self._reads % self.check_every == 0

    # -- self-checks, when idle --------------------------------------------------------

    def schedule_check(self, key: CacheKey, check: Check) -> None:
        """Run ``check()`` (a coroutine function) off the read path once the process is
        idle (at once, in a task beside the read, with ``idle_after=0``). Only the
        latest due check of a key is kept."""
        if self.idle_after <= 0:
            self.spawn(check())
            return
        loop = asyncio.get_running_loop()
        with self._lock:
            due = self._due.setdefault(loop, OrderedDict())
            due[key] = check
            due.move_to_end(key)
            while len(due) > self.max_entries:
                due.popitem(last=False)
            arm = loop not in self._armed
            self._armed.add(loop)
        if arm:
            loop.call_later(self.idle_poll, self._look, loop)

    def _look(self, loop: asyncio.AbstractEventLoop) -> None:
        """On ``loop``: run its due checks if the process is idle, else look again."""
        if loop.is_closed():
            return
        if self.clock() - self.active_at >= self.idle_after:
            with self._lock:
                self._armed.discard(loop)
            self.spawn(self.run_due_checks())
        else:
            loop.call_later(self.idle_poll, self._look, loop)

    def has_due(self) -> bool:
        with self._lock:
            return any(self._due.values())

    def due_streams(self) -> set[str]:
        """The streams with a self-check waiting, on any loop."""
        with self._lock:
            return {_stream_of(key)[-1] for due in self._due.values() for key in due}

    async def run_due_checks(self) -> int:
        """Run this loop's due checks, oldest first, while the process stays idle (work
        coming back stops them; the rest wait for the next quiet spell)."""
        loop = asyncio.get_running_loop()
        done = 0
        while True:
            with self._lock:
                due = self._due.get(loop)
                if not due:
                    self._due.pop(loop, None)
                    return done
                if done and self.idle_after > 0 and self.clock() - self.active_at < self.idle_after:
                    if loop not in self._armed:  # busy again: the rest wait
                        self._armed.add(loop)
                        loop.call_later(self.idle_poll, self._look, loop)
                    return done
                _, check = due.popitem(last=False)
            await check()  # (its own read of the log is not through the holder: not work)
            done += 1

    def spawn(self, coro: Coroutine[Any, Any, object]) -> None:
        """Run a self-check off the read path (kept referenced until it ends), in a
        context of its own: it is not part of the delivery whose read made it due (a
        store's per-delivery state, such as the engine's tail, does not follow it)."""
        task = asyncio.get_running_loop().create_task(coro, context=contextvars.Context())
        self._running.add(task)
        task.add_done_callback(self._running.discard)

    async def wait_checks(self) -> None:
        """Wait for the self-checks running in the background (tests, shutdown)."""
        # (the done tasks are dropped here, not only by their done callbacks: awaiting
        # tasks that are all done need not yield to the loop, which would run those
        # callbacks, and on Python 3.12 a loop on them spun without end)
        while True:
            self._running.difference_update([t for t in self._running if t.done()])
            if not self._running:
                return
            await asyncio.wait(list(self._running))

    def __len__(self) -> int:
        return len(self._entries)


#: a fold of events not yet appended, published once they are: ``(holder, key, entry)``
#: (``EventList.pending``)
Publication = tuple[FoldCache, CacheKey, Folded]


def _stream_of(key: CacheKey) -> tuple:
    return key[:2] if isinstance(key, tuple) else (key,)


#: The process's shared holder, used by the engine unless it is given another.
default_cache = FoldCache()
