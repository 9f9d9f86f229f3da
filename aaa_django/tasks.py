"""Celery tasks of the app, found by ``app.autodiscover_tasks()``: ``aaa.deliver`` (the
distributed bus), ``aaa.sweep`` (the sweeper) and ``aaa.retain`` (retention). See
:mod:`aaa_django.celery.bus` and :mod:`aaa_django.site.retention`."""

from typing import Any

from celery import shared_task

from .celery.bus import deliver, sweep

__all__ = ["deliver", "retain", "sweep"]

RETAIN = "aaa.retain"


@shared_task(name=RETAIN, ignore_result=True)
def retain(using: str = "default", dry_run: bool = False) -> dict[str, Any]:
    """Retention as a Celery (beat) task: apply ``AAA["RETENTION"]`` and sweep orphaned
    blobs (``aaa_django.site.retention.BEAT_SCHEDULE``); returns a summary."""
    from .site.retention import retain as apply

    return apply(using, dry_run=dry_run).summary()
