"""The run index: one :class:`~aaa_django.models.RunRecord` row per run, folded from its log.

The log is the fact; the index is derived data kept for listing and filtering runs
(by owner, status, outcome, algorithm, start time). Its fields are ``RUNMETA``'s
(status, outcome, spend, owner, parent) plus the times of the started, completed and
last events, so any row can be rebuilt from the events alone:

- :func:`index_events` folds newly stored events into their rows. The event store
  calls it inside its append transaction, so a row never disagrees with a committed
  log (``DjangoEventStore`` calls :func:`index_events` inside each append); it is idempotent (events at or below the row's
  ``last_seq`` are skipped) and catches up from the log when it sees a gap.
- :func:`refresh` catches one row up with its log (the API does this before it
  answers about a run, so a process that appends without the index is still seen).
- :func:`reindex` rebuilds rows with a whole-log fold of ``RUNMETA``
  (``manage.py aaa_reindex``); :func:`forget` drops the row of an erased run.

Concurrent writers are safe: a row is updated only where its ``last_seq`` is still
the one the fold started from (an optimistic check), so an event is never counted
twice.
"""

from __future__ import annotations

import logging
from collections import namedtuple
from collections.abc import Iterable, Iterator, Sequence
from functools import lru_cache
from itertools import groupby
from typing import TYPE_CHECKING, Any, Protocol

from django.contrib.auth import get_user_model
from django.core.exceptions import ValidationError
from django.db import IntegrityError, connections, models, transaction
from django.db.models import OuterRef, Subquery

from aaa_django.events import Event
from aaa_django.models import EventRecord, RunRecord
from aaa_django.runtime.budget import Spend
from aaa_django.runtime.event_types import RUN_COMPLETED, RUN_STARTED
from aaa_django.runtime.lineage import FORKED_FROM
from aaa_django.runtime.meta import OPEN_STATUSES, RUNMETA, RunMeta

from . import rows
from .rows import ROW_COLUMNS

if TYPE_CHECKING:
    from django.db.backends.base.base import BaseDatabaseWrapper

log = logging.getLogger("aaa_django.runindex")

#: events read per query while catching a row up with its log
PAGE = 1000
_RETRIES = 5


def index_events(using: str, events: Sequence[Event]) -> None:
    """Fold stored ``events`` (with their seq) into their runs' rows; idempotent."""
    for stream, group in groupby(sorted(events, key=lambda e: (e.stream, e.seq or 0)), key=lambda e: e.stream):
        batch = list(group)
        if not _index_next(using, stream, batch):
            _index_stream(using, stream, batch)


def refresh(using: str, run_id: str) -> RunRecord | None:
    """The run's row, caught up with its log (created if the log has a start)."""
    _index_stream(using, run_id, [])
    return RunRecord.objects.using(using).filter(pk=run_id).first()


def forget(using: str, run_id: str) -> None:
    """Drop the row of an erased run."""
    RunRecord.objects.using(using).filter(pk=run_id).delete()


class Advances(Protocol):
    """What :func:`reindex` tells of its progress (a management command's
    :class:`~aaa_django.management.progress.Progress`)."""

    total: int | None

    def advance(self) -> None: ...


def reindex(
    using: str = "default", run_ids: Iterable[str] | None = None, *, progress: Advances | None = None
) -> dict[str, int]:
    """Rebuild rows from the log with a whole-log ``RUNMETA`` fold.

    All streams by default: rows of streams that no longer exist are deleted. The
    ``request_hash`` of an existing row (not in the log) is kept. Returns counts of
    ``indexed``, ``skipped`` (streams that are not runs), ``missing`` (streams of
    ``run_ids`` that have no events: their rows, if any, are deleted) and ``deleted``
    rows.
    ``progress``: an :class:`~aaa_django.management.progress.Progress`, given the number of
    streams and advanced by each.
    """
    streams = list(run_ids) if run_ids is not None else rows.streams(connections[using])
    counts = {"indexed": 0, "skipped": 0, "missing": 0, "deleted": 0}
    if progress is not None:
        progress.total = len(streams)
    for stream in streams:
        events = read_all(using, stream)
        if not events:
            counts["missing"] += 1
            counts["deleted"] += RunRecord.objects.using(using).filter(pk=stream).delete()[0]
        elif events[0].type != RUN_STARTED:
            counts["skipped"] += 1
        else:
            meta = _fold(RunMeta(), events)
            fields = _fields(meta, events, None, using)
            RunRecord.objects.using(using).update_or_create(pk=stream, defaults=fields)
            counts["indexed"] += 1
        if progress is not None:
            progress.advance()
    if run_ids is None:
        counts["deleted"] += RunRecord.objects.using(using).exclude(pk__in=streams).delete()[0]
    return counts


