"""The ``bus`` fixture of the Pydantic AI tests: each test runs once per bus.

  inprocess  memory store, asyncio bus, this process (``site.attach``).
  celery     PostgreSQL, Redis and two real Celery workers of their own whose
             WORKER_SETUP is ``tests.pydantic_ai.site.setup``.

``openai_server`` (session) is the local OpenAI-compatible server both talk to: started
before the workers, which find it in ``AAA_TEST_OPENAI_URL``.
"""

from __future__ import annotations

import contextlib
import os

import pytest

from aaa_django.events import FoldCache, InMemoryEventStore
from aaa_django.runtime import Engine, InProcessBus
from tests.celery.conftest import CELERY_DB

from . import site
from .openai_server import LocalOpenAIServer


@pytest.fixture(scope="session")
def openai_server():
    with LocalOpenAIServer() as server:
        os.environ["AAA_TEST_OPENAI_URL"] = server.url
        yield server


@pytest.fixture(scope="session")
def pai_cluster(celery_env, openai_server, tmp_path_factory):
    from aaa_django.celery.bus import store_spec
    from tests.celery.conftest import make_engine
    from tests.celery.workers import Cluster

    env = {
        **celery_env,
        "AAA_TEST_QUEUE_SUFFIX": "-pydantic-ai",
        "AAA_TEST_OPENAI_URL": openai_server.url,
        "AAA_TEST_WORKER_SETUP": "tests.pydantic_ai.site.setup",
    }
    cluster = Cluster(env, tmp_path_factory.mktemp("pydantic-ai"))
    try:
        cluster.start(2)
        cluster.warm(store_spec(make_engine(cluster.queues).store))
        yield cluster
    finally:
        cluster.stop()


class Bus:
    """``async with bus.engine() as engine``: an engine whose events this bus delivers."""

    def __init__(self, name: str, cluster=None) -> None:
        self.name = name
        self.cluster = cluster

    @contextlib.asynccontextmanager
    async def engine(self, *, mcp: bool = False):
        if self.cluster is None:
            engine = Engine(store=InMemoryEventStore(), bus=InProcessBus(), cache=FoldCache())
            site.attach(engine, mcp=mcp)
            async with engine:
                yield engine
        else:
            from tests.celery.conftest import make_engine

            # the workers run the calls; this engine, as a web process's, knows the tools
            # a run is offered (its handlers deliver nothing: the workers do)
            engine = make_engine(self.cluster.queues)
            site.attach(engine, mcp=mcp)
            async with engine:
                yield engine

    def errors(self) -> list:
        return self.cluster.errors() if self.cluster is not None else []


BUSES = [
    pytest.param("inprocess", id="inprocess"),
    pytest.param("celery", id="celery", marks=[CELERY_DB, pytest.mark.celery, pytest.mark.redis, pytest.mark.postgres]),
]


@pytest.fixture(params=BUSES)
def bus(request, openai_server):
    if request.param == "inprocess":
        return Bus("inprocess")
    return Bus("celery", request.getfixturevalue("pai_cluster"))
