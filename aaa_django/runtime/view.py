"""A read view of an event store whose events come back hydrated.

Projections fold full payloads, never claim stubs; this view gives them that without
the stores knowing about blobs. It shares the store's ``cache_key``: it is the same
log, so the in-process holder may share states. The engine reads through one (its
``view``), and so do the REST API and the admin (:mod:`aaa_django.reading`).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence

from aaa_django.data import is_claimed
from aaa_django.events import (
    Event,
    EventList,
    EventStore,
    InfrastructureError,
    ReadsFromSnapshot,
    Snapshot,
    StoreUnavailable,
)

from .retry import transient

__all__ = ["HydratedView", "StoreUnavailable"]


class HydratedView:
    """``store`` with ``read`` returning hydrated events (``hydrate`` restores one
    event's claim-checked payload); the rest of the EventStore protocol delegated, and
    nothing else (what ``store`` offers beyond it is asked of ``store`` itself). ``unavailable``: a failed read
    raises :class:`StoreUnavailable` (the engine's view); else the error itself."""

    def __init__(
        self, store: EventStore, hydrate: Callable[[Event], Awaitable[Event]], *, unavailable: bool = False
    ) -> None:
        self._store = store
        self._hydrate = hydrate
        self._unavailable = unavailable
        self.cache_key = store.cache_key
        #: the store, when it reads a snapshot and the log after it at once
        self._from_snapshot = store if isinstance(store, ReadsFromSnapshot) else None

    async def read(
        self, stream: str, *, after: int = 0, limit: int | None = None, tenant: str | None = None
    ) -> list[Event]:
        try:
            return await self._hydrated(await self._store.read(stream, after=after, limit=limit, tenant=tenant))
        except InfrastructureError:
            raise  # translated by the store's adapter already
        except Exception as exc:  # a store no adapter translated, a missing blob...
            if not self._unavailable:
                raise
            raise StoreUnavailable(
                f"reading {stream} failed: {type(exc).__name__}: {exc}", transient=transient(exc)
            ) from exc

    async def read_from_snapshot(self, stream: str, name: str, version: int) -> tuple[Snapshot | None, list[Event]]:
        """The snapshot and the log from its seq on, hydrated (``ReadsFromSnapshot``:
        one call of a store that reads them at once, else two). A failure is the
        error itself: a projection then replays, through :meth:`read`."""
        if self._from_snapshot is not None:
            snap, events = await self._from_snapshot.read_from_snapshot(stream, name, version)
        else:
            snap = await self._store.load_snapshot(stream, name, version)
            events = [] if snap is None else await self._store.read(stream, after=snap.seq - 1)
        return snap, await self._hydrated(events)

    async def _hydrated(self, events: list[Event]) -> list[Event]:
        if not any(is_claimed(e.data) for e in events):
            return events
        out = EventList([await self._hydrate(e) for e in events])
        if isinstance(events, EventList):
            out.committed, out.pending = events.committed, events.pending
        return out

    # -- the rest of the EventStore protocol, forwarded by name (declared, so that a
    # Protocol check sees it on every Python: 3.12 looks attributes up statically) --

    async def append(self, events: Sequence[Event], *, expected_seq: int | None = None) -> list[Event]:
        return await self._store.append(events, expected_seq=expected_seq)

    async def head(self, stream: str) -> tuple[int, str] | None:
        return await self._store.head(stream)

    async def load_snapshot(self, stream: str, name: str, version: int) -> Snapshot | None:
        return await self._store.load_snapshot(stream, name, version)

    async def save_snapshot(self, snapshot: Snapshot) -> bool:
        return await self._store.save_snapshot(snapshot)

    async def erase(self, stream: str) -> int:
        return await self._store.erase(stream)

    async def streams(self) -> list[str]:
        return await self._store.streams()
