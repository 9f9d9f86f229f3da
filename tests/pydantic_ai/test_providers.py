"""Models reached through Pydantic AI's ``Model`` interface run ToolLoops on both buses:
its ``FunctionModel`` and ``TestModel``, and an OpenAI chat model on a local
OpenAI-compatible server. Usage and cost are on the log, priced from our table."""

from __future__ import annotations

import pytest
from asgiref.sync import async_to_sync

from aaa_django.runtime.event_types import LLM_COMPLETED, TOOL_COMPLETED, TOOL_FAILED

from . import site


def run(bus, model, task="What is the weather?"):
    async def main():
        async with bus.engine() as engine:
            r = await engine.start(site.loop(model), {"task": task})
            outcome = await r.result(timeout=30)
            return outcome, await r.events()

    return async_to_sync(main)()


def completed(log):
    return [e for e in log if e.type == LLM_COMPLETED]


def test_a_function_model(bus):
    outcome, log = run(bus, None)
    assert (outcome.outcome, outcome.value) == ("success", {"text": "In Porto: 21 C, windy"})
    [tool] = [e for e in log if e.type == TOOL_COMPLETED]
    assert tool.data["result"] == "21 C, windy"
    assert [c.data["model"] for c in completed(log)] == ["function:reply:"] * 2
    assert all(c.data["usage"]["input_tokens"] > 0 for c in completed(log))
    assert bus.errors() == []


def test_pydantic_ais_test_model(bus):
    outcome, log = run(bus, "test")
    # TestModel calls every tool offered with arguments it makes up ("a" for a str): our
    # tool refuses an unknown city, the model sees the failure and answers with a summary
    assert outcome.outcome == "success"
    [failed] = [e for e in log if e.type == TOOL_FAILED]
    assert failed.data["name"] == "get_weather" and "KeyError" in failed.data["error"]
    assert [c.data["model"] for c in completed(log)] == ["test", "test"]
    first = completed(log)[0].data
    assert first["cost"] == pytest.approx(
        (first["usage"]["input_tokens"] + first["usage"]["output_tokens"]) * 0.5 / 1e6
    )
    assert bus.errors() == []


def test_a_local_openai_compatible_server(bus, openai_server):
    before = openai_server.requests
    outcome, log = run(bus, "openai-chat:local-echo")
    assert (outcome.outcome, outcome.value) == ("success", {"text": "The tool said: 18 C, sunny"})
    assert openai_server.requests - before == 2
    for c in completed(log):
        usage = c.data["usage"]
        assert c.data["model"] == "local-echo-1"
        assert c.data["cost"] == pytest.approx((usage["input_tokens"] * 1.0 + usage["output_tokens"] * 2.0) / 1e6)
    assert "sk-local-test" not in repr(log)
    assert bus.errors() == []


def test_a_model_named_with_its_provider_is_priced_by_its_bare_name_before_any_call():
    # a cost budget is checked against prices() at the run's start: it must find the
    # price the call itself will find ("openai:gpt-4o-mini" priced as "gpt-4o-mini")
    from aaa_django.llm.pydantic_ai_client import PydanticAIClient

    c = PydanticAIClient(
        "openai:gpt-4o-mini", api_key="sk-unused", pricing={"gpt-4o-mini": {"input": 0.15, "output": 0.6}}
    )
    assert c.prices(None) and c.prices("openai:gpt-4o-mini") and not c.prices("openai:gpt-5")
