"""The facts: the event table and the snapshot table.

Both are written only through :class:`aaa_django.store.DjangoEventStore`. The
migrations add database triggers so the invariants hold even for raw SQL: events are
never updated in place, ``seq`` is dense per stream, a snapshot's ``seq`` never goes
backwards. Unique constraints give one event per (stream, seq) and per id.
"""

from __future__ import annotations

from django.db import models


class EventRecord(models.Model):
    """One stored event (see :class:`aaa_django.events.Event`)."""

    id = models.CharField(primary_key=True, max_length=200)
    stream = models.CharField(max_length=200)
    seq = models.PositiveBigIntegerField()
    type = models.CharField(max_length=200)
    # JSON text, not jsonb: an event is a fact and must read back exactly as written
    # (jsonb reorders keys, rewrites numbers such as 1e300, and refuses "\u0000").
    data = models.TextField(default="{}")
    causation = models.CharField(max_length=200, null=True, blank=True)
    time = models.DateTimeField()
    blobs = models.JSONField(default=list, blank=True)
    tenant = models.CharField(max_length=200, null=True, blank=True)

    class Meta:
        db_table = "aaa_event"
        verbose_name = "event"
        constraints = [
            # Also the index every stream read uses: WHERE stream = ? AND seq > ? ORDER BY seq.
            models.UniqueConstraint(fields=["stream", "seq"], name="aaa_event_stream_seq"),
            models.CheckConstraint(condition=models.Q(seq__gte=1), name="aaa_event_seq_positive"),
        ]
        indexes = [models.Index(fields=["type"], name="aaa_event_type")]

    def __str__(self) -> str:
        return f"{self.stream}#{self.seq} {self.type}"


class SnapshotRecord(models.Model):
    """A projection's folded state at ``seq`` (derived data: losing it costs a replay)."""

    stream = models.CharField(max_length=200)
    name = models.CharField(max_length=200)
    version = models.IntegerField()
    seq = models.PositiveBigIntegerField()
    event_id = models.CharField(max_length=200)
    state = models.TextField()
    saved_at = models.DateTimeField(auto_now=True)

    class Meta:
        db_table = "aaa_snapshot"
        verbose_name = "snapshot"
        constraints = [
            models.UniqueConstraint(
                fields=["stream", "name", "version"], name="aaa_snapshot_stream_name_version"
            ),
        ]

    def __str__(self) -> str:
        return f"{self.stream} {self.name} v{self.version} @{self.seq}"
