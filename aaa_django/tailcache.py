"""``TailCachedStore``: a worker's read cache of the streams it delivers events of.

One delivery makes several reads of its run's stream (the engine's view of the run,
the algorithm's projection, the handler's "is it answered already?"), each a query
and a thread hop. Streams only ever grow at the end, and an event never changes, so a
process can keep the events it has read and ask the database only for what is new:
one query per *sync* instead of one per read.

When is the cached tail current enough? Outside a delivery, never: every read catches
up first (one query for what is new), so the store behaves as any EventStore (it
passes the contract suite). Inside :meth:`TailCachedStore.delivery` a stream is
synced on its first read and stays synced while this delivery appends to it, until
the bus marks it stale: when the run's lock is taken (see
:class:`aaa_django.bus.DistributedBus`). So an algorithm step decides from the log
as it is once it holds the lock, exactly as without the cache. Reads outside the lock (handlers) may miss an event another
worker appended meanwhile; they only decide whether work is still needed, and the
work's result has a deterministic id, so a second result is absorbed.

The cache checks that its tail is a prefix of the log (the id at its last seq), so an
erased and rewritten stream is read again from the start.
"""

from __future__ import annotations

import contextlib
import contextvars
from collections import OrderedDict
from typing import Any, Iterator, Sequence

from .events import Event

#: the streams synced in the current delivery (None: not in a delivery)
_synced: contextvars.ContextVar[set[str] | None] = contextvars.ContextVar("aaa_synced", default=None)


class TailCachedStore:
    """Wraps an EventStore; the same log (``cache_key``), fewer queries."""

    def __init__(self, inner: Any, *, max_streams: int = 512) -> None:
        self.inner = inner
        self.cache_key = inner.cache_key
        self.max_streams = max_streams
        self._logs: OrderedDict[str, list[Event]] = OrderedDict()
        #: queries made to catch up, and reads served without one
        self.syncs = 0
        self.hits = 0

    def __repr__(self) -> str:
        return f"TailCachedStore({self.inner!r})"

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    @staticmethod
    @contextlib.contextmanager
    def delivery() -> Iterator[None]:
        """Within: reads of a synced stream are served from memory."""
        token = _synced.set(set())
        try:
            yield
        finally:
            _synced.reset(token)

    @staticmethod
    def stale(stream: str) -> None:
        """The next read of ``stream`` (in this delivery) catches up first."""
        synced = _synced.get()
        if synced is not None:
            synced.discard(stream)

    def cached(self, stream: str, seq: int) -> Event | None:
        """The event at ``seq`` if this process holds it already (events never change)."""
        log = self._logs.get(stream)
        return log[seq - 1] if log is not None and 0 < seq <= len(log) else None

    async def _log(self, stream: str) -> list[Event]:
        log = self._logs.get(stream)
        synced = _synced.get()
        if log is not None and synced is not None and stream in synced:
            self.hits += 1
            self._logs.move_to_end(stream)
            return log
        self.syncs += 1
        if log:
            more = await self.inner.read(stream, after=len(log) - 1)
            if more and more[0].id == log[-1].id and more[0].seq == len(log):
                log.extend(more[1:])
            else:  # erased (and perhaps written again): start over
                log = list(await self.inner.read(stream))
        else:
            log = list(await self.inner.read(stream))
        self._logs[stream] = log
        self._logs.move_to_end(stream)
        if synced is not None:
            synced.add(stream)
        while len(self._logs) > self.max_streams:
            self._logs.popitem(last=False)
        return log

    async def read(self, stream: str, *, after: int = 0, limit: int | None = None,
                   tenant: str | None = None) -> list[Event]:
        if tenant is not None:
            return await self.inner.read(stream, after=after, limit=limit, tenant=tenant)
        log = await self._log(stream)
        start = max(after, 0)
        return log[start:] if limit is None else log[start:start + max(limit, 0)]

    async def append(self, events: Sequence[Event], *, expected_seq: int | None = None) -> list[Event]:
        stored = await self.inner.append(events, expected_seq=expected_seq)
        if stored:
            stream = stored[0].stream
            log = self._logs.get(stream)
            if log is not None and stored[0].seq == len(log) + 1:
                log.extend(stored)  # nobody wrote in between: still a prefix, caught up
            else:
                self.stale(stream)
        return stored

    async def erase(self, stream: str) -> int:
        self._logs.pop(stream, None)
        self.stale(stream)
        return await self.inner.erase(stream)

    async def head(self, stream: str) -> tuple[int, str] | None:
        return await self.inner.head(stream)

    async def load_snapshot(self, stream: str, name: str, version: int) -> Any:
        return await self.inner.load_snapshot(stream, name, version)

    async def save_snapshot(self, snapshot: Any) -> bool:
        return await self.inner.save_snapshot(snapshot)

    async def streams(self) -> list[str]:
        return await self.inner.streams()
