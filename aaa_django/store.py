"""The EventStore over the Django ORM (SQLite and PostgreSQL; any backend Django has).

The database enforces the invariants (see ``migrations/0002``); this module adds what
SQL alone does not say: absorbing an already stored event id, numbering a batch, and
serialising appenders of one stream.
"""

from __future__ import annotations

import json
import time
import zlib
from dataclasses import replace
from datetime import timezone
from typing import Sequence

from asgiref.sync import sync_to_async
from django.db import IntegrityError, OperationalError, connections, transaction
from django.utils.timezone import now

from .events import ConcurrencyError, Event, Snapshot
from .events.event import decode_blobs, encode_blobs
from .events.store import prepare_batch
from .models import EventRecord, SnapshotRecord

_FIELDS = ("id", "stream", "seq", "type", "data", "causation", "time", "blobs", "tenant")
_COLUMNS = "(id, stream, seq, type, data, causation, time, blobs, tenant)"
_INSERT = f"INSERT INTO aaa_event {_COLUMNS} VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s)"
_INSERT_PG = f"INSERT INTO aaa_event {_COLUMNS} VALUES (%s, %s, %s, %s, %s, %s, %s, %s::jsonb, %s)"
_HEAD = "SELECT seq FROM aaa_event WHERE stream = %s ORDER BY seq DESC LIMIT 1"
_HEAD_AND_KNOWN_PG = (
    f"SELECT COALESCE(({_HEAD}), 0), ARRAY(SELECT id FROM aaa_event WHERE id = ANY(%s))"
)
_SNAPSHOT_UPDATE = (
    "UPDATE aaa_snapshot SET seq = %s, event_id = %s, state = %s, saved_at = %s "
    "WHERE stream = %s AND name = %s AND version = %s AND seq < %s"
)
_SNAPSHOT_INSERT = (
    "INSERT INTO aaa_snapshot (stream, name, version, seq, event_id, state, saved_at) "
    "VALUES (%s, %s, %s, %s, %s, %s, %s) ON CONFLICT (stream, name, version) DO NOTHING"
)
# SQLite caps the variables of one statement; ids are checked in chunks of this many.
_SQLITE_CHUNK = 500
# Appenders that lose a race (SQLite's single writer, or a concurrent insert of the same
# id) re-read and try again; past this many tries the error is real.
_RETRIES = 20


def _to_event(row) -> Event:
    id_, stream, seq, type_, data, causation, time_, blobs, tenant = row
    if time_.tzinfo is None:  # a site with USE_TZ = False stores naive UTC
        time_ = time_.replace(tzinfo=timezone.utc)
    return Event(
        id=id_,
        stream=stream,
        seq=seq,
        type=type_,
        data=json.loads(data),
        causation=causation,
        time=time_,
        blobs=decode_blobs(blobs) if blobs else (),
        tenant=tenant,
    )


class EventList(list):
    """The events a read returned, and whether they were read outside any transaction."""

    committed = True


