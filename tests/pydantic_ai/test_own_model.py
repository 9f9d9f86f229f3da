"""A Pydantic AI agent runs on its own model: the site's wiring (``attach_site_handlers``)
answers its runs with a client over the agent's model (``AgentModels``), whatever
``AAA["LLM"]`` says; the site's model answers every other run, and an agent's run whose
config names a model (the site's override).

Two model servers (tests/field/model_server.py): the agent's (Anthropic's format, see
``own_model``) and the site's (OpenAI's). Each records what it was asked."""

from __future__ import annotations

import json

import pytest

from aaa_django.algos.pydantic_agent import PydanticAIAgent
from aaa_django.llm.routes import AgentModels
from aaa_django.runtime import Engine
from aaa_django.runtime.event_types import LLM_COMPLETED, LLM_REQUESTED
from aaa_django.site.engines import attach_site_handlers
from tests.field.model_server import ANTHROPIC, OPENAI, ModelServer, said
from tests.runtime.helpers import arun

from . import own_model

PATH = "tests.pydantic_ai.own_model:agent"
TASK = json.dumps({"call": "shout", "args": {"text": "hello"}})


@pytest.fixture
def site_model(settings):
    with ModelServer() as server:
        settings.AAA = {
            "LLM": {"PROVIDER": "openai", "BASE_URL": server.url + "/v1", "API_KEY": "sk-site", "MODEL": "site-model"},
            "AGENTS": ["tests.pydantic_ai.own_model.agent"],
        }
        yield server


def run(algorithm):
    async def main():
        async with attach_site_handlers(Engine()) as engine:
            r = await engine.start(algorithm, {"task": TASK})
            return engine, await r.result(timeout=30), await r.events()

    return arun(main())


def asked(server, since=0):
    return [(r["path"], r["model"], r["tools"]) for r in server.requests[since:]]


def test_an_agent_runs_on_its_own_model_and_other_runs_on_the_sites(site_model):
    own = own_model.SERVER
    before = len(own.requests)
    engine, outcome, log = run(PydanticAIAgent(PATH))
    assert isinstance(engine.subscribers(LLM_REQUESTED)[0].client, AgentModels)
    assert (outcome.outcome, outcome.value) == ("success", {"output": said(["HELLO!"])})
    assert asked(own, before) == [(ANTHROPIC, "own-model", ["shout"])] * 2
    assert site_model.requests == []
    assert {e.data["agent"] for e in log if e.type == LLM_REQUESTED} == {PATH}
    assert [e.data["model"] for e in log if e.type == LLM_COMPLETED] == ["own-model"] * 2

    # a ToolLoop on the same site: the site's model, offered the site's tools (the agent's among them)
    before = len(own.requests)
    _, outcome, _ = run("aaa.algos.ToolLoop")
    assert (outcome.outcome, outcome.value) == ("success", {"text": said(["HELLO!"])})
    assert asked(site_model) == [(OPENAI, "site-model", ["shout"])] * 2
    assert len(own.requests) == before


def test_an_agent_run_that_names_a_model_is_answered_by_the_sites_client(site_model):
    before = len(own_model.SERVER.requests)
    _, outcome, log = run(PydanticAIAgent(PATH, model="site-model"))
    assert (outcome.outcome, outcome.value) == ("success", {"output": said(["HELLO!"])})
    assert asked(site_model) == [(OPENAI, "site-model", ["shout"])] * 2
    assert len(own_model.SERVER.requests) == before
    assert all("agent" not in e.data for e in log if e.type == LLM_REQUESTED)
