"""The ``bus`` fixture: every test here runs once per bus.

inprocess  memory store, asyncio bus, this process.
celery     PostgreSQL store, Redis broker, real Celery workers: two worker
           processes of two prefork children each (so tool calls of one run do
           run at once, and a pool must hold across processes), on queues of their
           own (their WORKER_SETUP, ``tests.celery.site.setup``, serves these runs
           too, as every test worker's does). Started
           once per session (per pytest-xdist worker).
"""

from __future__ import annotations

import pytest

from tests.celery.conftest import CELERY_DB

from .harness import Celery, InProcess

BUSES = [
    pytest.param("inprocess", id="inprocess"),
    pytest.param("celery", id="celery", marks=[CELERY_DB, pytest.mark.celery, pytest.mark.redis, pytest.mark.postgres]),
]


@pytest.fixture(scope="session")
def scenario_cluster(celery_env, tmp_path_factory):
    from tests.celery.workers import Cluster

    env = {**celery_env, "AAA_TEST_QUEUE_SUFFIX": "-scenarios"}
    cluster = Cluster(env, tmp_path_factory.mktemp("scenarios"))
    try:
        cluster.start(2, concurrency=2)
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture(params=BUSES)
def bus(request):
    """The :class:`~tests.scenarios.harness.Harness` of one bus."""
    if request.param == "inprocess":
        return InProcess()
    cluster = request.getfixturevalue("scenario_cluster")
    return Celery(cluster, request.getfixturevalue("celery_env")["AAA_TEST_CELERY_BROKER"])
