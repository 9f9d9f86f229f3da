"""Django signals of a run's life, sent once its events are committed.

=====================  =========================================================
signal                 keyword arguments (besides ``sender``, the engine)
=====================  =========================================================
``run_started``        ``run_id``, ``event`` (``aaa.run.started``), ``algorithm``
``run_ended``          ``run_id``, ``event`` (``aaa.run.completed``), ``outcome``
                       (an :class:`~aaa_django.runtime.Outcome`)
``approval_requested`` ``run_id``, ``event`` (``aaa.approval.requested``),
                       ``request_id`` (what ``engine.approve`` takes), ``tool``
``event_appended``     ``run_id``, ``event`` (every event, the four above too)
=====================  =========================================================

They are sent by the process that appended the event, after the transaction that
appended it commits (``transaction.on_commit``): an append rolled back with the
caller's transaction sends nothing. In a cluster that is the Celery worker whose
delivery appended it (a run's start: the process that started it); receivers run
there, so connect them in code every process imports (an ``AppConfig.ready``).
An event is sent once per process that appended it (an event absorbed as a duplicate
is not sent again). Receivers run in a thread of their own, not on the engine's event
loop (the ORM is theirs to use); their errors are logged and dropped
(``send_robust``): a receiver never stops a run. An ``event``'s ``data`` is as stored:
a claim-checked event carries its ``$claim`` stub and its hot fields.

The engines the site's settings build (:func:`~aaa_django.site.engines.build_engine`: the
web process's host, the commands, every Celery worker) send them; an engine of your
own does with ``engine.observe(SignalSender(engine, using))``.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from functools import partial

from asgiref.sync import sync_to_async
from django.db import transaction
from django.dispatch import Signal

from .events import Event
from .runtime.event_types import APPROVAL_REQUESTED, RUN_COMPLETED, RUN_STARTED
from .runtime.outcome import Outcome

log = logging.getLogger("aaa_django.signals")

run_started = Signal()
run_ended = Signal()
approval_requested = Signal()
event_appended = Signal()

SIGNALS = (run_started, run_ended, approval_requested, event_appended)


class SignalSender:
    """The engine observer that sends the signals above for ``engine``'s appends to
    the database alias ``using`` (None: a store without transactions, e.g. Redis).
    Told of appends only (an :class:`~aaa_django.runtime.observe.AppendObserver`):
    nothing is entered around the engine's deliveries for it."""

    def __init__(self, engine: object, using: str | None = "default") -> None:
        self.engine = engine
        self.using = using

    async def appended(self, events: Sequence[Event]) -> None:
        if not any(s.receivers for s in SIGNALS):
            return  # nobody listens: no thread hop (has_listeners() takes a lock: slower per append)
        # on_commit must be called in the thread that owns the store's connection (and
        # the caller's transaction): the thread-sensitive executor the store runs in.
        await sync_to_async(self._after_commit, thread_sensitive=True)(list(events))

    def _after_commit(self, events: list[Event]) -> None:
        if self.using is None:
            self.send(events)
        else:
            transaction.on_commit(partial(self.send, events), using=self.using)

    def send(self, events: Sequence[Event]) -> None:
        """Send the signals of ``events`` (committed) now."""
        for e in events:
            kw: dict[str, object] = {"run_id": e.stream, "event": e}
            if e.type == RUN_STARTED:
                self._send(run_started, **kw, algorithm=e.data.get("algorithm"))
            elif e.type == RUN_COMPLETED:
                self._send(run_ended, **kw, outcome=Outcome.from_dict(e.data))
            elif e.type == APPROVAL_REQUESTED:
                self._send(approval_requested, **kw, request_id=e.id, tool=e.data.get("name"))
            self._send(event_appended, **kw)

    def _send(self, signal: Signal, **kw: object) -> None:
        for receiver, result in signal.send_robust(self.engine, **kw):
            if isinstance(result, Exception):
                log.error(
                    "a receiver of an aaa_django signal failed: %r",
                    receiver,
                    exc_info=(type(result), result, result.__traceback__),
                )