# -- due times (the durable timers' index) ----------------------------------------------

_DUE = "SELECT run_id, last_seq FROM aaa_run WHERE due_at <= %s ORDER BY due_at LIMIT %s"
_SETTLE = "UPDATE aaa_run SET due_at = %s WHERE run_id = %s AND last_seq = %s"


def unfinished(using: str) -> dict[str, float]:
    """Run id -> the time (epoch seconds) of its newest event, for every run started
    and not completed, and not waiting for a person: the sweeper's question (every
    ``STALL_AFTER / 2`` seconds).

    Asked of the index, not the log: the rows whose status is not ``completed`` (the
    status index), and of each of those runs its newest event, read by its key
    (``(stream, seq)``). So the question costs what the unfinished runs cost, however
    long the log: asked of the log it read every event of every run (a sequential
    scan of ``aaa_event``: 0.4 s and 770 MB read at 2 million events, every sweep;
    at 1 million events with 1,000 runs in flight 346 ms, and 23 ms of the index:
    ``benchmarks/bench_scale.py``). The newest
    event decides, not the row: a row behind its log (caught up after the commit, see
    :func:`index_events`) whose run has completed is not unfinished, and its time is
    the log's. A row is made in the
    transaction that stores the run's start, so every run the stores appended has
    one; a run's events written around the stores have none until ``aaa_reindex``."""
    return {
        run_id: last.timestamp()
        for run_id, last, last_type in unfinished_query(using)
        if last is not None and last_type != RUN_COMPLETED
    }


#: the statuses of a run someone must be working on: not ended, nor waiting for a
#: person (a conversation's next message, a question's answer: its timers are in
#: ``due_at``, and nothing is lost while it waits)
WORKED_ON = tuple(s for s in OPEN_STATUSES if s != "waiting")


def unfinished_query(using: str) -> models.QuerySet:
    """:func:`unfinished`'s query: ``(run id, its newest event's time and type)`` of
    every row whose status is neither ``completed`` nor ``waiting`` (a run waiting
    for a person may wait for days: it is not stalled)."""
    newest = EventRecord.objects.using(using).filter(stream=OuterRef("run_id")).order_by("-seq")
    return (
        RunRecord.objects.using(using)
        .filter(status__in=WORKED_ON)
        .annotate(last=Subquery(newest.values("time")[:1]), last_type=Subquery(newest.values("type")[:1]))
        .values_list("run_id", "last", "last_type")
    )


#: which of the runs named still go (``KnowsRunning``): a row not completed whose log's
#: newest event is not the run's end (the log decides: a row caught up after its commit
#: may be behind it, as in :func:`unfinished`). ``{}``: the test on the run id
_RUNNING = (
    "SELECT r.run_id FROM aaa_run r WHERE r.run_id {} AND r.status <> 'completed' "
    "AND (SELECT e.type FROM aaa_event e WHERE e.stream = r.run_id ORDER BY e.seq DESC LIMIT 1) <> %s"
)


def running_queries(streams: Sequence[str], *, pg: bool) -> Iterator[tuple[str, list[object]]]:
    """The statements that say which of ``streams`` are runs started and not ended
    (:func:`running`): one on PostgreSQL, one per ``rows.SQLITE_CHUNK`` run ids on
    SQLite. Their rows are the run ids."""
    for where, params in rows.among(streams, pg=pg):
        yield _RUNNING.format(where), [*params, RUN_COMPLETED]


def running(using: str, streams: Sequence[str]) -> set[str]:
    """Those of ``streams`` whose run has started and not ended, asked of the run index
    (``DjangoEventStore.running``, the :class:`~aaa_django.events.KnowsRunning` protocol):
    what the waits for runs' ends poll, for many runs in one query."""
    conn = connections[using]
    out: set[str] = set()
    with conn.cursor() as cur:
        for sql, params in running_queries(streams, pg=conn.vendor == "postgresql"):
            cur.execute(sql, params)
            out.update(row[0] for row in cur.fetchall())
    return out


