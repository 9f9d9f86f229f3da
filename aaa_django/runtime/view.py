"""A read view of the event store whose events come back hydrated.

Projections of algorithms and handlers fold full payloads, never claim stubs; this
view gives them that without the stores knowing about blobs. It shares the store's
``cache_key``: it is the same log, so the in-process holder may share states.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from aaa_django.data import is_claimed
from aaa_django.events import Event

if TYPE_CHECKING:  # pragma: no cover
    from .engine import Engine


class StoreUnavailable(Exception):
    """Reading the log (or a claimed payload) failed: an infrastructure problem.

    Raised through an algorithm's step so the engine does not mistake it for the
    algorithm's own failure: the delivery fails and is retried, the run goes on.
    """


class HydratedView:
    """``engine.store`` with ``read`` returning hydrated events; the rest delegated."""

    def __init__(self, engine: "Engine") -> None:
        self._engine = engine
        self._store = engine.store
        self.cache_key = engine.store.cache_key

    async def read(self, stream: str, **kwargs: Any) -> list[Event]:
        try:
            events = await self._store.read(stream, **kwargs)
            if any(is_claimed(e.data) for e in events):
                events = [await self._engine.hydrate(e) for e in events]
        except Exception as exc:
            raise StoreUnavailable(f"reading {stream} failed: {type(exc).__name__}: {exc}") from exc
        return events

    def __getattr__(self, name: str) -> Any:
        return getattr(self._store, name)
