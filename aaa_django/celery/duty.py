"""The cluster's periodic duty: due times fired and stalled runs re-driven, by the
workers a site starts as usual (``celery -A proj worker``), with no beat process.

Every worker of a site whose ``AAA["BUS"]`` is ``"celery"`` runs a timer in its main
process (a worker bootstep, :class:`DutyStep`, added when the worker starts). Every
``AAA["DUTY_EVERY"]`` seconds each worker asks Redis for the cluster's turn (``SET NX
PX``: the first to ask in each period gets it); the one that gets it sends one
``aaa.tick`` task to the algorithms queue, and whichever worker takes it:

- fires what has come due (:func:`aaa_django.celery.sweeper.fire_due`): a run past its
  deadline ends ``timeout``, an approval past its expiry is recorded expired; the
  run index keeps the due times, so a timer costs no message and no memory while it
  waits (a deadline fires within about ``DUTY_EVERY`` seconds of its time);
- every ``AAA["STALL_AFTER"] / 2`` seconds (a turn of its own), sweeps instead (which
  fires first): runs nothing is working on are re-driven, so a whole worker
  SIGKILLed, or a broker restarted without persistence, needs no human.

- adopts the runs whose holder is gone (:func:`aaa_django.celery.sweeper.adopt`): a
  worker process that stopped renewing its leases (killed, cut off) for
  ``AAA["RUN_LEASE_TTL"]`` seconds, or one of its own machine known to be dead,
  loses its runs to the worker that takes the tick, which re-drives them.

The cluster does each once per period however many workers it has. The main process
makes one Redis call per period and, with the turn, publishes one message; the work
runs in the pool like any task. Celery's own lines about the tick ("received",
"succeeded") are logged at DEBUG (:class:`QuietDuty`): a worker's ``-l info`` log
shows the duty only when it did something (fired a due time, adopted or re-drove a
run). A worker that starts lets the leases of its machine's dead processes lapse at
once (:func:`_release_the_dead`): a worker restarted after a crash has its
predecessor's runs adopted at the next tick. With no worker up nothing fires (nothing could
deliver either); the first worker up fires what came due meanwhile.
``AAA["DUTY_EVERY"] = 0`` turns the duty off (then run ``aaa.sweep`` on a schedule of
your own, or ``manage.py aaa_sweep``).

At the same start a worker that takes none of the app's queues (``-Q`` of other
queues only) says so in its log: runs would not move on it.
"""

from __future__ import annotations

import logging
from typing import Any

from celery import Celery, bootsteps
from celery.signals import celeryd_init, worker_ready

from aaa_django.conf import aaa_settings, redis_url
from aaa_django.site.holding import process_gone
from aaa_django.store.leases import RunLeases

from .bus import _queues
from .coordination import Coordinator

log = logging.getLogger("aaa_django.bus")

#: the duty's task name
TICK = "aaa.tick"


def install() -> None:
    """Hook the duty into every worker this process starts (``AaaConfig.ready``)."""
    celeryd_init.connect(_add_step, dispatch_uid="aaa_django.celery.duty")
    worker_ready.connect(_check_queues, dispatch_uid="aaa_django.celery.duty.queues")
    worker_ready.connect(_release_the_dead, dispatch_uid="aaa_django.celery.duty.dead")
    quiet = QuietDuty()
    for name in QuietDuty.LOGGERS:
        logger = logging.getLogger(name)
        if not any(isinstance(f, QuietDuty) for f in logger.filters):
            logger.addFilter(quiet)


class QuietDuty(logging.Filter):
    """Celery's lines about each ``aaa.tick`` ("Task aaa.tick[...] received", "...
    succeeded in ...") at DEBUG, not INFO: a tick comes every ``DUTY_EVERY`` seconds,
    and the duty logs what it did itself. Celery passes each such line's context as
    the record's ``data`` for custom handlers (``celery.app.trace.info``); this filter
    reads its task name there."""

    #: the loggers of those lines (the worker's strategy: "received"; the trace: the rest)
    LOGGERS = ("celery.app.trace", "celery.worker.strategy")

    def filter(self, record: logging.LogRecord) -> bool:
        data = getattr(record, "data", None)
        if record.levelno != logging.INFO or not isinstance(data, dict) or data.get("name") != TICK:
            return True
        record.levelno, record.levelname = logging.DEBUG, logging.getLevelName(logging.DEBUG)
        return logging.getLogger(record.name).isEnabledFor(logging.DEBUG)


