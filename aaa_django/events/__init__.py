"""The event log: events, stores, projections, snapshots and the incremental holder.

Pure Python: nothing here imports Django, so the engine and the algorithms run on
any store (memory, Django ORM on SQLite or PostgreSQL, Redis).

``InProcessBus`` and ``DistributedBus`` are importable from here as spec 001 lists
them; they live in ``aaa_django.runtime.bus`` and ``aaa_django.celery.bus`` and are loaded
only when asked for (``DistributedBus`` is Django and Celery's: a process that never
asks for it never imports them).
"""

import importlib
from typing import Any

from .cache import FoldCache, Folded, default_cache
from .errors import (
    ClosedStreamError,
    ConcurrencyError,
    EventError,
    InfrastructureError,
    InvalidEventError,
    StoreUnavailable,
)
from .event import Event, check_event, encode_json
from .ids import derive_id, new_id
from .projection import Loaded, Projection, fold, iterate
from .store import (
    ErasesMany,
    EventList,
    EventReader,
    EventStore,
    InMemoryEventStore,
    KnowsRunning,
    ReadsFromSnapshot,
    Snapshot,
    SnapshotStore,
)
from .tail import Staged, Tail, TailCachedStore

#: names spec 001 lists here that live elsewhere -> their module (loaded on first use)
_ELSEWHERE = {"InProcessBus": "aaa_django.runtime.bus", "DistributedBus": "aaa_django.celery.bus"}


def __getattr__(name: str) -> Any:
    module = _ELSEWHERE.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    # By name, not by an import statement: the core imports nothing of the Django layer.
    return getattr(importlib.import_module(module), name)


__all__ = [
    "ClosedStreamError",
    "ConcurrencyError",
    "ErasesMany",
    "KnowsRunning",
    "Event",
    "EventError",
    "EventList",
    "EventReader",
    "EventStore",
    "FoldCache",
    "Folded",
    "InMemoryEventStore",
    "InfrastructureError",
    "InvalidEventError",
    "Loaded",
    "Projection",
    "ReadsFromSnapshot",
    "Snapshot",
    "SnapshotStore",
    "StoreUnavailable",
    "Staged",
    "Tail",
    "TailCachedStore",
    "check_event",
    "default_cache",
    "derive_id",
    "encode_json",
    "fold",
    "iterate",
    "new_id",
]