def due_runs(using: str, now: float, limit: int) -> list[tuple[str, int]]:
    """``(run id, last_seq)`` of the runs whose ``due_at`` has come by ``now``, the
    longest due first (at most ``limit``)."""
    with connections[using].cursor() as cur:
        cur.execute(_DUE, [now, limit])
        return [(run_id, seq) for run_id, seq in cur.fetchall()]


def settle_due(using: str, run_id: str, last_seq: int, due: float | None) -> bool:
    """Move a row's ``due_at`` to ``due`` (the run's exact next due time, from a fold
    of its log up to ``last_seq`` at least), unless the row has moved past
    ``last_seq`` since: then an append folded its own due times in, and the next
    look settles it. True if the row was moved."""
    with connections[using].cursor() as cur:
        cur.execute(_SETTLE, [due, run_id, last_seq])
        return cur.rowcount == 1


# -- folding ------------------------------------------------------------------------

_LAST_SEQ = ROW_COLUMNS.index("last_seq")
_SELECT_ROW = f"SELECT {', '.join(ROW_COLUMNS)} FROM aaa_run WHERE run_id = %s"
_UPDATED = (
    "algorithm",
    "status",
    "outcome",
    "parent",
    "tokens_in",
    "tokens_out",
    "cost",
    "model_calls",
    "tool_calls",
    "updated_at",
    "last_seq",
    "due_at",
)
#: the columns every fold sets: ``updated_at`` and ``last_seq`` move with each event;
#: ``due_at`` may differ from the row as its append saw it (the timer duty's
#: ``settle_due`` moves it without moving ``last_seq``), so it is always written
_ALWAYS = frozenset(("updated_at", "last_seq", "due_at"))


@lru_cache(maxsize=128)
def _update_row(columns: tuple[str, ...], ends: bool) -> str:
    """The UPDATE of ``columns`` (and ``ended_at`` when the run ends), guarded by the
    row's ``last_seq``. Only the columns a fold changed are named: SQLite rewrites the
    entry of every index on a column an UPDATE names, even to the value it had (a
    turn's UPDATE naming all of them dirtied six pages of the run's indexes, every one
    written to the WAL and synced at the commit)."""
    sets = [f"{c} = %s" for c in columns] + (["ended_at = %s"] if ends else [])
    return f"UPDATE aaa_run SET {', '.join(sets)} WHERE run_id = %s AND last_seq = %s"


#: the columns of ``ROW_COLUMNS``, named as the model's fields (and the row's
#: ``ended_at``: None, the UPDATE keeps the stored one unless the run ends now)
_RowTuple = namedtuple("_RowTuple", (*ROW_COLUMNS, "ended_at"))  # type: ignore[misc]  # (its names: a constant's)


def _Row(values: Sequence[Any]) -> Any:
    return _RowTuple(*values, None)  # type: ignore[call-arg]


#: (column, its place in ``ROW_COLUMNS``): of the fold's columns, those it may change
#: (compared with the row's) and those the row keeps after it
_COMPARED = tuple((c, ROW_COLUMNS.index(c)) for c in _UPDATED if c not in _ALWAYS)
_FOLDED_AT = tuple((c, ROW_COLUMNS.index(c)) for c in _UPDATED if c in ROW_COLUMNS)


def row_update(
    conn: BaseDatabaseWrapper, row: Sequence[Any] | None, events: list[Event]
) -> tuple[str, list, tuple] | None:
    """The common case, in plain SQL (every append folds its events into the run's
    row, and the ORM's query building cost more than the queries): the UPDATE that
    folds stored ``events`` into the row whose ``ROW_COLUMNS`` are ``row``, guarded
    by the row's ``last_seq``, its parameters, and the row's ``ROW_COLUMNS`` after
    it. None unless the row exists and the events follow on from it (then
    :func:`index_events` does it all)."""
    write = _fold_to_write(conn, row, events)
    if write is None:
        return None
    r, fields, after, changed, ended, adapt = write
    columns = tuple(c for c in _UPDATED if c in _ALWAYS or c in changed)
    values = [adapt(fields[c]) if c == "updated_at" else fields[c] for c in columns]
    if ended is not None:
        values.append(adapt(ended))
    return _update_row(columns, ended is not None), [*values, r.run_id, r.last_seq], after


