"""The runs' changes in order: the rows of the run index changed after a position.

A row's ``changed`` (migration 0012) is where its last change stands in the order of
every run's changes; a position is ``(changed, run_id)`` (several rows may share
``changed``: a transaction that appended to many runs). :func:`after` reads the rows of
a queryset whose position is after a given one, in order, such that a later read never
finds a row before what this one returned:

- SQLite: the database writes one transaction at a time, so every committed change is
  below every change still to come: what is visible is in order.
- PostgreSQL: ``changed`` is the id of the transaction that wrote it, and transactions
  commit in another order than their ids. A read returns only the rows below its
  snapshot's ``xmin`` (every transaction below it has ended, so none can still write
  there); a committed row at or above it waits (``held``) for the transactions before it
  to end. A long transaction anywhere in the database holds the rows after it back
  until it ends: they come late, never out of order.

A row changed again moves to its new position: a reader sees each run's changes in
order, those that came between two of its reads as one (the row's latest).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from django.db import connections
from django.db.models import Q, QuerySet
from django.db.models.expressions import RawSQL

from aaa_django.models import RunRecord

#: the snapshot's horizon: no transaction below it is still running
HORIZON = "pg_snapshot_xmin(pg_current_snapshot())::text::bigint"

Position = tuple[int, str]


@dataclass(frozen=True)
class Changed:
    """The rows :func:`after` read, in order; ``held``: more are committed but wait for
    transactions before them to end (read again soon)."""

    rows: list[RunRecord]
    held: bool


def after(rows: QuerySet[RunRecord], position: Position | None, limit: int) -> Changed:
    """The rows of ``rows`` changed after ``position`` (None: every row), in the order
    of their changes, at most ``limit``."""
    if position is not None:
        changed, run_id = position
        rows = rows.filter(Q(changed__gt=changed) | Q(changed=changed, run_id__gt=run_id))
    rows = rows.order_by("changed", "run_id")
    if connections[rows.db].vendor != "postgresql":
        return Changed(list(rows[:limit]), held=False)
    found = list(rows.annotate(horizon=RawSQL(HORIZON, ()))[:limit])
    ready = [r for r in found if r.changed < _horizon(r)]
    return Changed(ready, held=len(ready) < len(found))


def _horizon(row: Any) -> int:
    return int(row.horizon)


def position(row: RunRecord) -> Position:
    return row.changed, row.run_id


def text(p: Position) -> str:
    """A position as the change stream's ``id``: ``"<changed>.<run id>"``."""
    return f"{p[0]}.{p[1]}"


def parse(value: str) -> Position:
    """A position from :func:`text`; ``ValueError`` for anything else."""
    changed, dot, run_id = value.partition(".")
    if not dot or not run_id or not changed.isascii() or not changed.isdigit() or len(changed) > 18:
        raise ValueError(f"not a change position: {value[:80]!r}")
    return int(changed), run_id
