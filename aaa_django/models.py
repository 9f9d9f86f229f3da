"""The facts: the event table and the snapshot table; and what the REST API adds.

Both are written only through :class:`aaa_django.store.DjangoEventStore`. The
migrations add database triggers so the invariants hold even for raw SQL: events are
never updated in place, ``seq`` is dense per stream, a snapshot's ``seq`` never goes
backwards. Unique constraints give one event per (stream, seq) and per id.

``RunRecord`` is derived data: an index of runs for listing and filtering, kept by
:mod:`aaa_django.store.runindex` and rebuilt from the log by ``manage.py aaa_reindex``.
``ApiKey`` holds the REST API's keys, hashed.
"""

from __future__ import annotations

import datetime
import hashlib
import secrets
from datetime import timedelta
from typing import TYPE_CHECKING

from django.conf import settings
from django.db import models
from django.utils import timezone

from aaa_django.runtime import meta

if TYPE_CHECKING:
    from django.contrib.auth.base_user import AbstractBaseUser


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
            models.UniqueConstraint(fields=["stream", "name", "version"], name="aaa_snapshot_stream_name_version"),
        ]

    def __str__(self) -> str:
        return f"{self.stream} {self.name} v{self.version} @{self.seq}"


class RunRecord(models.Model):
    """One run, as its log says (derived: ``aaa_reindex`` rebuilds it from the events).

    Every field but ``request_hash``, ``redriven_at``, ``redrives`` and the lease
    (``held_by``, ``held_until``, ``adopted_at``, ``adoptions``) is a function of the
    run's events (``RUNMETA`` plus event times); ``request_hash`` remembers the body of
    the API request that started the run under an ``Idempotency-Key``, ``redriven_at``
    and ``redrives`` are the sweeper's ledger of re-drives, and the lease says which
    process drives the run (:mod:`aaa_django.store.leases`). Its permissions decide who
    may see and act on runs that are not their own.
    """

    #: the statuses a row holds: RUNMETA's, but "new" (a row is made with the run's start)
    STATUSES = meta.STATUSES[1:]

    run_id = models.CharField(primary_key=True, max_length=200)
    algorithm = models.CharField(max_length=200, blank=True, default="")
    #: RUNMETA's status: "pending" (input not validated yet), "running", "completed"
    status = models.CharField(max_length=16, choices=[(s, s) for s in STATUSES])
    outcome = models.CharField(max_length=32, null=True, blank=True)
    owner = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        null=True,
        blank=True,
        on_delete=models.SET_NULL,
        related_name="aaa_runs",
    )
    parent = models.CharField("parent run id", max_length=200, null=True, blank=True)
    tokens_in = models.PositiveBigIntegerField(default=0)
    tokens_out = models.PositiveBigIntegerField(default=0)
    cost = models.FloatField(default=0.0)
    model_calls = models.PositiveIntegerField(default=0)
    tool_calls = models.PositiveIntegerField(default=0)
    #: times of the started event, the completed event, and the last indexed event
    started_at = models.DateTimeField()
    ended_at = models.DateTimeField(null=True, blank=True)
    updated_at = models.DateTimeField()
    #: seq of the last event folded into this row
    last_seq = models.PositiveBigIntegerField(default=0)
    #: sha256 of the API request that started the run with an Idempotency-Key
    request_hash = models.CharField(max_length=64, blank=True, default="")
    #: a fork's origin: the run it was forked from, and the seq of the last event kept
    forked_from = models.CharField("forked from run", max_length=200, null=True, blank=True)
    forked_at = models.PositiveBigIntegerField("forked at event", null=True, blank=True)
    #: when the run's next timer may fall due (seconds since the epoch): never later
    #: than its deadline or a pending approval's expiry (a decided approval's may linger
    #: until the timer duty looks and moves it on); None when it has none or has ended.
    #: The durable timers' index (``aaa_django.timers``).
    due_at = models.FloatField(null=True, blank=True)
    #: the sweeper's ledger (``aaa_django.celery.redrives``): when it last re-drove the
    #: run (seconds since the epoch), and how many times it has. Not derived from the
    #: log: ``aaa_reindex`` keeps them, and a rebuilt row starts without (the run is
    #: then re-driven as if never before)
    redriven_at = models.FloatField("last re-driven", null=True, blank=True)
    redrives = models.PositiveIntegerField("re-drives", default=0, db_default=0)
    #: the run's lease (``aaa_django.store.leases``): the process that drives it (its
    #: holder id: host, pid namespace, pid, start time), and until when it was claimed
    #: (seconds since the epoch, the database's clock): past that, it lives as long as
    #: its holder's (:class:`HolderRecord`); another process adopts the run once both
    #: have lapsed. Not derived from the log
    held_by = models.CharField("held by", max_length=200, null=True, blank=True)
    held_until = models.FloatField("held until", null=True, blank=True)
    #: when a process last adopted the run from a holder that was gone (seconds since
    #: the epoch), and how many times one has
    adopted_at = models.FloatField("last adopted", null=True, blank=True)
    adoptions = models.PositiveIntegerField("adoptions", default=0, db_default=0)
    #: where the row's last change (its start, status, outcome, spend or end) stands in
    #: the order of every run's changes: written by the database alone (migration 0012's
    #: triggers), the REST API's change stream reads runs in this order
    #: (``aaa_django.store.changes``)
    changed = models.BigIntegerField("change position", default=0, db_default=0, editable=False)

    class Meta:
        db_table = "aaa_run"
        verbose_name = "run"
        permissions = [
            ("view_all_runs", "Can see every run, not only their own"),
            ("cancel_run", "Can cancel any run"),
            ("approve_run", "Can grant or deny any run's approvals"),
            ("answer_run", "Can answer any run's questions"),
            ("erase_run", "Can erase any run"),
            ("import_run", "Can import runs from an export file"),
        ]
        indexes = [
            models.Index(fields=["owner", "-started_at"], name="aaa_run_owner_started"),
            models.Index(fields=["-started_at"], name="aaa_run_started"),
            models.Index(fields=["status"], name="aaa_run_status"),
            models.Index(fields=["algorithm"], name="aaa_run_algorithm"),
            models.Index(fields=["parent"], name="aaa_run_parent"),
            models.Index(fields=["forked_from"], name="aaa_run_forked_from"),
            # retention: the due runs of an outcome, oldest first
            models.Index(fields=["outcome", "ended_at"], name="aaa_run_outcome_ended"),
            models.Index(fields=["due_at"], name="aaa_run_due", condition=models.Q(due_at__isnull=False)),
            models.Index(fields=["changed", "run_id"], name="aaa_run_changed"),
        ]

    def __str__(self) -> str:
        return f"{self.run_id} {self.algorithm} {self.outcome or self.status}"

    @property
    def redriven(self) -> datetime.datetime | None:
        """When the sweeper last re-drove the run (UTC), or None."""
        if self.redriven_at is None:
            return None
        return datetime.datetime.fromtimestamp(self.redriven_at, datetime.UTC)

    @property
    def adopted(self) -> datetime.datetime | None:
        """When a process last adopted the run (UTC), or None."""
        if self.adopted_at is None:
            return None
        return datetime.datetime.fromtimestamp(self.adopted_at, datetime.UTC)

    @property
    def tokens(self) -> int:
        return self.tokens_in + self.tokens_out


