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
import json
import logging
import time
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from typing import Any, Iterable, Mapping

from asgiref.sync import async_to_sync, sync_to_async
from django.db import connections
from django.db.models import Exists, OuterRef, Q

from aaa_django.conf import aaa_settings
from aaa_django.data import BlobInventory
from aaa_django.data.keys import namespace_segment, segment_namespace
from aaa_django.events.event import decode_blobs
from aaa_django.models import EventRecord, RunRecord
from aaa_django.runtime import InProcessBus
from aaa_django.runtime.event_types import completion_id
from aaa_django.runtime.outcome import OUTCOMES
from aaa_django.store import DjangoEventStore

from .engines import build_engine

log = logging.getLogger("aaa_django.retention")

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
    def from_settings(cls) -> "Policy":
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

    def summary(self) -> dict[str, Any]:
        return {"dry_run": self.dry_run, "runs": len(self.runs), "events": self.events,
                "held": len(self.held), "orphans": len(self.orphans), "vacuumed": self.vacuumed}


async def apply_retention(
    engine: Any,
    *,
    policy: Policy | None = None,
    now: datetime | None = None,
    dry_run: bool = False,
    batch: int | None = None,
    limit: int | None = None,
    orphans: bool = True,
    grace: float | None = None,
    vacuum: bool = True,
    progress: Any = None,
) -> RetentionReport:
    """Erase the runs ``policy`` (default: the settings') says are due, then sweep
    orphaned blobs. ``engine`` must be over a :class:`~aaa_django.store.DjangoEventStore`
    (``build_engine()``); its blob store is the one swept. ``limit`` caps the run
    trees erased in this pass (the rest wait for the next); ``now`` is for tests.
    ``progress``: an :class:`~aaa_django.management.progress.Progress`, advanced by the
    runs erased (found due, in a dry run) at each batch."""
    using = database_of(engine)
    policy = Policy.from_settings() if policy is None else policy
    now = datetime.now(timezone.utc) if now is None else now
    batch = int(aaa_settings()["RETENTION_BATCH"] if batch is None else batch)
    report = RetentionReport(dry_run=dry_run)
    after: tuple[datetime, str] | None = None  # the last root looked at: a keyset cursor
    roots = 0
    while policy and (limit is None or roots < limit):
        room = batch if limit is None else min(batch, limit - roots)
        trees, held, after = await sync_to_async(due_trees)(using, policy, now, room, after)
        report.held.extend(held)
        if after is None:
            break
        roots += len(trees)
        runs = [run for tree in trees for run in tree]
        report.runs.extend(runs)
        if dry_run:
            report.events += await sync_to_async(_count_events)(using, runs)
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


def database_of(engine: Any) -> str:
    """The database alias of ``engine``'s store: retention erases from the site's
    database (an engine of :func:`~aaa_django.site.engines.build_engine`)."""
    store = engine.base_store
    if not isinstance(store, DjangoEventStore):
        raise TypeError(f"retention works on the site's database store, not on {store!r}: "
                        "use build_engine()")
    return store.using


def due_roots(using: str, policy: Policy, now: datetime, limit: int,
              after: tuple[datetime, str] | None = None) -> list[tuple[str, datetime]]:
    """Up to ``limit`` ended root runs the policy says are due, as (id, ended_at),
    oldest first, after the root ``after`` (its ended_at and id) if given."""
    rows = RunRecord.objects.using(using)
    due = rows.none()
    for outcome in OUTCOMES:
        keep = policy.keep(outcome)
        if keep is not None:
            due = due | rows.filter(status="completed", outcome=outcome, ended_at__lt=now - keep)
    root = ~Exists(rows.filter(run_id=OuterRef("parent")))  # a child goes with its root
    due = due.filter(root)
    if after is not None:
        at, run_id = after
        due = due.filter(Q(ended_at__gt=at) | Q(ended_at=at, run_id__gt=run_id))
    return list(due.order_by("ended_at", "run_id").values_list("run_id", "ended_at")[:limit])


