"""The example site's Celery app: `celery -A project worker`.

Configured from Django settings prefixed CELERY_ (e.g. CELERY_BROKER_URL)."""

import os

from celery import Celery
from celery.signals import worker_init, worker_process_init

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "project.settings")

app = Celery("project")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()


@worker_init.connect
@worker_process_init.connect
def _collector(**_: object) -> None:
    """The worker's collector as the site sets it (project/collector.py): in the worker's
    main process, and in each pool process once it has started."""
    from project.collector import tune

    tune()