def _fold_to_write(conn: BaseDatabaseWrapper, row: Sequence[Any] | None, events: list[Event]) -> tuple | None:
    """:func:`_fold_row`'s fold with what a write of it needs (:func:`row_update`'s
    UPDATE, :func:`append_event_call`'s call): the row, the folded fields, the row
    after, the columns of ``_COMPARED`` the fold changed, the run's end among the
    events (None: the row's stays), and ``conn``'s time adapter; None when it would
    not apply."""
    folded = _fold_row(row, events)
    if folded is None:
        return None
    r, fields, after = folded
    changed = frozenset(c for c, i in _COMPARED if fields[c] != r[i])
    return r, fields, after, changed, fields["ended_at"], rows.time_adapter(conn)


#: the call of the append function of migration 0009 (one event of a run's stream,
#: folded into its row): the event's row (``rows.ROW_PG``), the row's ``last_seq``,
#: the mask of the folded columns written (bit i: ``_COMPARED[i]``, then ``ended_at``),
#: their values, ``updated_at``, ``due_at``, ``ended_at``
APPEND_EVENT = (
    "SELECT aaa_append_event(%s, %s, %s::bigint, %s, %s, %s, %s::timestamptz, %s::jsonb, %s, "
    "%s::bigint, %s::integer, %s, %s, %s, %s, %s::bigint, %s::bigint, %s::double precision, "
    "%s::integer, %s::integer, %s::timestamptz, %s::double precision, %s::timestamptz)"
)
#: the mask's bit of ``ended_at`` (after those of ``_COMPARED``)
_ENDS = 1 << len(_COMPARED)


def append_event_call(
    conn: BaseDatabaseWrapper, event_row: tuple, row: Sequence[Any] | None, events: list[Event]
) -> tuple[str, list, tuple] | None:
    """:func:`row_update`'s fold as the call of the append function (migration 0009)
    that inserts ``event_row``, the row of the one stored event ``events``, and folds
    it into the run's row whose ``ROW_COLUMNS`` are ``row``: the statement, its
    parameters, and the row's ``ROW_COLUMNS`` after it. The columns the fold changed
    are written, the others kept, as by :func:`row_update`'s UPDATE. None when it
    would not apply (as :func:`row_update`)."""
    write = _fold_to_write(conn, row, events) if len(events) == 1 else None
    if write is None:
        return None
    r, fields, after, changed, ended, adapt = write
    mask = sum(1 << i for i, (c, _) in enumerate(_COMPARED) if c in changed)
    if ended is not None:
        mask |= _ENDS
    params = [
        *event_row,
        r.last_seq,
        mask,
        *(fields[c] for c, _ in _COMPARED),
        adapt(fields["updated_at"]),
        fields["due_at"],
        adapt(ended) if ended is not None else None,
    ]
    return APPEND_EVENT, params, after


def row_after(row: Sequence[Any] | None, events: list[Event]) -> tuple | None:
    """The ``ROW_COLUMNS`` of the row ``row`` after stored ``events`` are folded into
    it (what :func:`row_update` would leave), or None when it would not apply."""
    folded = _fold_row(row, events)
    return folded[2] if folded is not None else None


def _fold_row(row: Sequence[Any] | None, events: list[Event]) -> tuple[Any, dict[str, Any], tuple] | None:
    if row is None or not events:
        return None
    r = _Row(row)
    if events[0].seq != r.last_seq + 1:
        return None  # a gap (or indexed already): catch up from the log
    try:
        fields = _folded(_fold(_meta_of(r), events), events, r)
    except Exception:
        return None  # the general path logs it
    after = list(row)
    for c, i in _FOLDED_AT:
        after[i] = fields[c]
    return r, fields, tuple(after)


#: the columns a new run's row is inserted with (``owner_id`` follows, see ``row_insert``)
_INSERTED = (
    "run_id",
    "algorithm",
    "status",
    "outcome",
    "parent",
    "tokens_in",
    "tokens_out",
    "cost",
    "model_calls",
    "tool_calls",
    "started_at",
    "ended_at",
    "updated_at",
    "last_seq",
    "request_hash",
    "forked_from",
    "forked_at",
    "due_at",
)


#: the run row's datetime columns, as the model declares them (``forked_at`` is a seq,
#: ``due_at`` a timestamp: adapted as they are)
_DATETIMES = frozenset(f.column for f in RunRecord._meta.concrete_fields if isinstance(f, models.DateTimeField))


