"""A read view of an event store whose events come back hydrated.

Projections fold full payloads, never claim stubs; this view gives them that without
the stores knowing about blobs. It shares the store's ``cache_key``: it is the same
log, so the in-process holder may share states. The engine reads through one (its
``view``), and so do the REST API and the admin (:mod:`aaa_django.reading`).
"""

from __future__ import annotations

from typing import Any, Awaitable, Callable

from aaa_django.data import is_claimed
from aaa_django.events import Event, EventList, EventStore, InfrastructureError, StoreUnavailable

from .retry import transient

__all__ = ["HydratedView", "StoreUnavailable"]


class HydratedView:
    """``store`` with ``read`` returning hydrated events (``hydrate`` restores one
    event's claim-checked payload); the rest delegated. ``unavailable``: a failed read
    raises :class:`StoreUnavailable` (the engine's view); else the error itself."""

    def __init__(self, store: EventStore, hydrate: Callable[[Event], Awaitable[Event]], *,
                 unavailable: bool = False) -> None:
        self._store = store
        self._hydrate = hydrate
        self._unavailable = unavailable
        self.cache_key = store.cache_key

    async def read(self, stream: str, **kwargs: Any) -> list[Event]:
        try:
            events = await self._store.read(stream, **kwargs)
            if not any(is_claimed(e.data) for e in events):
                return events
            out = EventList([await self._hydrate(e) for e in events])
            out.committed = not isinstance(events, EventList) or events.committed
            return out
        except InfrastructureError:
            raise  # translated by the store's adapter already
        except Exception as exc:  # a store no adapter translated, a missing blob...
            if not self._unavailable:
                raise
            raise StoreUnavailable(f"reading {stream} failed: {type(exc).__name__}: {exc}",
                                   transient=transient(exc)) from exc

    def __getattr__(self, name: str) -> Any:
        return getattr(self._store, name)
