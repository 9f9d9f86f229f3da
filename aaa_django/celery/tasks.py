"""The Celery tasks of the app: ``aaa.deliver`` and ``aaa.sweep`` (the distributed bus),
``aaa.tick`` (the workers' periodic duty, :mod:`aaa_django.celery.duty`), ``aaa.retain``
(retention).

Celery's autodiscovery finds them through ``aaa_django/tasks.py`` (``related_name``
"tasks" of the installed app), which imports this module.
"""

from __future__ import annotations

import logging
import random
from typing import Any

from celery import shared_task

from aaa_django.conf import aaa_settings
from aaa_django.runtime.retry import transient
from aaa_django.site.retention import retain as apply_retention
from aaa_django.store import site_store

from .bus import DELIVER, SWEEP, _queues, coordinator, store_spec
from .duty import TICK
from .engines import cluster_bus
from .failures import REDELIVERY, fault_of, give_up
from .sweeper import SweepSummary, duty
from .sweeper import sweep as sweep_runs
from .worker import runtime

RETAIN = "aaa.retain"

log = logging.getLogger("aaa_django.bus")


@shared_task(name=DELIVER, bind=True, acks_late=True, reject_on_worker_lost=True, ignore_result=True)
def deliver(self: Any, spec: list[str], stream: str, seq: int, event_id: str, wire: str | None = None) -> str:
    """Deliver one stored event to this worker's engine (``engine.handle``); ``wire``:
    the event itself, as :meth:`DistributedBus._args` writes it.

    A delivery that fails transiently (a database, Redis or broker outage, a lost
    race) before it is handed off is retried by Celery after the
    :data:`~aaa_django.celery.failures.REDELIVERY` policy's delay (the task's state says
    RETRY, with the cause); one that fails for good, or outlasts the retries, ends its
    run ``failed`` naming the cause, and the task fails with that error. (A model or
    tool call handed off, its message acknowledged, is retried the same way on the
    worker's loop: :meth:`~aaa_django.celery.worker.WorkerRuntime.deliver`.)"""
    rt = runtime()
    engine = rt.engine(spec, self.app)
    trace = cluster_bus(engine).trace
    if trace is not None:  # the run's trace context, from the message
        trace.received(stream, self.request.headers)
    retries = self.request.retries
    redelivered = bool((self.request.delivery_info or {}).get("redelivered")) or retries > 0
    try:
        return rt.deliver(engine, stream, seq, event_id, redelivered=redelivered, wire=wire, retries=retries)
    except Exception as exc:
        fault = fault_of(exc)
        delay = REDELIVERY.delay(retries + 1, random.random()) if transient(fault) else None
        if delay is not None:
            log.warning(
                "delivering %s seq %s (%s) failed: %s: %s; retry %d of %d in %.2f s",
                stream,
                seq,
                event_id,
                type(fault).__name__,
                fault,
                retries + 1,
                REDELIVERY.retries,
                delay,
            )
            raise self.retry(exc=fault, countdown=delay, max_retries=REDELIVERY.retries) from exc
        if rt.run(give_up(engine, stream, seq, event_id, fault, retries + 1)):
            log.error(
                "run %s failed: delivering seq %s (%s) failed for good: %s: %s",
                stream,
                seq,
                event_id,
                type(fault).__name__,
                fault,
            )
        if fault is exc:
            raise
        raise fault from exc


@shared_task(name=SWEEP, bind=True, ignore_result=True)
def sweep(self: Any, stall_after: float | None = None, using: str = "default") -> SweepSummary:
    """The sweeper as a Celery task (for a schedule of the site's own: the workers'
    duty, ``aaa.tick``, sweeps by itself): fire what is due, adopt the runs whose
    holder is gone, re-drive stalled runs; returns a summary."""
    rt = runtime()
    engine = rt.engine(duty_spec(using), self.app)
    report = rt.run(sweep_runs(engine, stall_after=stall_after, keeper=rt.keeper(using)))
    return report.summary()


@shared_task(name=TICK, bind=True, ignore_result=True)
def tick(self: Any, using: str = "default") -> SweepSummary:
    """One turn of the workers' duty: fire what has come due and adopt the runs whose
    holder is gone (:func:`~aaa_django.celery.sweeper.duty`), and (every
    ``STALL_AFTER / 2`` seconds, a turn of the cluster's own) sweep the stalled ones.
    Celery's own lines about this task are logged at DEBUG
    (:class:`~aaa_django.celery.duty.QuietDuty`); the duty logs at INFO what it did."""
    rt = runtime()
    engine = rt.engine(duty_spec(using), self.app)
    turn = f"sweep:{_queues()['algorithms']}:{using}"  # as the tick's: per cluster (its queue)
    sweeping = coordinator().take_turn(turn, float(aaa_settings()["STALL_AFTER"]) / 2)
    return rt.run(duty(engine, rt.keeper(using), sweeping=sweeping)).summary()


def duty_spec(using: str) -> list[str]:
    """The store spec of the duty's engine: the site's store on ``using``, as the web
    process's messages name it (``site_store``: it keeps the run index in step), so a
    worker process drives a run with one engine, and one set of handlers, whichever
    task took it up."""
    return store_spec(site_store(using))


@shared_task(name=RETAIN, ignore_result=True)
def retain(using: str = "default", dry_run: bool = False) -> dict[str, Any]:
    """Retention as a Celery (beat) task: apply ``AAA["RETENTION"]`` and sweep orphaned
    blobs (``aaa_django.site.retention.BEAT_SCHEDULE``); returns a summary."""
    return apply_retention(using, dry_run=dry_run).summary()
