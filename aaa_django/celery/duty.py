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

The cluster does each once per period however many workers it has. The main process
makes one Redis call per period and, with the turn, publishes one message; the work
runs in the pool like any task. With no worker up nothing fires (nothing could
deliver either); the first worker up fires what came due meanwhile.
``AAA["DUTY_EVERY"] = 0`` turns the duty off (then run ``aaa.sweep`` on a schedule of
your own, or ``manage.py aaa_sweep``).

At the same start a worker that takes none of the app's queues (``-Q`` of other
queues only) says so in its log: runs would not move on it.
"""

from __future__ import annotations

import logging
from typing import Any

from celery import bootsteps
from celery.signals import celeryd_init, worker_ready

from aaa_django.conf import aaa_settings, redis_url

from .bus import _queues
from .coordination import Coordinator

log = logging.getLogger("aaa_django.bus")

#: the duty's task name
TICK = "aaa.tick"


def install() -> None:
    """Hook the duty into every worker this process starts (``AaaConfig.ready``)."""
    celeryd_init.connect(_add_step, dispatch_uid="aaa_django.celery.duty")
    worker_ready.connect(_check_queues, dispatch_uid="aaa_django.celery.duty.queues")


def _add_step(sender: Any = None, instance: Any = None, **kwargs: Any) -> None:
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

    def __init__(self, app: Any) -> None:
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
            self.app.send_task(TICK, kwargs={"using": self.using}, queue=self.queue,
                               expires=max(10.0, self.every * 5), ignore_result=True)
            self.sent += 1
        except Exception:
            log.warning("the periodic duty could not take its turn; trying again in %.1f s",
                        self.every, exc_info=True)


def _check_queues(sender: Any = None, **kwargs: Any) -> None:
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
            ", ".join(ours), ", ".join(sorted(taken)) or "nothing", ",".join(ours))
