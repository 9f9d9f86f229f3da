"""The queries of retention (:mod:`aaa_django.site.retention`, which owns the policy):
which ended run trees are due, how many events runs hold, which streams have events
and which blobs a stream's events refer to, and the space given back on PostgreSQL."""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from datetime import datetime
from typing import Any

from django.db import connections
from django.db.models import Exists, OuterRef, Q

from aaa_django.events.event import decode_blobs
from aaa_django.models import EventRecord, RunRecord
from aaa_django.runtime.event_types import completion_id

from . import rows

__all__ = [
    "all_streams",
    "count_events",
    "due_roots",
    "due_trees",
    "referenced_blobs",
    "streams_with_events",
    "vacuum_tables",
]

#: ids per query (SQLite's limit on a statement's parameters is 999 in old builds)
CHUNK = 500

#: a keyset cursor over the due roots: the last root's ``ended_at`` and id
After = tuple[datetime, str]


def due_roots(
    using: str, cutoffs: Mapping[str, datetime], limit: int, after: After | None = None
) -> list[tuple[str, datetime]]:
    """Up to ``limit`` ended root runs due, as (id, ended_at), oldest first, after the
    root ``after`` if given: those whose outcome has a cutoff in ``cutoffs`` and that
    ended before it. A child whose parent is gone counts as a root."""
    runs = RunRecord.objects.using(using)
    due = runs.none()
    for outcome, cutoff in cutoffs.items():
        due = due | runs.filter(status="completed", outcome=outcome, ended_at__lt=cutoff)
    root = ~Exists(runs.filter(run_id=OuterRef("parent")))  # a child goes with its root
    due = due.filter(root)
    if after is not None:
        at, run_id = after
        due = due.filter(Q(ended_at__gt=at) | Q(ended_at=at, run_id__gt=run_id))
    return list(due.order_by("ended_at", "run_id").values_list("run_id", "ended_at")[:limit])


def due_trees(
    using: str,
    cutoffs: Mapping[str, datetime],
    limit: int,
    after: After | None = None,
) -> tuple[list[list[str]], list[str], After | None]:
    """Of the next ``limit`` due roots (:func:`due_roots`, after ``after``): the run
    trees (root first) whose every run has ended, the roots held back because one of
    their runs has not, and the cursor of the last root (None: there were none). A
    few queries per batch, whatever its size: one per tree level, one per 500 runs."""
    due = due_roots(using, cutoffs, limit, after)
    if not due:
        return [], [], None
    roots = [run for run, _ in due]
    trees = {root: [root] for root in roots}
    root_of = {root: root for root in roots}
    runs = RunRecord.objects.using(using)
    frontier = list(roots)
    while frontier:
        children: list[tuple[str, str]] = []
        for chunk in _chunks(frontier):
            children += runs.filter(parent__in=chunk).values_list("run_id", "parent")
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


def count_events(using: str, runs: list[str]) -> int:
    """The events of ``runs``' streams."""
    events = EventRecord.objects.using(using)
    return sum(events.filter(stream__in=chunk).count() for chunk in _chunks(runs))


def streams_with_events(using: str, names: list[str]) -> set[str]:
    """Those of the streams ``names`` that hold events."""
    found: set[str] = set()
    events = EventRecord.objects.using(using)
    for chunk in _chunks(names):
        found.update(events.filter(stream__in=chunk).values_list("stream", flat=True).distinct())
    return found


def all_streams(using: str) -> list[str]:
    """Every stream of the log, one index probe each (:func:`aaa_django.store.rows.streams`)."""
    return rows.streams(connections[using])


def referenced_blobs(using: str, stream: str) -> set[str]:
    """The SHA-256 of every blob the stream's events refer to (its rows with blobs)."""
    found = EventRecord.objects.using(using).filter(stream=stream).exclude(blobs=[]).values_list("blobs", flat=True)
    return {ref.sha256 for raw in found for ref in decode_blobs(_json(raw))}


def vacuum_tables(using: str) -> bool:
    """``VACUUM (ANALYZE)`` the log's tables on PostgreSQL (the space of erased rows is
    reused by later appends at once, and the planner sees the new sizes); a no-op
    elsewhere (SQLite reuses freed pages by itself) and inside a transaction. True if
    it ran."""
    conn = connections[using]
    if conn.vendor != "postgresql" or conn.in_atomic_block:
        return False
    with conn.cursor() as cur:
        cur.execute("VACUUM (ANALYZE) aaa_event, aaa_snapshot, aaa_run")
    return True


def _json(raw: object) -> Any:
    return json.loads(raw) if isinstance(raw, str) else raw


def _chunks(items: list[str], size: int = CHUNK) -> Iterable[list[str]]:
    for i in range(0, len(items), size):
        yield items[i : i + size]
