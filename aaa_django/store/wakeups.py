"""What wakes a waiter for a run (an event stream, ``Engine.wait``) on each database:
the hubs of :mod:`aaa_django.runtime.wakeups`, one per database alias and process.

- PostgreSQL: the store NOTIFYs channel :data:`CHANNEL` with a stream's id after each
  append to it, and after an erasure, once the write committed (:func:`notify`, sent
  by the process's :class:`Notifier`). One
  connection per process LISTENs, on a thread of its own (:class:`Listener`), and
  wakes the subscriptions to that run, sync (WSGI) and async (ASGI, an engine's loop)
  alike. A stream that waits holds no database connection, and reads only when
  woken. Should the listening connection drop, every subscription is woken and its
  waiter polls until it is back (then all are woken again: nothing that committed
  meanwhile is missed).

  A notification's payload is the stream's id: it wakes the subscriptions that want
  every append (event streams), and those to :data:`ANY` (the change stream of many
  runs). An append that ends the run (its batch stored
  ``aaa.run.completed``) and an erasure send a second one, :data:`ENDED` and the id
  (:func:`ended`), which wakes the subscriptions that want only the run's end
  (``Engine.wait``, subscribed ``ends_only``): a run's dozen appends before its end
  wake no wait (each would cost the wait a read of the run). So does an append after
  which the run may wait for a person (a reply, a question): ``Run.waiting`` waits
  for that or the end, subscribed ``ends_only`` too. Within a deploy, a
  listener of the previous version reads the plain id as before (the marked one
  names no stream it has); a wait in a new process on a run that an old one ends is
  not woken by it, and finds the end at its next poll.
- Any other database: a :class:`~aaa_django.runtime.wakeups.Hub`, woken only by what
  this process learns (its engine's ends, a bus's notices); a stream polls
  (``aaa_django.api.stream.POLL``).

Why after the commit, from a thread of its own, and not by a trigger: a NOTIFY takes
a database-wide lock from the moment it is queued to the end of its transaction's
commit, so appends that notify inside their transaction wait for one another's fsync
(8 concurrent appenders: 0.37-0.52x the appends per second without, under load;
``benchmarks/bench_notify.py``). The :class:`Notifier` commits its NOTIFY without
waiting for the disk (``synchronous_commit`` off for that transaction only: a
notification is not durable anyway), so it holds the lock for microseconds, and the
append does not wait for it at all.

:func:`for_database` picks one per database alias, once.
"""

from __future__ import annotations

import asyncio
import logging
import os
import threading
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING

from django.db import connections, transaction

from aaa_django.events import Event
from aaa_django.runtime.event_types import MESSAGE_SENT, QUESTION_ASKED, RUN_COMPLETED
from aaa_django.runtime.wakeups import Hub, Subscription, Wakeups

if TYPE_CHECKING:
    import psycopg
    from psycopg.rows import TupleRow

__all__ = [
    "ANY",
    "CHANNEL",
    "ENDED",
    "Listener",
    "Notifier",
    "ended",
    "for_database",
    "notify",
    "notify_committed",
    "stop_all",
]

log = logging.getLogger("aaa_django.wakeups")

#: the channel the store notifies (a stream's id as the payload)
CHANNEL = "aaa_events"
#: the start of a payload that says its stream ended (or was erased): ENDED + the id
#: (a control character: no run id starts with it, and an old listener wakes no one)
ENDED = "\x1fended "
#: the subscription woken by an append to any stream (the REST API's change stream)
#: (a control character: no run id starts with it)
ANY = "\x1fany"
#: one statement, its own transaction: the commit does not wait for the disk
NOTIFY = "SELECT set_config('synchronous_commit', 'off', true), pg_notify(%s, s) FROM unnest(%s::text[]) AS s"
#: seconds without a notification after which the listener checks its connection
PING = 10.0
#: seconds before the listener connects again after losing its connection
RECONNECT = 1.0