def _release_the_dead(sender: object = None, **kwargs: object) -> None:
    """worker_ready (the main process): let the leases of this machine's processes that
    have ended lapse now (:func:`aaa_django.site.holding.process_gone`), so the next
    tick adopts their runs: a worker restarted after a crash does not wait for its
    predecessor's leases to run out."""
    conf = aaa_settings()
    if conf["BUS"] != "celery" or not conf["DUTY_EVERY"]:
        return
    leases = RunLeases(conf["DUTY_DATABASE"])
    try:
        dead = [h for h in leases.holders() if process_gone(h)]
        released = sum(len(leases.release(h)) for h in dead)
        if released:
            log.info(
                "released the leases of %d runs held by %d ended processes of this machine: the next "
                "duty pass adopts them",
                released,
                len(dead),
            )
    except Exception:
        log.warning(
            "could not look for the runs of this machine's ended processes; their leases lapse by themselves",
            exc_info=True,
        )
    finally:
        leases.close()


def _add_step(sender: object = None, instance: Any = None, **kwargs: object) -> None:
    # celeryd_init comes before the worker builds its blueprint from app.steps.
    conf = aaa_settings()
    if instance is not None and conf["BUS"] == "celery" and conf["DUTY_EVERY"]:
        instance.app.steps["worker"].add(DutyStep)


class DutyStep(bootsteps.StartStopStep):
    """The worker's timer for the cluster's duty (Celery's documented way to run
    something periodically in a worker: a step on the worker's ``timer``)."""

    requires = {"celery.worker.components:Timer"}

    def __init__(self, worker: Any, **kwargs: Any) -> None:
        super().__init__(worker, **kwargs)
        self.duty: Duty | None = None
        self.tref: Any = None

    def start(self, worker: Any) -> None:
        self.duty = Duty(worker.app)
        self.tref = worker.timer.call_repeatedly(self.duty.every, self.duty.tick, priority=10)

    def stop(self, worker: Any) -> None:
        if self.tref is not None:
            self.tref.cancel()
            self.tref = None


class Duty:
    """One worker's side of the duty: take the cluster's turn, send the tick."""

    #: seconds the main process waits for Redis at most (it runs the worker's loop)
    REDIS_TIMEOUT = 2.0

    def __init__(self, app: Celery) -> None:
        conf = aaa_settings()
        self.app = app
        self.every = float(conf["DUTY_EVERY"])
        self.using = conf["DUTY_DATABASE"]
        self.queue = _queues()["algorithms"]
        url = redis_url()
        self.coordinator = Coordinator(url, socket_timeout=self.REDIS_TIMEOUT) if url else None
        #: ticks this worker sent (the others' turns are not counted)
        self.sent = 0

    def tick(self) -> None:
        if self.coordinator is None:
            return  # no Redis: aaa.E103 says so
        try:
            # A little less than a period, so the next period's turn is free again.
            if not self.coordinator.take_turn(f"duty:{self.queue}", self.every * 0.9):
                return
            # A tick that waited long in the queue is dropped: the next one does its work.
            self.app.send_task(
                TICK,
                kwargs={"using": self.using},
                queue=self.queue,
                expires=max(10.0, self.every * 5),
                ignore_result=True,
            )
            self.sent += 1
        except Exception:
            log.warning("the periodic duty could not take its turn; trying again in %.1f s", self.every, exc_info=True)


def _check_queues(sender: Any = None, **kwargs: object) -> None:
    # worker_ready: ``sender`` is the worker's consumer.
    if aaa_settings()["BUS"] != "celery" or sender is None:
        return
    ours = sorted(set(_queues().values()))
    taken = set(sender.app.amqp.queues.consume_from)
    if not taken & set(ours):
        log.warning(
            "this worker takes none of aaa_django's queues (%s); it takes %s. Runs move only "
            "on workers that take them: start one with -Q %s, or leave AAA['CELERY_QUEUES'] "
            "unset to use the default queue.",
            ", ".join(ours),
            ", ".join(sorted(taken)) or "nothing",
            ",".join(ours),
        )
