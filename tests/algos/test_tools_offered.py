"""A run's model is offered the tools the engine runs, or those its config names, and the
started event holds their specs (``aaa_django.runtime.offered``).

The model here calls a tool only when it is offered one, as a real model does: a run
that offered nothing would end in prose."""

from __future__ import annotations

import json

from aaa_django.algos import PlanAndExecute, ReAct, ToolLoop
from aaa_django.llm.fake import text, tool_call
from aaa_django.runtime import Engine
from aaa_django.runtime.event_types import (
    CHILD_REQUESTED,
    LLM_REQUESTED,
    RUN_STARTED,
    TOOL_COMPLETED,
)
from aaa_django.runtime.offered import served
from aaa_django.tools import ToolHandler, ToolRegistry, tool
from tests.runtime.helpers import arun, make_engine, of_type


@tool
def population(city: str) -> int:
    """The population of a city."""
    return {"Lyon": 522_250, "Porto": 231_800}[city]


@tool
def area(city: str) -> float:
    """The area of a city, in km²."""
    return {"Lyon": 47.87, "Porto": 41.42}[city]


REGISTRY = ToolRegistry([population, area])
SPECS = {t.name: t.spec() for t in REGISTRY}


def offered_only(request):
    """Call the first tool offered (Lyon), then say what it said; offered none: prose."""
    said = [m.content for m in request.messages if m.role == "tool"]
    if said:
        return text(f"it said {said[0]}")
    if not request.tools:
        return text("I have no tools, so I guess.")
    return tool_call(request.tools[0]["name"], city="Lyon")


def run(algorithm, *, registry=REGISTRY, model=offered_only, engine: Engine | None = None, task="Lyon?"):
    async def main():
        async with engine or make_engine(model, registry) as e:
            r = await e.start(algorithm, {"task": task})
            return await r.result(timeout=10), await r.events()

    return arun(main())


def started_tools(log):
    return of_type(log, RUN_STARTED)[0].data["config"]["tools"]


def test_a_tool_loop_started_by_name_is_offered_every_tool_the_engine_runs():
    outcome, log = run("aaa.algos.ToolLoop")  # as the REST API starts one with no config
    assert started_tools(log) == [SPECS["area"], SPECS["population"]]
    assert of_type(log, LLM_REQUESTED)[0].data["tools"] == started_tools(log)
    assert [e.data["name"] for e in of_type(log, TOOL_COMPLETED)] == ["area"]
    assert (outcome.outcome, outcome.value) == ("success", {"text": "it said 47.87"})


def test_names_choose_the_tools_and_their_specs_are_saved():
    outcome, log = run(ToolLoop(tools=["population"]))
    assert started_tools(log) == [SPECS["population"]]
    assert (outcome.outcome, outcome.value) == ("success", {"text": "it said 522250"})


def test_a_spec_of_a_tool_served_elsewhere_stays_as_given_beside_a_name():
    elsewhere = {
        "name": "weather",
        "description": "Served by someone else.",
        "parameters": {"type": "object", "properties": {}},
    }
    _, log = run(ToolLoop(tools=[elsewhere, "area"]))
    assert started_tools(log) == [elsewhere, SPECS["area"]]


def test_an_empty_list_offers_nothing():
    outcome, log = run(ToolLoop(tools=[]))
    assert started_tools(log) == [] and "tools" not in of_type(log, LLM_REQUESTED)[0].data
    assert outcome.value == {"text": "I have no tools, so I guess."}


def test_an_unknown_name_ends_the_run_invalid_input_naming_the_tools_there_are():
    outcome, log = run(ToolLoop(tools=["population", "weather"]))
    assert outcome.outcome == "invalid_input"
    [error] = outcome.value["errors"]
    assert error["loc"] == ["config", "tools", 1] and error["type"] == "unknown_tool"
    assert error["msg"] == "no tool named 'weather' is served where the run started (the tools: area, population)"
    assert started_tools(log) == [SPECS["population"], "weather"]  # what was asked, as asked
    assert of_type(log, LLM_REQUESTED) == []


def test_an_engine_without_tools_offers_none():
    _, log = run("aaa.algos.ToolLoop", registry=None)
    assert started_tools(log) == []


def test_the_tools_of_every_tool_handler_are_offered():
    engine = make_engine(offered_only, ToolRegistry([population]))
    ToolHandler(ToolRegistry([area])).attach(engine)
    assert list(served(engine)) == ["area", "population"]
    _, log = run(ToolLoop(tools=["population", "area"]), engine=engine)
    assert started_tools(log) == [SPECS["population"], SPECS["area"]]


def test_react_lists_the_engines_tools_in_its_prompt():
    def react(request):
        said = [m.content for m in request.messages if m.content and m.content.startswith("Observation")]
        if said:
            return text(f"Final Answer: {said[0]}")
        assert request.tools == []  # ReAct speaks a text protocol: no native tools
        system = request.messages[0].content
        assert "- population: The population of a city." in system and "- area:" in system
        return text('Thought: look it up\nAction: population\nAction Input: {"city": "Porto"}')

    outcome, log = run("aaa.algos.ReAct", model=react)
    assert started_tools(log) == [SPECS["area"], SPECS["population"]]
    assert outcome.value == {"text": "Observation: 231800"}
    assert isinstance(ReAct.from_config({}), ToolLoop)


def test_a_child_tool_loop_is_offered_the_engines_tools_when_it_starts():
    def model(request):
        if (request.tag or "").startswith("plan-"):
            return text(json.dumps(["Look up Lyon"]))
        return offered_only(request)

    async def main():
        async with make_engine(model, REGISTRY) as e:
            r = await e.start(PlanAndExecute(executor={"algorithm": "aaa.algos.ToolLoop"}), {"task": "Lyon?"})
            outcome = await r.result(timeout=10)
            [asked] = of_type(await r.events(), CHILD_REQUESTED)
            return outcome, asked, await e.started(asked.data["child"])

    outcome, asked, child = arun(main())
    assert asked.data["config"]["tools"] is None  # the parent named none: the child's start settles them
    assert child.data["config"]["tools"] == [SPECS["area"], SPECS["population"]]
    assert (outcome.outcome, outcome.value["answer"]) == ("success", "it said 47.87")
