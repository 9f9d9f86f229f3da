"""Celery tasks of the app, found by ``app.autodiscover_tasks()``: ``aaa.deliver`` (the
distributed bus) and ``aaa.sweep`` (the sweeper). See :mod:`aaa_django.bus`."""

from .bus import deliver, sweep

__all__ = ["deliver", "sweep"]
