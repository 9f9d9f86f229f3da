"""A model without a price never costs 0 silently: its replies say ``"priced":
false`` (the admin shows "unpriced"), and a run with a cost budget over such a model
is refused at its start (``invalid_input``; 422 over the API), before any call."""

from __future__ import annotations

import pytest

from aaa_django.admin.timeline import summarize
from aaa_django.algos import ToolLoop
from aaa_django.llm.openai_client import OpenAICompatibleClient
from aaa_django.runtime.event_types import INPUT_REJECTED, LLM_COMPLETED
from aaa_django.tools import ToolRegistry
from tests.runtime.helpers import arun, make_engine, of_type

from .conftest import FAST, KEY
from .server import RecordedServer, Reply

PRICED = {"gpt-4o-mini": {"input": 0.15, "output": 0.60}}


def client(server: RecordedServer, model: str, pricing=PRICED) -> OpenAICompatibleClient:
    return OpenAICompatibleClient(server.url + "/v1", KEY, model, pricing=pricing, **FAST)


def run(server: RecordedServer, model: str, *, budget=None, config_model=None):
    c = client(server, model)
    registry = ToolRegistry([])

    async def go():
        async with make_engine(registry=registry, client=c) as engine:
            r = await engine.start(ToolLoop(registry, model=config_model), {"task": "hi"}, budget=budget)
            outcome = await r.result(timeout=15)
            await engine.drain(5)
            log = await engine.store.read(r.run_id)
        await c.aclose()
        return outcome, log

    return arun(go())


def test_an_unpriced_reply_says_so_in_the_event_and_the_admin_line():
    with RecordedServer() as server:
        server.script(Reply.recorded("openai/text"))
        outcome, log = run(server, "my-proxy-alias")  # the proxy's name for some model
    assert outcome.outcome == "success"
    (done,) = of_type(log, LLM_COMPLETED)
    assert done.data["cost"] == 0 and done.data["priced"] is False
    assert "unpriced" in summarize(LLM_COMPLETED, done.data)


def test_a_priced_reply_carries_no_flag():
    with RecordedServer() as server:
        server.script(Reply.recorded("openai/text"))
        _, log = run(server, "gpt-4o-mini")
    (done,) = of_type(log, LLM_COMPLETED)
    assert done.data["cost"] > 0 and "priced" not in done.data
    assert "unpriced" not in summarize(LLM_COMPLETED, done.data)


@pytest.mark.parametrize("config_model", [None, "my-proxy-alias"])
def test_a_cost_budget_over_an_unpriced_model_is_refused_at_start(config_model):
    with RecordedServer() as server:
        outcome, log = run(
            server,
            "my-proxy-alias" if config_model is None else "gpt-4o-mini",
            budget={"cost": 1.0},
            config_model=config_model,
        )
        assert server.requests == []  # no model was called
    assert outcome.outcome == "invalid_input"
    (rejected,) = of_type(log, INPUT_REJECTED)
    (error,) = rejected.data["errors"]
    assert error["loc"] == ["budget", "cost"] and error["type"] == "unpriced_model"
    assert "'my-proxy-alias' has no price" in error["msg"] and "PRICING" in error["msg"]


def test_without_a_cost_budget_an_unpriced_model_may_run():
    with RecordedServer() as server:
        server.script(Reply.recorded("openai/text"))
        outcome, _ = run(server, "my-proxy-alias", budget={"model_calls": 3})
    assert outcome.outcome == "success"
