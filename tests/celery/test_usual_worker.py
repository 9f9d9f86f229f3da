"""A site's usual worker command, ``celery -A proj worker``, with no ``-Q`` and no beat:
every kind of work goes to the app's default queue unless ``AAA["CELERY_QUEUES"]``
names one, and the workers' own periodic duty fires due times. A worker that takes
none of the app's queues says so when it starts."""

from __future__ import annotations

from aaa_django.celery.bus import DistributedBus
from aaa_django.site.engines import build_engine

from .conftest import CELERY_DB
from .site import loop, script

pytestmark = [CELERY_DB]

WARNING = "takes none of aaa_django's queues"


def test_the_usual_worker_command_runs_everything(new_cluster, arun):
    plain = new_cluster(1, suffix="", env={"AAA_TEST_DEFAULT_QUEUE": "1"}, queues=None)
    elsewhere = new_cluster(1, suffix="-elsewhere", queues="aaa.elsewhere")

    async def main():
        # The site's settings name no queue: the default one (the test app's "celery").
        async with build_engine(using="postgres", bus=DistributedBus(), poll_interval=0.05) as engine:
            done = await engine.start(loop(), {"task": script(turns=3)})
            waits = await engine.start(loop(), {"task": script(turns=2, tool="gated")}, deadline=1.0)
            return await done.result(timeout=60), await waits.result(timeout=60)

    done, waits = arun(main())

    assert done.outcome == "success"
    assert waits.outcome == "timeout"  # fired by the plain worker's duty: no beat, no ETA
    (worker,) = plain.workers
    assert WARNING not in worker.log_file.read_text()
    (other,) = elsewhere.workers
    assert WARNING in other.log_file.read_text(), other.tail()