class Listener(Hub):
    """A hub woken by one LISTENing connection to the PostgreSQL database ``using``,
    opened on the first subscription in a process (and again in a forked child), on a
    daemon thread that wakes the subscriptions of each notification's run."""

    def __init__(self, using: str) -> None:
        super().__init__()
        self.using = using
        self._listening = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._pid = 0

    def subscribe(
        self, stream: str, loop: asyncio.AbstractEventLoop | None = None, *, ends_only: bool = False
    ) -> Subscription:
        with self._lock:
            if self._pid != os.getpid():  # first use here (or a fork's child): start anew
                self._pid, self._subs, self._thread = os.getpid(), {}, None
                self._listening = threading.Event()
            if self._thread is None or not self._thread.is_alive():
                self._stop.clear()
                self._thread = threading.Thread(target=self._run, daemon=True, name=f"aaa-listen-{self.using}")
                self._thread.start()
        return super().subscribe(stream, loop, ends_only=ends_only)

    def reliable(self) -> bool:
        return self._listening.is_set()

    def listening(self, timeout: float) -> bool:
        """Wait until the connection listens (tests, and a process warming up)."""
        return self._listening.wait(timeout)

    def stop(self) -> None:
        """End the thread and close its connection (within a second)."""
        self._stop.set()
        thread = self._thread
        if thread is not None:
            thread.join()

    def heard(self, payload: str) -> None:
        """Wake whom a notification's ``payload`` concerns: a stream's id, the
        subscriptions that want every append (and those to :data:`ANY`);
        :data:`ENDED` and the id, those that want only the run's end (the others heard
        of it by the plain id)."""
        if payload.startswith(ENDED):
            self._wake_kind(payload[len(ENDED) :], ends_only=True)
        else:
            self._wake_kind(payload, ends_only=False)
            self._wake_kind(ANY, ends_only=False)

    def _connect(self) -> psycopg.Connection[TupleRow]:
        import psycopg

        # Django's own parameters for the alias (host, port, user, OPTIONS...), on a
        # connection of our own: never one of Django's, nor one from its pool.
        params = connections[self.using].get_connection_params()
        return psycopg.Connection.connect(**params, autocommit=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                with self._connect() as conn:
                    conn.execute(f"LISTEN {CHANNEL}")
                    # whatever committed before we listened: read it. Woken before it
                    # says it listens, so whoever waited for listening() has had it.
                    self.wake()
                    self._listening.set()
                    heard = time.monotonic()
                    while not self._stop.is_set():
                        for note in conn.notifies(timeout=1.0):  # then look at _stop
                            heard = time.monotonic()
                            self.heard(note.payload)
                        if time.monotonic() - heard >= PING:
                            heard = time.monotonic()
                            conn.execute("SELECT 1")  # a dead connection raises here
            except Exception as exc:  # the server went away, or never came: poll meanwhile
                log.warning(
                    "aaa_django: listening for new events on %r failed (%s); event streams poll until it is back",
                    self.using,
                    exc,
                )
            finally:
                was = self._listening.is_set()
                self._listening.clear()
                if was:
                    self.wake()  # every waiting stream: poll now
            self._stop.wait(RECONNECT)


#: the events after which a run may have ended or wait for a person (a reply, a question)
SETTLING = frozenset({RUN_COMPLETED, MESSAGE_SENT, QUESTION_ASKED})


def ended(stored: Sequence[Event]) -> bool:
    """Did an append that stored the events ``stored`` end their run, or make it wait
    for a person? (Then its notification says so: :data:`ENDED`.)"""
    return any(e.type in SETTLING for e in stored)


def notify(using: str, streams: list[str], *, committed: bool = False, ended: bool = False) -> None:
    """Tell the listeners of database ``using`` (PostgreSQL; elsewhere nothing) that
    ``streams`` moved, once the caller's transaction commits (never if it rolls back);
    ``committed``: the write has committed already, on a connection of its own (the
    async store's), whatever transaction the calling thread is in; ``ended``: the
    write ended them (a run's completion, an erasure), and the waits for their end
    are woken too. It only hands them to the process's :class:`Notifier`: the append
    does not wait."""
    connection = connections[using]
    if connection.vendor != "postgresql" or not streams:
        return
    notifier = _notifier(using)
    if connection.in_atomic_block and not committed:
        transaction.on_commit(lambda: notifier.add(streams, ended=ended), using=using)
    else:
        notifier.add(streams, ended=ended)


def notify_committed(using: str, streams: list[str], *, ended: bool = False) -> None:
    """:func:`notify` of a write committed already on PostgreSQL database ``using`` (the
    async store's appends): straight to the process's :class:`Notifier`, without
    looking up Django's connection (a thread-local lookup per append)."""
    if streams:
        _notifier(using).add(streams, ended=ended)


class Notifier:
    """Sends the notifications of one database from a thread of its own, on a
    connection of its own, so an append hands its stream over and goes on: what came
    in while a NOTIFY was on its way, or within :data:`GATHER` of it, goes in the next,
    one statement for them all. The thread and its connection end after :data:`IDLE`
    seconds without work (and start again on the next): a process that has stopped
    appending holds no connection."""

    def __init__(self, using: str) -> None:
        self.using = using
        self._lock = threading.Lock()
        self._pending: set[str] = set()
        self._work = threading.Event()
        self._running = False
        self._pid = 0
        self._params: dict | None = None

    def add(self, streams: list[str], *, ended: bool = False) -> None:
        with self._lock:
            if self._pid != os.getpid():  # first use here (or a fork's child): start anew
                self._pid, self._pending, self._running = os.getpid(), set(), False
                self._work = threading.Event()
            if self._params is None:
                self._params = connections[self.using].get_connection_params()
            self._pending.update(streams)
            if ended:  # (and the plain ids: the event streams, and older listeners)
                self._pending.update(ENDED + s for s in streams)
            if not self._running:
                self._running = True
                threading.Thread(
                    target=self._run, args=(self._params,), daemon=True, name=f"aaa-notify-{self.using}"
                ).start()
        # (the thread clears it before it takes what is pending: set, it will see ours)
        if not self._work.is_set():
            self._work.set()

    def idle(self, timeout: float) -> bool:
        """Wait until everything handed over was sent and the thread ended (tests)."""
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            with self._lock:
                if not self._running:
                    return True
            time.sleep(0.01)
        return False

    def _run(self, params: dict) -> None:
        import psycopg

        conn = None
        sent = 0.0  # when the last NOTIFY went (time.monotonic)
        try:
            while True:
                if not self._work.wait(IDLE):
                    with self._lock:
                        if not self._pending:
                            self._running = False  # (under the lock: add() starts another)
                            return
                # At most one NOTIFY per GATHER: the first after a quiet spell goes at
                # once, the appends that follow it share the next. A run's appends come
                # 1-3 ms apart, and a NOTIFY each cost this thread about as much CPU as
                # the append itself (benchmarks/profile_append.py).
                wait = sent + GATHER - time.monotonic()
                if wait > 0:
                    time.sleep(wait)
                self._work.clear()
                with self._lock:
                    batch, self._pending = sorted(self._pending), set()
                if not batch:
                    continue
                try:
                    if conn is None:
                        conn = psycopg.Connection.connect(**params, autocommit=True)
                    conn.execute(NOTIFY, [CHANNEL, batch])
                    sent = time.monotonic()
                except Exception as exc:  # the server went away: next time, a new connection
                    log.warning(
                        "aaa_django: could not notify event streams of %s (%s); they see it at their next heartbeat",
                        batch,
                        exc,
                    )
                    if conn is not None:
                        conn.close()
                    conn = None
        finally:
            if conn is not None:
                conn.close()


#: seconds the notifier's thread (and connection) waits for work before it ends
IDLE = 1.0
#: seconds between two NOTIFYs of a notifier at least: what comes meanwhile goes in
#: the next (a waiting stream hears of an append at most this much later; of the first
#: after a quiet spell, at once)
GATHER = 0.025
_NOTIFIERS: dict[str, Notifier] = {}


def _notifier(using: str) -> Notifier:
    with _HUBS_LOCK:
        notifier = _NOTIFIERS.get(using)
        if notifier is None:
            notifier = _NOTIFIERS[using] = Notifier(using)
        return notifier


_HUBS: dict[str, Wakeups] = {}
_HUBS_LOCK = threading.Lock()


def for_database(using: str) -> Wakeups:
    """The wake-ups of the process's waiters for runs of database ``using`` (one hub
    per alias and process: its event streams and its engines' ``wait``)."""
    with _HUBS_LOCK:
        hub = _HUBS.get(using)
        if hub is None:
            hub = Listener(using) if connections[using].vendor == "postgresql" else Hub()
            _HUBS[using] = hub
        return hub


def stop_all(timeout: float = 10.0) -> None:
    """Stop the process's listeners and let its notifiers finish, so that no
    connection of theirs is left open (before a test database is dropped: an open
    connection keeps it). A later subscription or append starts them again."""
    with _HUBS_LOCK:
        hubs, notifiers = list(_HUBS.values()), list(_NOTIFIERS.values())
    for hub in hubs:
        if isinstance(hub, Listener):
            hub.stop()
    for notifier in notifiers:
        notifier.idle(timeout)