def due_trees(using: str, policy: Policy, now: datetime, limit: int,
              after: tuple[datetime, str] | None = None,
              ) -> tuple[list[list[str]], list[str], tuple[datetime, str] | None]:
    """Of the next ``limit`` due roots (after ``after``): the run trees (root first)
    whose every run has ended, the roots held back because one of their runs has not,
    and the cursor of the last root (None: there were none). A few queries per batch,
    whatever its size: one per tree level, one per 500 runs."""
    due = due_roots(using, policy, now, limit, after)
    if not due:
        return [], [], None
    roots = [run for run, _ in due]
    trees = {root: [root] for root in roots}
    root_of = {root: root for root in roots}
    rows = RunRecord.objects.using(using)
    frontier = list(roots)
    while frontier:
        children = []
        for chunk in _chunks(frontier):
            children += rows.filter(parent__in=chunk).values_list("run_id", "parent")
        frontier = []
        for child, parent in children:
            if child not in root_of:  # a cycle would be a bug; never loop on one
                root_of[child] = root_of[parent]
                trees[root_of[parent]].append(child)
                frontier.append(child)
    ended = _ended(using, list(root_of))
    complete = [tree for tree in trees.values() if all(run in ended for run in tree)]
    held = [root for root, tree in trees.items() if not all(run in ended for run in tree)]
    return complete, held, (due[-1][1], due[-1][0])


def _ended(using: str, runs: list[str]) -> set[str]:
    """Which runs' logs hold their completion (the log is the fact; the index row could
    lag): lookups by primary key."""
    ended: set[str] = set()
    events = EventRecord.objects.using(using)
    for chunk in _chunks(runs):
        ids = [completion_id(r) for r in chunk]
        ended.update(events.filter(pk__in=ids).values_list("stream", flat=True))
    return ended


def _chunks(items: list[str], size: int = 500) -> Iterable[list[str]]:
    for i in range(0, len(items), size):
        yield items[i : i + size]


def _count_events(using: str, runs: list[str]) -> int:
    return EventRecord.objects.using(using).filter(stream__in=runs).count()


# -- orphaned blobs -------------------------------------------------------------------


async def sweep_orphans(engine: Any, *, now: datetime | None = None, grace: float | None = None,
                        dry_run: bool = False) -> list[tuple[str, str]]:
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
        referenced = await sync_to_async(_referenced)(using, stream) if stream is not None else set()
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
    spelled = [n for n in names.values() if n is not None]
    streams: set[str] = set()
    events = EventRecord.objects.using(using)
    for chunk in _chunks(spelled):
        streams.update(events.filter(stream__in=chunk).values_list("stream", flat=True).distinct())
    live = {seg: name for seg, name in names.items() if name in streams}
    if any(name is None for name in names.values()):
        # A long namespace is stored under its hash: compare with every stream's.
        hashed = {namespace_segment(s): s for s in all_streams(using)}
        live.update({seg: hashed[seg] for seg, name in names.items()
                     if name is None and seg in hashed})
    return live


def _referenced(using: str, stream: str) -> set[str]:
    """The hashes of the blobs the stream's events refer to (its rows with blobs)."""
    rows = (EventRecord.objects.using(using).filter(stream=stream).exclude(blobs=[])
            .values_list("blobs", flat=True))
    return {ref.sha256 for raw in rows for ref in decode_blobs(_json(raw))}


def _json(raw: Any) -> Any:
    return json.loads(raw) if isinstance(raw, str) else raw


def all_streams(using: str) -> list[str]:
    """Every stream of the log, by a walk of the (stream, seq) index: one probe per
    stream, not a scan of every event (a loose index scan)."""
    sql = (
        "WITH RECURSIVE s(stream) AS ("
        " SELECT MIN(stream) FROM aaa_event"
        " UNION ALL"
        " SELECT (SELECT MIN(e.stream) FROM aaa_event e WHERE e.stream > s.stream)"
        " FROM s WHERE s.stream IS NOT NULL"
        ") SELECT stream FROM s WHERE stream IS NOT NULL"
    )
    with connections[using].cursor() as cur:
        cur.execute(sql)
        return [row[0] for row in cur.fetchall()]


# -- space ----------------------------------------------------------------------------


def vacuum_tables(using: str) -> bool:
    """``VACUUM (ANALYZE)`` the log's tables on PostgreSQL (the space of erased rows is
    reused by later appends at once, and the planner sees the new sizes); a no-op
    elsewhere (SQLite reuses freed pages by itself). True if it ran."""
    conn = connections[using]
    if conn.vendor != "postgresql" or conn.in_atomic_block:
        return False
    with conn.cursor() as cur:
        cur.execute("VACUUM (ANALYZE) aaa_event, aaa_snapshot, aaa_run")
    return True


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
