"""Every provider works with every switch, end to end, as a site wires it from settings.

Provider (``AAA["LLM"]``: ``openai``, ``anthropic``, ``pydantic-ai``) x ``STREAM_TOKENS``
(off, on) x bus (in-process; Celery, each site on a worker process of its own) x where
the run's tools come from (``AAA["TOOLS"]``, an MCP server, an agent): for each site
(tests/llm/matrix.py) the three runs start as the REST API starts them (by name: the
ToolLoops with no ``config.tools``) and must end ``success`` with the answer the model
gives after calling the one tool its task names. The model is the HTTP model server of
tests/field/model_server.py, speaking OpenAI's or Anthropic's wire format, plain or
streamed, and calling a tool only when it is offered; the MCP server is
tests/mcp/server.py over streamable HTTP. Checked for each run (a cell): its outcome and
value; each model request's wire format, model, streaming and the tools offered; the
tools in its ``aaa.run.started``; one tool call; the price of each reply; with
streaming, the reply's text as live tokens.

The table in docs/models.md ("Every provider, every switch") is this test's.
"""

from __future__ import annotations

import asyncio
import json
import os
import time
import uuid
from typing import Any

import pytest
from asgiref.sync import async_to_sync

from aaa_django.runtime import Engine, registry
from aaa_django.runtime.event_types import LLM_COMPLETED, RUN_STARTED, TOOL_COMPLETED
from aaa_django.site.engines import attach_site_handlers
from aaa_django.site.tokens import site_tokens
from tests.celery.conftest import CELERY_DB
from tests.field.model_server import ANTHROPIC, OPENAI, ModelServer

from .matrix import MODEL, PROVIDERS, SITE_TOOLS, SOURCES, site_aaa

pytestmark = [pytest.mark.slow]

#: the sites: (provider, streaming)
SITES = [(provider, stream) for provider in PROVIDERS for stream in (False, True)]
#: seconds a run may take: only catches one that never ends
DEADLINE = 120


def site_id(provider: str, stream: bool) -> str:
    return f"{provider}-{'stream' if stream else 'plain'}"


@pytest.fixture(scope="module")
def model_server():
    with ModelServer() as server:
        yield server


@pytest.fixture(scope="module")
def mcp_server(tmp_path_factory):
    from tests.mcp.conftest import HttpServer

    server = HttpServer(tmp_path_factory.mktemp("mcp") / "hang.mark")
    try:
        server.wait_ready()
        yield server
    finally:
        server.kill()


class Site:
    """One site's three runs: ``engine`` wired from its settings (as a web process's
    engine host is: it settles the runs' tools), ``feed`` its live tokens (or None)."""

    def __init__(self, provider: str, stream: bool, engine: Engine) -> None:
        self.provider, self.stream, self.engine = provider, stream, engine
        self.feed = site_tokens()
        self.name = site_id(provider, stream)

    def task(self, source: str) -> str:
        """The source's task, naming the site (the model server records it with each request)."""
        return json.dumps({**SOURCES[source][2], "site": self.name})

    async def run(self) -> dict[str, tuple]:
        """Per source: (outcome, log, the live tokens' text)."""
        ids = {s: f"run-matrix-{uuid.uuid4().hex[:12]}-{s}" for s in SOURCES}
        subs = {s: self.feed.subscribe(ids[s]) for s in SOURCES} if self.feed is not None else {}
        async with self.engine:
            runs = {s: await self.engine.start(algorithm(s), {"task": self.task(s)}, run_id=ids[s]) for s in SOURCES}
            outcomes = {s: await r.result(timeout=DEADLINE) for s, r in runs.items()}
            logs = {s: await r.events() for s, r in runs.items()}
        tokens = {s: await collect(subs[s], reply_text(outcomes[s].value)) for s in subs}
        return {s: (outcomes[s], logs[s], tokens.get(s)) for s in SOURCES}

    def failures(self, results: dict[str, tuple], asked: list[dict]) -> dict[str, list[str]]:
        """What went wrong in each of its cells (a cell that went right is not listed)."""
        out = {}
        for source in SOURCES:
            problems = check(self, source, *results[source], [r for r in asked if r["task"] == self.task(source)])
            if problems:
                out[source] = problems
        return out


def algorithm(source: str) -> Any:
    name, config, _, _ = SOURCES[source]
    return registry.build(name, config) if config else name  # a ToolLoop by name: as the API starts it


def reply_text(value: Any) -> str:
    return (value.get("text") or value.get("output") or "") if isinstance(value, dict) else ""


