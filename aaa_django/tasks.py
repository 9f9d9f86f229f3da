"""Celery tasks of the app, found by ``app.autodiscover_tasks()`` (which imports the
installed app's ``tasks`` module): ``aaa.deliver`` (the distributed bus), ``aaa.sweep``
(the sweeper), ``aaa.tick`` (the workers' periodic duty) and ``aaa.retain``
(retention), defined in :mod:`aaa_django.celery.tasks`."""

from .celery.tasks import RETAIN, deliver, retain, sweep, tick

__all__ = ["RETAIN", "deliver", "retain", "sweep", "tick"]