def row_insert(conn: BaseDatabaseWrapper, events: list[Event]) -> tuple[str, list, tuple] | None:
    """A new run's row in plain SQL, folded from its first stored ``events`` (from seq
    1, ``aaa.run.started``): the INSERT (``RETURNING owner_id``), its parameters, and
    the row's ``ROW_COLUMNS`` after it (with the owner it asked for: the statement
    stores it only if that user exists, as :func:`owner_pk` would). None when the
    events do not start a run."""
    fields = _new_row(events)
    if fields is None:
        return None
    adapt = conn.ops.adapt_datetimefield_value
    values = [adapt(fields[c]) if c in _DATETIMES and fields[c] is not None else fields[c] for c in _INSERTED]
    User = get_user_model()
    qn = conn.ops.quote_name
    pk = qn(User._meta.pk.column)
    sql = (
        f"INSERT INTO aaa_run ({', '.join(_INSERTED)}, owner_id) "
        f"VALUES ({', '.join(['%s'] * len(_INSERTED))}, "
        f"(SELECT {pk} FROM {qn(User._meta.db_table)} WHERE {pk} = %s)) RETURNING owner_id"
    )
    return sql, [*values, fields["owner_id"]], tuple(fields[c] for c in ROW_COLUMNS)


def initial_row(events: Sequence[Event]) -> tuple | None:
    """The ``ROW_COLUMNS`` of a new run's row after its first ``events`` (from seq 1),
    without asking the database: ``owner_id`` is the pk the run's owner names (the
    stored row has None if no such user exists; a fold of later events never reads
    it). None when the events do not start a run."""
    fields = _new_row(events)
    return tuple(fields[c] for c in ROW_COLUMNS) if fields is not None else None


def _new_row(events: Sequence[Event]) -> dict[str, Any] | None:
    if not starts_run(events):
        return None
    try:
        meta = _fold(RunMeta(), events)
        fields = _folded(meta, list(events), None)
        owner = _owner_value(meta.owner)
    except Exception:
        return None  # the general path logs it
    return {
        **fields,
        **origin(events[0]),
        "run_id": events[0].stream,
        "started_at": events[0].time,
        "request_hash": "",
        "owner_id": owner,
    }


def origin(started: Event) -> dict[str, Any]:
    """The row's ``forked_from`` and ``forked_at``: the run a fork's start names, and
    the seq it was forked at (None for a run that is not a fork)."""
    fork = started.data.get(FORKED_FROM) if started.type == RUN_STARTED else None
    if not isinstance(fork, dict):
        return {"forked_from": None, "forked_at": None}
    return {"forked_from": fork.get("run"), "forked_at": fork.get("seq")}


def starts_run(events: Sequence[Event]) -> bool:
    """Do stored ``events`` begin a run's log (seq 1, ``aaa.run.started``)?"""
    return bool(events) and events[0].seq == 1 and events[0].type == RUN_STARTED


def _index_next(using: str, stream: str, events: list[Event]) -> bool:
    """:func:`row_update` on the row read now; False when it is not the common case."""
    conn = connections[using]
    with conn.cursor() as cur:
        cur.execute(_SELECT_ROW, [stream])
        row = cur.fetchone()
        if row is not None and events and (events[-1].seq or 0) <= row[_LAST_SEQ]:
            return True  # indexed already
        if row is None and not starts_run(events):
            return True  # not a run: a row is only ever made by a run's first event
        update = row_update(conn, row, events)
        if update is None:
            return False
        cur.execute(update[0], update[1])
        return cur.rowcount == 1


def _index_stream(using: str, stream: str, events: list[Event]) -> None:
    records = RunRecord.objects.using(using)
    for _ in range(_RETRIES):
        row = records.filter(pk=stream).first()
        if row is None and events and not (events[0].seq == 1 and events[0].type == RUN_STARTED):
            # Not a run, or a run whose start was never indexed: in the append path
            # (events given) that is never worth a read of the log on every append
            # (quadratic on a long stream); refresh() and aaa_reindex catch up.
            return
        last = row.last_seq if row is not None else 0
        new = [e for e in events if (e.seq or 0) > last]
        if events and not new:
            return  # indexed already
        if not events or (new and new[0].seq != last + 1):
            # A gap (events appended without the index), or a plain catch-up: read the
            # missing part of the log.
            upto = (new[0].seq or 1) - 1 if new else None
            new = read_all(using, stream, after=last, upto=upto) + new
        if not new:
            return
        if row is None and new[0].type != RUN_STARTED:
            return  # not a run (or its start is not in this log)
        try:
            meta = _fold(_meta_of(row) if row is not None else RunMeta(), new)
            fields = _fields(meta, new, row, using)
        except Exception:  # derived data must never fail an append: aaa_reindex heals it
            log.warning("run index: cannot fold %s at seq %s", stream, new[-1].seq, exc_info=True)
            return
        try:
            if row is None:
                with transaction.atomic(using=using):
                    records.create(pk=stream, **fields)
                return
            if records.filter(pk=stream, last_seq=last).update(**fields):
                return
        except IntegrityError:
            pass  # another writer created the row first: fold again from its state
        events = new  # another writer moved the row on: start again from its state
    log.warning("run index: gave up updating %s after %s races", stream, _RETRIES)


