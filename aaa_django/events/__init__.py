"""The event log: events, stores, projections, snapshots and the incremental holder.

Pure Python: nothing here imports Django, so the engine and the algorithms run on
any store (memory, Django ORM on SQLite or PostgreSQL, Redis).
"""

from .cache import FoldCache, Folded, default_cache
from .errors import ConcurrencyError, EventError, InvalidEventError
from .event import Event, check_event, encode_json
from .ids import derive_id, new_id
from .projection import Loaded, Projection, fold, iterate
from .store import ErasesMany, EventStore, InMemoryEventStore, Snapshot
from .tail import Tail, TailCachedStore

__all__ = [
    "ConcurrencyError",
    "ErasesMany",
    "Event",
    "EventError",
    "EventStore",
    "FoldCache",
    "Folded",
    "InMemoryEventStore",
    "InvalidEventError",
    "Loaded",
    "Projection",
    "Snapshot",
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
