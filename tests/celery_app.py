"""The Celery app of the test suite: ``celery -A tests.celery_app worker``.

Configured from the environment the worker fixture (tests/celery/workers.py) sets:
AAA_TEST_CELERY_BROKER (a Redis URL, one database per pytest-xdist worker; the broker
unless AAA_TEST_BROKER_URL names another, e.g. RabbitMQ's) and, in the
worker processes, DJANGO_SETTINGS_MODULE=tests.celery.worker_settings (the test
database's name comes in AAA_TEST_WORKER_DB). In the pytest process it only needs the
broker, to send tasks.
"""

from __future__ import annotations

import os
from pathlib import Path

from celery import Celery
from celery.signals import worker_ready

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tests.settings")

app = Celery("aaa_tests")
app.conf.update(
    broker_url=os.environ.get("AAA_TEST_BROKER_URL")
    or os.environ.get("AAA_TEST_CELERY_BROKER", "redis://127.0.0.1:6379/1"),
    broker_connection_retry_on_startup=True,
    # Restore a message taken by a worker that died (not only its child) after this
    # long; tasks here are short. (A site sets it above its longest task.)
    broker_transport_options={"visibility_timeout": 8},
    task_ignore_result=True,
    worker_prefetch_multiplier=1,
    worker_hijack_root_logger=False,
    worker_send_task_events=False,
)
app.autodiscover_tasks(["aaa_django"])
app.set_default()  # also the app of threads other than the one that imported this


@worker_ready.connect
def _touch_ready_file(**kwargs):
    path = os.environ.get("AAA_TEST_WORKER_READY")
    if path:
        Path(path).write_text(str(os.getpid()))


@app.task(name="tests.warm", bind=True, acks_late=True, ignore_result=True)
def warm(self, spec: list, done_dir: str) -> None:
    """Build this worker process's engine for ``spec`` now, as its first delivery would
    (``Cluster.warm``): a site's WORKER_SETUP may import a lot and start MCP servers, and
    a test's clock must not include that. ``acks_late``: a worker busy warming holds its
    one message, so the next warm-up goes to another worker. A failure is written in
    the worker's file: the test fails at once with it, not at the warm-up's bound."""
    import traceback

    from aaa_django.celery.worker import runtime

    try:
        runtime().engine(spec, self.app)  # as aaa.deliver builds it
    except Exception:
        failed = Path(f"{done_dir}-{os.getpid()}.failed")
        failed.write_text(traceback.format_exc())
        failed.rename(Path(done_dir, str(os.getpid())))  # (whole, at once)
        raise
    Path(done_dir, str(os.getpid())).touch()