def read_all(using: str, stream: str, *, after: int = 0, upto: int | None = None) -> list[Event]:
    """The stream's events after ``after`` (up to seq ``upto``), read page by page."""
    out: list[Event] = []
    while True:
        limit = PAGE if upto is None else min(PAGE, upto - after)
        if limit <= 0:
            return out
        page = rows.read(connections[using], stream, after=after, limit=limit)
        out.extend(page)
        if len(page) < limit:
            return out
        after = page[-1].seq or after


def _fold(meta: RunMeta, events: Iterable[Event]) -> RunMeta:
    # RUNMETA's own fold function, called directly: the index must not move the
    # projection's fold counters, which the engine's tests read.
    for e in events:
        meta = RUNMETA.apply(meta, e)
    return meta


def _meta_of(row: Any) -> RunMeta:
    """The part of RUNMETA a row keeps: enough for RUNMETA's fold of the index fields."""
    return RunMeta(
        run_id=row.run_id,
        algorithm=row.algorithm,
        status=row.status,
        outcome=row.outcome,
        parent=row.parent,
        owner=str(row.owner_id) if row.owner_id is not None else None,
        spend=Spend(
            tokens_in=row.tokens_in,
            tokens_out=row.tokens_out,
            cost=row.cost,
            model_calls=row.model_calls,
            tool_calls=row.tool_calls,
        ),
    )


def _fields(meta: RunMeta, new: list[Event], row: Any, using: str) -> dict[str, Any]:
    fields = _folded(meta, new, row)
    if row is None:
        fields.update(origin(new[0]))
        fields["started_at"] = new[0].time
        fields["owner_id"] = owner_pk(meta.owner, using)
    return fields


def _folded(meta: RunMeta, new: list[Event], row: Any) -> dict[str, Any]:
    """The row's fields that the fold of ``new`` (into ``row``, or a new row) sets."""
    ended = next((e.time for e in new if e.type == RUN_COMPLETED), None)
    fields: dict[str, Any] = {
        "algorithm": meta.algorithm or "",
        "status": meta.status,
        "outcome": meta.outcome,
        "parent": meta.parent,
        "tokens_in": meta.spend.tokens_in,
        "tokens_out": meta.spend.tokens_out,
        "cost": meta.spend.cost,
        "model_calls": meta.spend.model_calls,
        "tool_calls": meta.spend.tool_calls,
        "ended_at": ended if ended is not None else (row.ended_at if row else None),
        "updated_at": new[-1].time,
        "last_seq": new[-1].seq,
        "due_at": _due(meta, row),
    }
    return fields


def _due(meta: RunMeta, row: Any) -> float | None:
    """The row's ``due_at`` after a fold: the earliest of the row's and the due times
    the folded events set (a fold from a row knows only those: a decided approval's
    expiry may stay, early, until the timer duty settles it; never late); None once
    the run has ended."""
    if meta.completed:
        return None
    times = [t for t in (meta.due, row.due_at if row is not None else None) if t is not None]
    return min(times, default=None)


def owner_pk(owner: object, using: str = "default") -> object:
    """The user pk named by a run's ``owner`` (``str(user.pk)``), or None."""
    pk = _owner_value(owner)
    if pk is None:
        return None
    User = get_user_model()
    return pk if User._default_manager.db_manager(using).filter(pk=pk).exists() else None


def _owner_value(owner: object) -> object:
    """``owner`` as a value of the user model's pk, or None (not asking whether that
    user exists)."""
    if owner is None or owner == "":
        return None
    try:
        return get_user_model()._meta.pk.to_python(owner)
    except (ValidationError, TypeError, ValueError):
        return None
