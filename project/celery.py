"""The example site's Celery app: `celery -A project worker`.

Configured from Django settings prefixed CELERY_ (e.g. CELERY_BROKER_URL)."""

import os

from celery import Celery

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "project.settings")

app = Celery("project")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()