class DjangoEventStore:
    """An :class:`~aaa_django.events.EventStore` on the database alias ``using``.

    Async methods (the protocol the engine uses) run the ORM in Django's
    thread-sensitive executor; the ``*_sync`` methods are for sync callers (Celery
    tasks, the admin, the API). Appends join the caller's transaction when there is
    one, so events commit (or roll back) with the caller's own writes.
    """

    def __init__(self, using: str = "default") -> None:
        self.using = using
        self.cache_key = f"django:{using}"
        self.append = sync_to_async(self.append_sync, thread_sensitive=True)
        self.read = sync_to_async(self.read_sync, thread_sensitive=True)
        self.head = sync_to_async(self.head_sync, thread_sensitive=True)
        self.load_snapshot = sync_to_async(self.load_snapshot_sync, thread_sensitive=True)
        self.save_snapshot = sync_to_async(self.save_snapshot_sync, thread_sensitive=True)
        self.erase = sync_to_async(self.erase_sync, thread_sensitive=True)
        self.streams = sync_to_async(self.streams_sync, thread_sensitive=True)

    def __repr__(self) -> str:
        return f"DjangoEventStore(using={self.using!r})"

    @property
    def _events(self):
        return EventRecord.objects.using(self.using)

    # -- events -------------------------------------------------------------------

    def append_sync(
        self, events: Sequence[Event], *, expected_seq: int | None = None
    ) -> list[Event]:
        stream, batch, texts = prepare_batch(events)  # raises before any write
        if not batch:
            return []
        for attempt in range(_RETRIES):
            try:
                return self._append_once(stream, batch, texts, expected_seq, attempt > 0)
            except (IntegrityError, OperationalError) as exc:
                # Lost a race with another appender (SQLite: "database is locked";
                # both: the same seq or id inserted first by someone else). Re-read
                # and decide again; inside a caller's transaction our atomic block was
                # a savepoint, rolled back, so the caller's transaction is still usable.
                if attempt == _RETRIES - 1:
                    raise ConcurrencyError(f"append to {stream} lost a race: {exc}") from exc
                time.sleep(0.001 * (attempt + 1))
        raise AssertionError("unreachable")

    def _append_once(self, stream: str, batch: list[Event], texts: list[str], expected_seq,
                     contended: bool = False):
        # Plain SQL on Django's connection: building ORM queries cost more than the
        # database work itself (benchmarks/bench_eventlog.py). Optimistic first: the
        # unique (stream, seq) index and the dense-seq trigger refuse a lost race, and
        # only a retry takes the stream's advisory lock on PostgreSQL.
        conn = connections[self.using]
        pg = conn.vendor == "postgresql"
        with transaction.atomic(using=self.using), conn.cursor() as cur:
            if pg and contended:
                cur.execute("SELECT pg_advisory_xact_lock(%s)", [_lock_key(stream)])
            head, known = _head_and_known(cur, pg, stream, [e.id for e in batch])
            fresh = [(e, t) for e, t in zip(batch, texts) if e.id not in known]
            if expected_seq is not None and expected_seq != head:
                raise ConcurrencyError(f"stream head is {head}, expected {expected_seq}")
            stored, rows = [], []
            adapt = conn.ops.adapt_datetimefield_value
            for seq, (e, text) in enumerate(fresh, start=head + 1):
                if e.seq is not None and e.seq != seq:
                    raise ConcurrencyError(
                        f"event {e.id} claims seq {e.seq} but the next seq is {seq}"
                    )
                # What the caller gets back is what a reader will get: the decoded text.
                stored.append(replace(e, seq=seq, data=json.loads(text)))
                blobs = json.dumps(encode_blobs(e.blobs)) if e.blobs else "[]"
                rows.append((e.id, e.stream, seq, e.type, text, e.causation, adapt(e.time),
                             blobs, e.tenant))
            if rows:
                cur.executemany(_INSERT_PG if pg else _INSERT, rows)
                # The run index (aaa_run) is derived from the log: updated in the same
                # transaction, so it commits, or rolls back, with the events.
                from .runindex import index_events  # runindex imports this module

                index_events(self.using, stored)
        return stored

    def read_sync(
        self,
        stream: str,
        *,
        after: int = 0,
        limit: int | None = None,
        tenant: str | None = None,
    ) -> list[Event]:
        qs = self._events.filter(stream=stream, seq__gt=after)
        if tenant is not None:
            qs = qs.filter(tenant=tenant)
        qs = qs.order_by("seq").values_list(*_FIELDS)
        if limit is not None:
            qs = qs[:limit]
        events = EventList(_to_event(row) for row in qs)
        # Rows read inside a caller's transaction may still be rolled back: say so, and
        # the in-process holder will not share a state folded from them.
        events.committed = not connections[self.using].in_atomic_block
        return events

    def head_sync(self, stream: str) -> tuple[int, str] | None:
        row = self._events.filter(stream=stream).order_by("-seq").values_list("seq", "id")[:1]
        return (row[0][0], row[0][1]) if row else None

    def erase_sync(self, stream: str) -> int:
        from .runindex import forget

        with transaction.atomic(using=self.using):
            SnapshotRecord.objects.using(self.using).filter(stream=stream).delete()
            deleted, _ = self._events.filter(stream=stream).delete()
            forget(self.using, stream)
        return deleted

    def streams_sync(self) -> list[str]:
        return list(self._events.order_by("stream").values_list("stream", flat=True).distinct())

    # -- snapshots ----------------------------------------------------------------

    def load_snapshot_sync(self, stream: str, name: str, version: int) -> Snapshot | None:
        row = (
            SnapshotRecord.objects.using(self.using)
            .filter(stream=stream, name=name, version=version)
            .values_list("seq", "event_id", "state")
            .first()
        )
        return Snapshot(stream, name, version, row[0], row[1], row[2]) if row else None

    def save_snapshot_sync(self, snapshot: Snapshot) -> bool:
        """Store ``snapshot`` unless one at the same or a later seq is stored already.

        A conditional UPDATE (only an older row is replaced), else an INSERT that yields
        to a row someone else inserted meanwhile; then the UPDATE again, which now tells
        whether that row is older. Racing savers cannot move the seq backwards (the
        WHERE clause, and the database trigger, refuse it). First save: 2 statements;
        a newer save: 1.
        """
        conn = connections[self.using]
        key = [snapshot.stream, snapshot.name, snapshot.version]
        values = [snapshot.seq, snapshot.event_id, snapshot.state,
                  conn.ops.adapt_datetimefield_value(now())]
        with transaction.atomic(using=self.using), conn.cursor() as cur:
            for _ in range(2):
                cur.execute(_SNAPSHOT_UPDATE, [*values, *key, snapshot.seq])
                if cur.rowcount:
                    return True
                cur.execute(_SNAPSHOT_INSERT, [*key, *values])
                if cur.rowcount:
                    return True
        return False  # a row at the same or a later seq is there


def _head_and_known(cur, pg: bool, stream: str, ids: list[str]) -> tuple[int, set[str]]:
    """The stream's head seq and which of ``ids`` are stored already (one round trip
    on PostgreSQL; SQLite is in-process, so two statements cost little)."""
    if pg:
        cur.execute(_HEAD_AND_KNOWN_PG, [stream, ids])
        head, known = cur.fetchone()
        return head, set(known)
    cur.execute(_HEAD, [stream])
    row = cur.fetchone()
    known: set[str] = set()
    for i in range(0, len(ids), _SQLITE_CHUNK):
        chunk = ids[i : i + _SQLITE_CHUNK]
        cur.execute(
            f"SELECT id FROM aaa_event WHERE id IN ({', '.join(['%s'] * len(chunk))})", chunk
        )
        known.update(r[0] for r in cur.fetchall())
    return (row[0] if row else 0), known


def _lock_key(stream: str) -> int:
    # pg_advisory_xact_lock takes a signed 64-bit key; crc32 spreads streams well enough
    # (a collision only makes two streams' appenders wait for each other).
    return zlib.crc32(stream.encode()) - 2**31
