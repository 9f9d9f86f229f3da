"""Retention: erase ended runs once they are old enough, and sweep orphaned blobs.

A policy keeps runs by outcome, in days after they ended (``AAA["RETENTION"]``):

    AAA = {"RETENTION": {"success": 30, "failed": 90, "*": 365}}

``"*"`` is every outcome not named; an outcome with no entry (and no ``"*"``) is kept
forever, as is every run under the default ``{}``. What is erased, and how:

- **Never a running run.** Only runs whose log holds ``aaa.run.completed`` (checked in
  the log itself, not only in the run index) and whose index row says so.
- **A run tree goes as one.** Child runs are erased with their root run, by the root's
  outcome and age, and only when every run of the tree has ended; a child whose
  parent is gone already counts as a root.
- **In batches.** ``AAA["RETENTION_BATCH"]`` trees per transaction, through
  :meth:`~aaa_django.runtime.Engine.erase_runs` (events, snapshots, index rows, then
  blobs); on PostgreSQL a ``VACUUM (ANALYZE)`` follows a sweep that erased anything,
  so the space is reused at once (``docs/retention.md`` measures why that is enough).

The **orphan sweep** removes blobs no event refers to: those of a namespace whose
stream is gone (a crash between erasing a log and its blobs), and those of a live
stream that no event of it names (a crash between writing a blob and appending its
event). A blob younger than ``AAA["ORPHAN_GRACE"]`` seconds is never touched: its
event may be on its way.

Run both with ``python manage.py aaa_retain [--dry-run]`` or the Celery task
``aaa.retain`` (:data:`BEAT_SCHEDULE`).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any, Protocol

from asgiref.sync import async_to_sync, sync_to_async

from aaa_django.conf import aaa_settings
from aaa_django.data import BlobInventory
from aaa_django.data.keys import namespace_segment, segment_namespace
from aaa_django.runtime import Engine, InProcessBus
from aaa_django.runtime.outcome import OUTCOMES
from aaa_django.store import DjangoEventStore
from aaa_django.store.retention import (
    all_streams,
    count_events,
    due_trees,
    referenced_blobs,
    streams_with_events,
    vacuum_tables,
)

from .engines import build_engine

log = logging.getLogger("aaa_django.retention")


class Advances(Protocol):
    """A progress bar (:class:`~aaa_django.management.progress.Progress`): ``n`` more done."""

    def advance(self, n: int = 1) -> None: ...


#: what a site puts in CELERY_BEAT_SCHEDULE to apply the policy every hour (on the
#: Celery app's default queue, which ``celery -A proj worker`` takes)
BEAT_SCHEDULE = {
    "aaa-retain": {"task": "aaa.retain", "schedule": 3600.0},
}
#: every outcome not named in a policy
OTHERS = "*"
#: on PostgreSQL, a sweep that erased at least this many events vacuums the tables
VACUUM_AFTER = 1


@dataclass(frozen=True)
class Policy:
    """Days to keep an ended run, by outcome; ``"*"``: the outcomes not named; an
    outcome with neither is kept forever."""

    days: Mapping[str, float | None] = field(default_factory=dict)

    @classmethod
    def from_settings(cls) -> Policy:
        return cls(dict(aaa_settings()["RETENTION"] or {}))

    def keep(self, outcome: str) -> timedelta | None:
        """How long a run that ended with ``outcome`` is kept (None: forever)."""
        days = self.days[outcome] if outcome in self.days else self.days.get(OTHERS)
        return None if days is None else timedelta(days=days)

    def __bool__(self) -> bool:
        return any(v is not None for v in self.days.values())


@dataclass
class RetentionReport:
    """What one pass erased (or would have, in a dry run)."""

    dry_run: bool = False
    #: runs erased, children included, oldest tree first
    runs: list[str] = field(default_factory=list)
    events: int = 0
    #: due root runs kept because a run of their tree has not ended
    held: list[str] = field(default_factory=list)
    #: blobs no event refers to, as (namespace or segment, sha256)
    orphans: list[tuple[str, str]] = field(default_factory=list)
    vacuumed: bool = False

    def summary(self) -> dict[str, int | bool]:
        return {
            "dry_run": self.dry_run,
            "runs": len(self.runs),
            "events": self.events,
            "held": len(self.held),
            "orphans": len(self.orphans),
            "vacuumed": self.vacuumed,
        }


async def apply_retention(
    engine: Engine,
    *,
    policy: Policy | None = None,
    now: datetime | None = None,
    dry_run: bool = False,
    batch: int | None = None,
    limit: int | None = None,
    orphans: bool = True,
    grace: float | None = None,
    vacuum: bool = True,
    progress: Advances | None = None,
) -> RetentionReport:
    """Erase the runs ``policy`` (default: the settings') says are due, then sweep
    orphaned blobs. ``engine`` must be over a :class:`~aaa_django.store.DjangoEventStore`
    (``build_engine()``); its blob store is the one swept. ``limit`` caps the run
    trees erased in this pass (the rest wait for the next); ``now`` is for tests.
    ``progress``: an :class:`~aaa_django.management.progress.Progress`, advanced by the
    runs erased (found due, in a dry run) at each batch."""
    using = database_of(engine)
    policy = Policy.from_settings() if policy is None else policy
    now = datetime.now(UTC) if now is None else now
    batch = int(aaa_settings()["RETENTION_BATCH"] if batch is None else batch)
    report = RetentionReport(dry_run=dry_run)
    after: tuple[datetime, str] | None = None  # the last root looked at: a keyset cursor
    roots = 0
    while policy and (limit is None or roots < limit):
        room = batch if limit is None else min(batch, limit - roots)
        trees, held, after = await sync_to_async(due_trees)(using, cutoffs(policy, now), room, after)
        report.held.extend(held)
        if after is None:
            break
        roots += len(trees)
        runs = [run for tree in trees for run in tree]
        report.runs.extend(runs)
        if dry_run:
            report.events += await sync_to_async(count_events)(using, runs)
        elif runs:
            report.events += await engine.erase_runs(runs)
            log.info("retention: erased %s runs (%s events so far)", len(report.runs), report.events)
        if progress is not None:
            progress.advance(len(runs))
    if orphans and engine.blobs is not None:
        report.orphans = await sweep_orphans(engine, now=now, grace=grace, dry_run=dry_run)
    if vacuum and not dry_run and report.events >= VACUUM_AFTER:
        report.vacuumed = await sync_to_async(vacuum_tables)(using)
    return report


# -- which runs are due ---------------------------------------------------------------


def database_of(engine: Engine) -> str:
    """The database alias of ``engine``'s store: retention erases from the site's
    database (an engine of :func:`~aaa_django.site.engines.build_engine`)."""
    store = engine.base_store
    if not isinstance(store, DjangoEventStore):
        raise TypeError(f"retention works on the site's database store, not on {store!r}: use build_engine()")
    return store.using


def cutoffs(policy: Policy, now: datetime) -> dict[str, datetime]:
    """Outcome -> the time before which a run that ended so is due (the outcomes the
    policy keeps for a while; the others are kept forever)."""
    found: dict[str, datetime] = {}
    for outcome in OUTCOMES:
        keep = policy.keep(outcome)
        if keep is not None:
            found[outcome] = now - keep
    return found


# -- orphaned blobs -------------------------------------------------------------------


async def sweep_orphans(
    engine: Engine, *, now: datetime | None = None, grace: float | None = None, dry_run: bool = False
) -> list[tuple[str, str]]:
    """Remove the blobs of ``engine.blobs`` that no event refers to and that are older
    than ``grace`` seconds (default ``AAA["ORPHAN_GRACE"]``); return them as
    ``(namespace, sha256)`` (the segment where the namespace cannot be told)."""
    blobs = engine.blobs
    if not isinstance(blobs, BlobInventory):
        log.warning("retention: %r cannot list its blobs; no orphan sweep", blobs)
        return []
    using = database_of(engine)
    grace = float(aaa_settings()["ORPHAN_GRACE"] if grace is None else grace)
    cutoff = (time.time() if now is None else now.timestamp()) - grace
    found: list[tuple[str, str]] = []
    segments = await asyncio.to_thread(blobs.segments)
    live = await sync_to_async(_live_streams)(using, segments)
    for segment in segments:
        stream = live.get(segment)
        referenced = await sync_to_async(referenced_blobs)(using, stream) if stream is not None else set()
        hashes = await asyncio.to_thread(blobs.hashes, segment)
        for sha in hashes:
            if sha in referenced:
                continue
            written = await asyncio.to_thread(blobs.written_at, segment, sha)
            if written is None or written > cutoff:
                continue  # young (or gone meanwhile): its event may be on its way
            name = segment_namespace(segment)
            found.append((name if name is not None else segment, sha))
            if not dry_run:
                await asyncio.to_thread(blobs.discard, segment, sha)
    if found:
        log.info("retention: %s %s orphaned blobs", "found" if dry_run else "removed", len(found))
    return found


def _live_streams(using: str, segments: list[str]) -> dict[str, str]:
    """Segment -> stream, for the segments whose stream has events."""
    names = {seg: segment_namespace(seg) for seg in segments}
    streams = streams_with_events(using, [n for n in names.values() if n is not None])
    live = {seg: name for seg, name in names.items() if name is not None and name in streams}
    if any(name is None for name in names.values()):
        # A long namespace is stored under its hash: compare with every stream's.
        hashed = {namespace_segment(s): s for s in all_streams(using)}
        live.update({seg: hashed[seg] for seg, name in names.items() if name is None and seg in hashed})
    return live


#: the keys a policy may name
KEYS = (*OUTCOMES, OTHERS)


# -- entry points ---------------------------------------------------------------------


def retain(using: str = "default", **options: Any) -> RetentionReport:
    """Apply the settings' policy and sweep orphans on database ``using``, from sync
    code (the command, the Celery task); ``options`` go to :func:`apply_retention`.
    Its own engine, on the in-process bus: erasing delivers nothing."""

    async def run() -> RetentionReport:
        async with build_engine(using=using, bus=InProcessBus()) as engine:
            return await apply_retention(engine, **options)

    return async_to_sync(run)()
