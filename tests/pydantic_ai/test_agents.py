"""A ``pydantic_ai.Agent`` run durably on the engine: its model requests and tool calls
are the run's handler events, every step replays the agent from the log, a crash
resumes it where it stopped, approvals are our gates, structured output is validated."""

from __future__ import annotations

import asyncio
import sys

import pytest
from pydantic_ai.usage import UsageLimits

from aaa_django.algos.pydantic_agent import PydanticAIAgent, agent_tools, budget_for
from aaa_django.events import InMemoryEventStore
from aaa_django.llm import LLMHandler
from aaa_django.llm.pydantic_ai_client import PydanticAIClient
from aaa_django.runtime import Budget, Engine, registry
from aaa_django.runtime.event_types import (
    APPROVAL_GRANTED,
    APPROVAL_REQUESTED,
    INPUT_VALIDATED,
    LLM_ATTEMPTED,
    LLM_COMPLETED,
    LLM_REQUESTED,
    RUN_COMPLETED,
    RUN_STARTED,
    TOOL_COMPLETED,
    TOOL_FAILED,
    TOOL_REQUESTED,
)
from aaa_django.tools import ToolHandler, ToolRegistry
from tests.runtime.helpers import arun

from . import agents


def engine_for(agent, store=None):
    engine = Engine(store=store or InMemoryEventStore())
    LLMHandler(PydanticAIClient(agent.model)).attach(engine)
    ToolHandler(ToolRegistry(agent_tools(agent))).attach(engine)
    return engine


async def approve_when_asked(engine, run_id):
    while True:
        meta = await engine.meta(run_id)
        if meta.completed:
            return
        if meta.approvals:
            await engine.approve(run_id, next(iter(meta.approvals)), by="ops")
            return
        await asyncio.sleep(0.01)


def types(log):
    return [e.type for e in log]


def test_a_test_model_agent_runs_as_handler_events():
    agents.EXECUTIONS.clear()
    direct = agents.weather.run_sync("Weather in Lyon?").output

    async def main():
        async with engine_for(agents.weather) as engine:
            run = await engine.start(PydanticAIAgent("tests.pydantic_ai.agents:weather"), {"task": "Weather in Lyon?"})
            return await run.result(timeout=30), await run.events()

    agents.EXECUTIONS.clear()
    outcome, log = arun(main())
    assert outcome.outcome == "success"
    # TestModel called both tools in one reply: both were asked for in one step, and each ran once
    assert types(log) == [
        RUN_STARTED,
        INPUT_VALIDATED,
        LLM_REQUESTED,
        LLM_ATTEMPTED,
        LLM_COMPLETED,
        TOOL_REQUESTED,
        TOOL_REQUESTED,
        TOOL_COMPLETED,
        TOOL_COMPLETED,
        LLM_REQUESTED,
        LLM_ATTEMPTED,
        LLM_COMPLETED,
        RUN_COMPLETED,
    ]
    assert sorted(agents.EXECUTIONS) == [("get_sky", "a"), ("get_temperature", "a")]
    # the second request carried only what was new: the tools' results
    second = [e for e in log if e.type == LLM_REQUESTED][1]
    assert [m["role"] for m in second.data["messages"]] == ["tool", "tool"]
    # the same answer as the agent run on its own (TestModel reports tool results as text here)
    assert outcome.value["output"].replace('"18"', "18") == direct


def test_structured_output_approvals_and_a_crash_resume_without_re_running_anything():
    store = InMemoryEventStore()
    agents.EXECUTIONS.clear()

    async def first_process():
        async with engine_for(agents.forecaster, store) as engine:
            run = await engine.start(
                PydanticAIAgent("tests.pydantic_ai.agents:forecaster"), {"task": "Weather in Lyon?"}
            )
            # the crash: this process stops while the booking waits for its approval
            while not (await engine.meta(run.run_id)).approvals:
                await asyncio.sleep(0.01)
            return run.run_id

    run_id = arun(first_process())
    before = list(agents.EXECUTIONS)

    async def second_process():
        async with engine_for(agents.forecaster, store) as engine:
            assert await engine.resume() == [run_id]
            await approve_when_asked(engine, run_id)
            return await engine.run(run_id).result(timeout=30), await store.read(run_id)

    outcome, log = arun(second_process())
    assert before == [("temperature", "Lyon")]
    assert agents.EXECUTIONS == [("temperature", "Lyon"), ("book", "Lyon")]  # nothing ran twice
    assert (outcome.outcome, outcome.value) == ("success", {"output": {"city": "Lyon", "temperature": 18}})
    assert types(log).count(LLM_REQUESTED) == 2  # no model call made again either
    assert [e.type for e in log if e.type.startswith("aaa.approval")] == [APPROVAL_REQUESTED, APPROVAL_GRANTED]
    started = log[0].data["config"]
    assert started["output_schema"]["required"] == ["city", "temperature"]