async def collect(subscription: Any, want: str) -> str:
    """The text of the live tokens of the run's request that said ``want`` (else all they
    said, once the bound passes: it only catches tokens that never come)."""
    seen: dict[str, dict[int, str]] = {}
    end = time.monotonic() + 30
    try:
        while True:
            for d in await asyncio.to_thread(subscription.wait, 0.05):
                seen.setdefault(d.request_id, {})[d.index] = d.text
            said = ["".join(t[i] for i in sorted(t)) for t in seen.values()]
            if want in said or time.monotonic() > end:
                return want if want in said else " | ".join(said)
    finally:
        subscription.close()


def check(site: Site, source: str, outcome: Any, log: list, tokens: str | None, asked: list[dict]) -> list[str]:
    """What went wrong in one cell (empty: nothing)."""
    name, _, _, value = SOURCES[source]
    problems = []
    if (outcome.outcome, outcome.value) != ("success", value):
        problems.append(f"ended {outcome.outcome} {outcome.value}")
    tools = ["shout"] if name == "aaa.algos.PydanticAIAgent" else SITE_TOOLS
    path = ANTHROPIC if site.provider == "anthropic" else OPENAI
    wanted = [(path, MODEL, site.stream, tools)] * 2  # the tool call, then the answer
    got = [(r["path"], r["model"], r["stream"], sorted(r["tools"])) for r in asked]
    if got != wanted:
        problems.append(f"the model was asked {got}, not {wanted}")
    if name == "aaa.algos.ToolLoop":
        [started] = [e for e in log if e.type == RUN_STARTED]
        offered = sorted(t["name"] for t in started.data["config"]["tools"])
        if offered != SITE_TOOLS:
            problems.append(f"its aaa.run.started offers {offered}")
    if len([e for e in log if e.type == TOOL_COMPLETED]) != 1:
        problems.append("not one tool call")
    costs = [e.data["cost"] for e in log if e.type == LLM_COMPLETED]
    if len(costs) != 2 or not all(c > 0 for c in costs):
        problems.append(f"its replies cost {costs}")
    if site.stream and tokens != reply_text(value):
        problems.append(f"its live tokens said {tokens!r}")
    return problems


@pytest.mark.parametrize("provider, stream", [pytest.param(*s, id=site_id(*s)) for s in SITES])
def test_every_provider_with_every_switch_in_process(provider, stream, model_server, mcp_server, settings):
    settings.AAA = site_aaa(provider, stream, model_server.url, mcp_server.url)
    site = Site(provider, stream, attach_site_handlers(Engine()))
    before = len(model_server.requests)
    results = async_to_sync(site.run)()
    assert site.failures(results, model_server.requests[before:]) == {}


@CELERY_DB
@pytest.mark.celery
@pytest.mark.redis
@pytest.mark.postgres
def test_every_provider_with_every_switch_on_celery(celery_env, model_server, mcp_server, settings, tmp_path_factory):
    """Each site on a Celery worker of its own (one process, ``-P solo``), the six started
    together and their runs run at once; the pytest process's engines only start the
    runs, as a web process's do."""
    from concurrent.futures import ThreadPoolExecutor

    from aaa_django.celery.bus import store_spec
    from tests.celery.conftest import make_engine
    from tests.celery.workers import Cluster

    clusters = {}
    for provider, stream in SITES:
        env = {
            **celery_env,
            "DJANGO_SETTINGS_MODULE": "tests.llm.matrix_worker_settings",
            "AAA_TEST_QUEUE_SUFFIX": f"-matrix-{site_id(provider, stream)}",
            "AAA_TEST_MATRIX_PROVIDER": provider,
            "AAA_TEST_MATRIX_STREAM": str(int(stream)),
            "AAA_TEST_MATRIX_URL": model_server.url,
            "AAA_TEST_MATRIX_MCP_URL": mcp_server.url,
        }
        clusters[provider, stream] = Cluster(env, tmp_path_factory.mktemp("matrix"))
    try:

        def up(cluster: Cluster) -> None:
            cluster.start(1, pool="solo")
            cluster.warm(store_spec(make_engine(cluster.queues).store))  # its engine wired: MCP listed

        with ThreadPoolExecutor(len(clusters)) as pool:
            list(pool.map(up, clusters.values()))
        sites = []
        for (provider, stream), cluster in clusters.items():
            settings.AAA = site_aaa(
                provider,
                stream,
                model_server.url,
                mcp_server.url,
                BUS="celery",
                REDIS_URL=os.environ["AAA_TEST_CELERY_BROKER"],
            )
            sites.append(Site(provider, stream, attach_site_handlers(make_engine(cluster.queues))))
        before = len(model_server.requests)

        async def main():
            return await asyncio.gather(*(site.run() for site in sites))

        results = async_to_sync(main)()
        asked = model_server.requests[before:]
        wrong = {site.name: got for site, r in zip(sites, results) if (got := site.failures(r, asked))}
        assert wrong == {}
        assert [e for c in clusters.values() for e in c.errors()] == []
    finally:
        for cluster in clusters.values():
            cluster.stop()
