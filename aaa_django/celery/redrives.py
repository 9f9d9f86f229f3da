"""The sweeper's ledger: when it last re-drove each run, so that a run it re-drove has
time to move before it is re-driven again.

A run looks stalled when it has appended nothing for ``stall_after`` seconds. When its
messages were lost, a re-drive brings it back; when they are only queued behind a
backlog, re-driving it on every sweep adds the same deliveries to the queue that made
it look stalled, again and again (411 re-drives for 42 runs in the fault test of
200 runs in flight, before this ledger). So the sweeper records each re-drive and
leaves a run it re-drove alone until the re-drive has had its time (:func:`due_again`):
``stall_after`` after the first, then as long as the run had been idle when it was
re-driven (the wait doubles while the run does not move), at most
``BACKOFF_LIMIT * stall_after``. A run that appends anything after a re-drive is
judged by its idle time alone again. A re-drive that was itself lost (its messages
dropped, a broker restarted) is followed by another one after that wait: recovery
needs no human.

Where the ledger lives:

- a store on the site's database (``DjangoEventStore``, ``PgEventStore``): two
  columns of the run's index row, ``RunRecord.redriven_at`` and ``redrives`` (how
  many times the sweeper re-drove it, shown on the run's admin page). Durable: a
  Redis restart without persistence changes nothing; a re-drive is claimed with a
  conditional UPDATE on the time read, so two sweeps at once re-drive a run once. A
  run without an index row (not indexed yet, or rebuilt by ``aaa_reindex``, which
  leaves the columns empty) is re-driven as if never before: nothing here can hold
  a run back for good;
- any other store (memory, Redis): this process's memory (lost with the process:
  then the next sweep re-drives as if for the first time, the behaviour without a
  ledger).
"""

from __future__ import annotations

import weakref
from collections.abc import Iterable
from typing import Protocol

from asgiref.sync import sync_to_async

from aaa_django.events import EventStore
from aaa_django.store import DjangoEventStore
from aaa_django.store.redrives import claim_redrive, redriven

#: a run that does not move after re-drives waits at most this many ``stall_after``
#: between two of them
BACKOFF_LIMIT = 8


def due_again(last: float, redriven_at: float | None, now: float, stall_after: float) -> bool:
    """May a run whose newest event is from ``last`` (epoch seconds), idle for
    ``stall_after`` at least, be re-driven at ``now``, when the sweeper last re-drove
    it at ``redriven_at`` (None: never)?

    Yes if it was never re-driven, or has moved since (an event newer than the
    re-drive: its idle time alone decides). Otherwise once the re-drive has had as
    long as the run had been idle when it was re-driven (``stall_after`` at least,
    ``BACKOFF_LIMIT * stall_after`` at most): after re-drives at ``S``, ``2S``,
    ``4S``, ``8S`` of idleness, one every ``8S``."""
    if redriven_at is None or last > redriven_at:
        return True
    wait = min(max(stall_after, redriven_at - last), BACKOFF_LIMIT * stall_after)
    return now - redriven_at >= wait


class Ledger(Protocol):
    async def seen(self, run_ids: list[str]) -> dict[str, float]:
        """Run id -> when the sweeper last re-drove it, for those of ``run_ids`` it has."""
        ...

    async def claim(self, run_id: str, previous: float | None, now: float) -> bool:
        """Record a re-drive of ``run_id`` at ``now``, unless someone recorded another
        since ``previous`` (the time :meth:`seen` gave, None for none). True: re-drive it."""
        ...


def ledger_of(store: EventStore) -> Ledger:
    """The ledger for runs in ``store`` (an engine's ``base_store``)."""
    if isinstance(store, DjangoEventStore):
        return DatabaseLedger(store.using)
    return MemoryLedger.of(store)


class DatabaseLedger:
    """The ledger in the run index (``aaa_run.redriven_at``, ``aaa_run.redrives``:
    :mod:`aaa_django.store.redrives`)."""

    def __init__(self, using: str) -> None:
        self.using = using

    def seen_sync(self, run_ids: list[str]) -> dict[str, float]:
        return redriven(self.using, run_ids)

    def claim_sync(self, run_id: str, previous: float | None, now: float) -> bool:
        return claim_redrive(self.using, run_id, previous, now)

    async def seen(self, run_ids: list[str]) -> dict[str, float]:
        return await sync_to_async(self.seen_sync, thread_sensitive=True)(run_ids)

    async def claim(self, run_id: str, previous: float | None, now: float) -> bool:
        return await sync_to_async(self.claim_sync, thread_sensitive=True)(run_id, previous, now)


class MemoryLedger:
    """The ledger of one store, in this process's memory."""

    _ledgers: weakref.WeakKeyDictionary[EventStore, MemoryLedger] = weakref.WeakKeyDictionary()

    def __init__(self) -> None:
        self.times: dict[str, float] = {}
        self.counts: dict[str, int] = {}

    @classmethod
    def of(cls, store: EventStore) -> MemoryLedger:
        try:
            ledger = cls._ledgers.get(store)
            if ledger is None:
                ledger = cls._ledgers[store] = cls()
            return ledger
        except TypeError:  # a store that cannot be weakly referenced: a ledger per sweep
            return cls()

    def keep(self, run_ids: Iterable[str]) -> None:
        """Forget the runs not in ``run_ids`` (the unfinished ones)."""
        keep = set(run_ids)
        for run_id in [r for r in self.times if r not in keep]:
            del self.times[run_id]
            self.counts.pop(run_id, None)

    async def seen(self, run_ids: list[str]) -> dict[str, float]:
        return {r: self.times[r] for r in run_ids if r in self.times}

    async def claim(self, run_id: str, previous: float | None, now: float) -> bool:
        if self.times.get(run_id) != previous:
            return False
        self.times[run_id] = now
        self.counts[run_id] = self.counts.get(run_id, 0) + 1
        return True