def test_a_denied_tool_is_a_failure_the_agent_sees():
    async def main():
        async with engine_for(agents.forecaster) as engine:
            run = await engine.start(PydanticAIAgent("tests.pydantic_ai.agents:forecaster"), {"task": "Lyon?"})
            while not (meta := await engine.meta(run.run_id)).approvals:
                await asyncio.sleep(0.01)
            await engine.deny(run.run_id, next(iter(meta.approvals)), by="ops", reason="no budget")
            return await run.result(timeout=30), await run.events()

    outcome, log = arun(main())
    [failed] = [e for e in log if e.type == TOOL_FAILED]
    assert failed.data["reason"] == "denied"
    # the model was told (Pydantic AI's ToolFailed), and the agent went on to its answer
    second = [e for e in log if e.type == LLM_REQUESTED][1]
    booking = next(m for m in second.data["messages"] if m.get("tool_call_id") == "t2")
    assert "denied" in booking["content"] and "no budget" in booking["content"]
    assert outcome.outcome == "success"


def test_usage_limits_map_to_the_budget():
    budget = budget_for(
        UsageLimits(request_limit=1, tool_calls_limit=5, total_tokens_limit=1000), Budget(tokens=500, cost=1.0)
    )
    assert budget == Budget(model_calls=1, tool_calls=5, tokens=500, cost=1.0)

    async def main():
        async with engine_for(agents.weather) as engine:
            run = await engine.start(
                PydanticAIAgent("tests.pydantic_ai.agents:weather"),
                {"task": "Lyon?"},
                budget=budget_for(UsageLimits(request_limit=1)),
            )
            return await run.result(timeout=30)

    outcome = arun(main())
    assert outcome.outcome == "budget_exceeded" and outcome.value["dimension"] == "model_calls"


def test_a_path_that_is_not_an_agent_is_refused():
    with pytest.raises(ValueError, match="not a pydantic_ai.Agent"):
        PydanticAIAgent("tests.pydantic_ai.agents:Forecast")


def test_a_config_names_only_an_agent_this_process_has_loaded():
    # a run's config may come from a stranger (the REST API): naming a module must not import it
    assert "this" not in sys.modules
    with pytest.raises(ValueError, match="no agent of that module is loaded"):
        registry.build(PydanticAIAgent.name, {"agent": "this:agent"})
    assert "this" not in sys.modules
    built = registry.build(PydanticAIAgent.name, {"agent": "tests.pydantic_ai.agents:forecaster"})
    assert built.cfg.output_schema["title"] == "Forecast"  # filled in, as code that builds it gets


def test_the_agents_in_settings_give_their_tools_to_the_site_engine(settings):
    from aaa_django.checks import check_api_settings
    from aaa_django.site.engines import attach_site_handlers

    settings.AAA = {"AGENTS": ["tests.pydantic_ai.agents.planner"], "TOOLS": []}
    assert check_api_settings() == []
    engine = attach_site_handlers(Engine())
    [handler] = engine.subscribers(TOOL_REQUESTED)
    tools = {t.name: t for t in handler.registry}
    assert set(tools) == {"find_hotel", "look_at_sky", "reserve"}
    assert tools["reserve"].guard.side_effects and not tools["find_hotel"].guard.side_effects  # its metadata

    settings.AAA = {"AGENTS": ["tests.pydantic_ai.agents.Trip"]}
    [error] = check_api_settings()
    assert error.id == "aaa.E020" and "not a pydantic_ai.Agent" in error.msg
