"""The in-process holder of folded states (incremental folds from a high-water mark).

Each entry is an immutable :class:`Folded` value: the cursor (seq of the last folded
event), the id of the event at the cursor, and the state. A reader advances it by
folding only the events after the cursor, after proving the entry is a prefix of its
own view of the log (the same event id at the cursor). The log stays the only fact:
the holder is a cache that any reader can rebuild, and a self-check every
``check_every`` reads compares it with the whole-log fold.
"""

from __future__ import annotations

import asyncio
import contextvars
import logging
import threading
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any, Callable, Coroutine

#: a holder entry's key: (the store's cache_key, stream, projection key, version)
CacheKey = tuple[str, str, str, int]
#: a self-check the holder runs later
Check = Callable[[], Coroutine[Any, Any, object]]

log = logging.getLogger("aaa_django.events")


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
    event_time: Any = None


# Each field's slot, set directly (as ``events.event.stored_event`` does): a frozen
# dataclass's __init__ sets every field through object.__setattr__; a holder entry is
# made at every read that folds something.
_SET = tuple(Folded.__dict__[name].__set__ for name in
             ("cursor", "event_id", "state", "unsaved", "event_time"))
_new = object.__new__


def folded(cursor: int, event_id: str, state: Any, unsaved: int, event_time: Any) -> Folded:
    """``Folded(cursor, event_id, state, unsaved, event_time)``, in less time."""
    entry = _new(Folded)
    s_cursor, s_event_id, s_state, s_unsaved, s_event_time = _SET
    s_cursor(entry, cursor)
    s_event_id(entry, event_id)
    s_state(entry, state)
    s_unsaved(entry, unsaved)
    s_event_time(entry, event_time)
    return entry


class FoldCache:
    """One shared holder per process: the latest :class:`Folded` per key.

    Keys are ``(store.cache_key, stream, projection name, version)``. Publishing swaps
    one reference under a lock and never moves an entry backwards, so a slow reader
    cannot replace a newer state with its older one. **Bound**: ``max_entries``
    states (least recently used dropped); the engine forgets a run's states when the
    run ends (:meth:`forget_stream`), so a long-lived process holds the runs in flight.
    """

    def __init__(
        self, *, max_entries: int = 10_000, check_every: int = 100, background: bool = True
    ) -> None:
        self.max_entries = max_entries
        self.check_every = check_every
        #: run the self-check in a task beside the read (True) or inside it (False)
        self.background = background
        #: True when an owner of the loop (the in-process bus) runs due checks while it
        #: is idle: background checks then wait for :meth:`run_due_checks` instead of
        #: competing with the reads of a busy process (spec ADR: "only when idle").
        self.deferred = False
        self._due: OrderedDict[CacheKey, Check] = OrderedDict()
        self._tasks: set[Any] = set()
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
        with self._lock:
            entry = self._entries.get(key)
            if entry is not None:
                self._entries.move_to_end(key)
            return entry

    def publish(self, key: CacheKey, entry: Folded) -> None:
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
            elif key in self._entries:
                self._drop(key)

    def forget_stream(self, cache_key: str, stream: str) -> None:
        """Drop every entry of a stream (it was erased, or its run ended)."""
        with self._lock:
            for key in self._streams.pop((cache_key, stream), ()):
                self._entries.pop(key, None)

    def check_due(self) -> bool:
        """Count a read; True on every ``check_every``-th one."""
        with self._lock:
            self._reads += 1
            return bool(self.check_every) and self._reads % self.check_every == 0

    def schedule_check(self, key: CacheKey, check: Check) -> None:
        """Run ``check()`` (a coroutine function) off the read path: now, in a task
        beside the read, or, when ``deferred``, at the next :meth:`run_due_checks`.
        Only the latest due check of a key is kept."""
        if not self.deferred:
            self.spawn(check())
            return
        with self._lock:
            self._due[key] = check
            self._due.move_to_end(key)
            while len(self._due) > self.max_entries:
                self._due.popitem(last=False)

    def has_due(self) -> bool:
        return bool(self._due)

    async def run_due_checks(self) -> int:
        """Run the deferred checks (the bus calls this when it is idle)."""
        done = 0
        while True:
            with self._lock:
                if not self._due:
                    return done
                _, check = self._due.popitem(last=False)
            await check()
            done += 1

    def spawn(self, coro: Any) -> None:
        """Run a self-check off the read path (kept referenced until it ends), in a
        context of its own: it is not part of the delivery whose read made it due (a
        store's per-delivery state, such as the engine's tail, does not follow it)."""
        task = asyncio.get_running_loop().create_task(coro, context=contextvars.Context())
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def wait_checks(self) -> None:
        """Wait for the self-checks running in the background (tests, shutdown)."""
        while self._tasks:
            await asyncio.gather(*list(self._tasks), return_exceptions=True)

    def __len__(self) -> int:
        return len(self._entries)


def _stream_of(key: CacheKey) -> tuple:
    return key[:2] if isinstance(key, tuple) else (key,)


#: The process's shared holder, used by the engine unless it is given another.
default_cache = FoldCache()
