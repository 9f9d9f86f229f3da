"""Fixtures of the Celery tests: a broker, real worker processes, an engine on the bus.

  celery_env   (session; tests/conftest.py) the environment of the worker processes.
  cluster      (session) two worker processes (prefork, one child each) consuming
               every queue; shared by the tests that do not kill workers.
  new_cluster  a factory of workers of the test's own, on queues of their own
               (``new_cluster(2, suffix="-fault")``; pass ``cluster.queues`` to
               ``make_engine``), stopped at the test's end.
  arun         run a coroutine from the (sync) test, on the test's thread's DB
               connection.
  redis        a client on the broker's database (what the test tools record).
  broker       (parametrised: redis, rabbitmq) a :class:`Broker`: the Celery app the
               pytest process sends with, and what the workers' environment needs.

Tests here are ``transaction=True`` on the ``postgres`` alias: the workers must see
what the test commits, and the test what the workers commit.
"""

from __future__ import annotations

import asyncio
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Awaitable

import pytest
from asgiref.sync import async_to_sync

from .workers import Cluster

# "default" too: pytest-django sets up "postgres" only after "default" (TEST DEPENDENCIES).
CELERY_DB = pytest.mark.django_db(databases=["default", "postgres"], transaction=True)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    here = Path(__file__).parent
    for item in items:
        if here in Path(str(item.fspath)).parents:
            item.add_marker(pytest.mark.celery)
            item.add_marker(pytest.mark.redis)
            item.add_marker(pytest.mark.postgres)


@pytest.fixture(scope="session")
def cluster(celery_env, tmp_path_factory):
    c = Cluster(celery_env, tmp_path_factory.mktemp("celery"))
    try:
        c.start(2)
        yield c
    finally:
        c.stop()


@pytest.fixture
def new_cluster(celery_env, tmp_path_factory):
    clusters: list[Cluster] = []

    def make(count: int = 2, *, suffix: str, env: dict[str, str] | None = None, **kw) -> Cluster:
        env = {**celery_env, **(env or {}), "AAA_TEST_QUEUE_SUFFIX": suffix}
        c = Cluster(env, tmp_path_factory.mktemp("celery"))
        clusters.append(c)
        c.start(count, **kw)
        return c

    yield make
    for c in clusters:
        c.stop()


#: seconds a test's coroutine may take: a hang fails the test, with a traceback that
#: shows where it was waiting, instead of stalling the suite
ARUN_TIMEOUT = 180


@pytest.fixture
def arun():
    def run(coro: Awaitable[Any], timeout: float = ARUN_TIMEOUT) -> Any:
        async def main():
            return await asyncio.wait_for(coro, timeout)

        return async_to_sync(main)()

    return run


@pytest.fixture
def redis(celery_env):
    import redis as redis_py

    return redis_py.Redis.from_url(celery_env["AAA_TEST_CELERY_BROKER"], decode_responses=True)


def make_engine(queues: dict[str, str] | None = None, *, app: Any = None, **kw):
    """An engine on the test database whose bus is the Celery bus (on ``queues``; by
    default the shared workers' queues), sending with ``app`` (default: the Redis one),
    and the workers' blob store (see ``worker_settings``)."""
    from django.core.files.storage import FileSystemStorage

    from aaa_django.celery.bus import DistributedBus
    from aaa_django.site.blobs import StorageBlobStore
    from aaa_django.site.engines import build_engine

    from .workers import queue_names

    kw.setdefault("poll_interval", 0.05)
    kw.setdefault("blobs", StorageBlobStore(FileSystemStorage(location=os.environ["AAA_TEST_BLOB_DIR"])))
    return build_engine(using="postgres", bus=DistributedBus(queues=queues or queue_names(), app=app), **kw)


@dataclass
class Broker:
    """A broker the Celery tests run on: its name, the Celery app the pytest process
    sends with, and the workers' environment for it."""

    name: str
    app: Any
    env: dict[str, str]

    def suffix(self, what: str) -> str:
        """Queue names of a test's own on this broker: per pytest-xdist worker too (one
        RabbitMQ serves them all; Redis has a database each)."""
        return f"-{what}-{self.name}-{os.environ.get('PYTEST_XDIST_WORKER', 'gw0')}"


BROKERS = ["redis", "rabbitmq"]


@pytest.fixture(params=BROKERS)
def broker(request, celery_env) -> Broker:
    return _broker(request)


def _broker(request) -> Broker:
    if request.param == "redis":
        from tests.celery_app import app

        return Broker("redis", app, {})
    url = request.getfixturevalue("amqp_url")
    return Broker("rabbitmq", _rabbitmq_app(url), {"AAA_TEST_BROKER_URL": url})


_apps: dict[str, Any] = {}


def _rabbitmq_app(url: str) -> Any:
    from celery import Celery

    app = _apps.get(url)
    if app is None:
        app = _apps[url] = Celery("aaa_tests_rabbitmq", broker=url, set_as_current=False)
        app.conf.update(task_ignore_result=True, broker_connection_retry_on_startup=True)
    return app