class HolderRecord(models.Model):
    """A process that holds run leases (:mod:`aaa_django.site.holding`): every lease of
    its lives until ``alive_until`` (seconds since the epoch, the database's clock),
    which it renews with one write however many runs it holds
    (:meth:`aaa_django.store.leases.RunLeases.renew`). Not derived from the log."""

    holder_id = models.CharField(primary_key=True, max_length=200)
    alive_until = models.FloatField()

    class Meta:
        db_table = "aaa_holder"

    def __str__(self) -> str:
        return self.holder_id


class ApiKeyQuerySet(models.QuerySet):
    """The keys by :attr:`ApiKey.state`: ``active()``, ``expired()``, ``revoked()``."""

    def active(self) -> ApiKeyQuerySet:
        now = timezone.now()
        return self.filter(revoked_at__isnull=True).filter(
            models.Q(expires_at__isnull=True) | models.Q(expires_at__gt=now)
        )

    def expired(self) -> ApiKeyQuerySet:
        return self.filter(revoked_at__isnull=True, expires_at__lte=timezone.now())

    def revoked(self) -> ApiKeyQuerySet:
        return self.filter(revoked_at__isnull=False)


class ApiKey(models.Model):
    """A REST API key of a user: only its SHA-256 is stored; ``prefix`` identifies it.

    Create one with :meth:`ApiKey.create_key` (or ``manage.py aaa_apikey create``),
    which returns the secret once. Revoked or expired keys authenticate nobody.
    """

    #: the start of every key, so a leaked key is recognisable in logs and scanners
    SCHEME = "aaa_"
    PREFIX_LENGTH = 12

    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="aaa_api_keys")
    name = models.CharField(max_length=100, blank=True, default="")
    prefix = models.CharField(max_length=16, db_index=True, editable=False)
    hashed = models.CharField("SHA-256 of the key", max_length=64, unique=True, editable=False)
    created_at = models.DateTimeField(default=timezone.now, editable=False)
    last_used_at = models.DateTimeField(null=True, blank=True, editable=False)
    expires_at = models.DateTimeField(null=True, blank=True)
    revoked_at = models.DateTimeField(null=True, blank=True)

    objects = ApiKeyQuerySet.as_manager()

    class Meta:
        db_table = "aaa_apikey"
        verbose_name = "API key"

    def __str__(self) -> str:
        state = " (revoked)" if self.revoked_at else ""
        return f"{self.prefix}… {self.name or self.user}{state}"

    @staticmethod
    def hash(raw: str) -> str:
        return hashlib.sha256(raw.encode("utf-8")).hexdigest()

    @classmethod
    def generate(cls) -> str:
        """A new random key: ``aaa_`` and 43 URL-safe characters (256 bits)."""
        return cls.SCHEME + secrets.token_urlsafe(32)

    @classmethod
    def create_key(
        cls, user: AbstractBaseUser, *, name: str = "", expires_in: timedelta | None = None, using: str | None = None
    ) -> tuple[ApiKey, str]:
        """Store a new key for ``user``; return it and its secret (shown only now)."""
        raw = cls.generate()
        key = cls(
            user=user,
            name=name,
            prefix=raw[: cls.PREFIX_LENGTH],
            hashed=cls.hash(raw),
            expires_at=timezone.now() + expires_in if expires_in else None,
        )
        key.save(using=using)
        return key, raw

    @property
    def active(self) -> bool:
        if self.revoked_at is not None:
            return False
        return self.expires_at is None or self.expires_at > timezone.now()

    @property
    def state(self) -> str:
        """``"active"``, ``"expired"`` or ``"revoked"`` (a revoked key is revoked
        whether or not it has expired since)."""
        if self.revoked_at is not None:
            return "revoked"
        return "active" if self.active else "expired"

    def revoke(self) -> None:
        if self.revoked_at is None:
            self.revoked_at = timezone.now()
            self.save(update_fields=["revoked_at"])
