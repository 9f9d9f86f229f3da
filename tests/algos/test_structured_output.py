"""Structured results: a ToolLoop (or ReAct) whose config names a pydantic model ends
with a value validated against it; an answer that does not fit goes back to the model
with the errors (the ValidationHandler's verdict), a few times, then the run gives up."""

from __future__ import annotations

import json
import sys

import pytest
from pydantic import BaseModel, Field

from aaa_django.algos import ReAct, ToolLoop
from aaa_django.llm.fake import text, tool_call, tool_calls
from aaa_django.runtime import registry
from aaa_django.runtime.event_types import (
    LLM_REQUESTED,
    OUTPUT_PROPOSED,
    OUTPUT_REJECTED,
    OUTPUT_VALIDATED,
    TOOL_REQUESTED,
)
from aaa_django.tools import ToolRegistry, tool
from tests.runtime.helpers import arun, make_engine, trace


class Forecast(BaseModel):
    """What the loops below must answer."""

    city: str
    celsius: int = Field(ge=-90, le=60)


@tool
def temperature(city: str) -> int:
    """Today's temperature in a city."""
    return 18


REGISTRY = ToolRegistry([temperature])


def answers(*finals):
    """A model that asks the tool once, then gives ``finals`` in turn as its final_result."""

    def model(request):
        assert request.tools[-1]["name"] == "final_result" and request.output == {"allow_text": False}
        answered = sum(1 for m in request.messages if m.role == "assistant")
        if answered == 0:
            return tool_call("temperature", city="Lyon")
        return tool_call("final_result", **finals[min(answered - 1, len(finals) - 1)])

    return model


def run(model, algorithm, *, duplicate=False):
    async def main():
        async with make_engine(model, REGISTRY, duplicate=duplicate) as engine:
            r = await engine.start(algorithm, {"task": "Weather in Lyon?"}, run_id="run-out")
            outcome = await r.result(timeout=10)
            await engine.drain(5)
            return outcome, await engine.store.read("run-out")

    return arun(main())


def test_an_answer_that_does_not_fit_goes_back_with_the_errors_then_fits():
    outcome, log = run(
        answers({"city": "Lyon", "celsius": 180}, {"city": "Lyon", "celsius": 18}), ToolLoop(REGISTRY, output=Forecast)
    )

    assert (outcome.outcome, outcome.value) == ("success", {"output": {"city": "Lyon", "celsius": 18}})
    assert [e.type for e in log if e.type.startswith("aaa.output")] == [
        OUTPUT_PROPOSED,
        OUTPUT_REJECTED,
        OUTPUT_PROPOSED,
        OUTPUT_VALIDATED,
    ]
    rejected = next(e for e in log if e.type == OUTPUT_REJECTED)
    assert [(err["loc"], err["type"]) for err in rejected.data["errors"]] == [(["celsius"], "less_than_equal")]
    # the model was told, as the answer to its final_result call
    retry = [e for e in log if e.type == LLM_REQUESTED][2]
    [told] = retry.data["messages"]
    assert told["role"] == "tool" and told["name"] == "final_result"
    assert "- celsius: Input should be less than or equal to 60" in told["content"]
    started = log[0].data["config"]
    assert started["output"] == "tests.algos.test_structured_output:Forecast"
    assert started["output_schema"] == Forecast.model_json_schema()  # saved in the run: the admin shows it


def test_answers_that_never_fit_end_the_run_no_solution():
    outcome, log = run(answers({"city": "Lyon"}), ToolLoop(REGISTRY, output=Forecast, output_retries=1))

    assert outcome.outcome == "no_solution"
    assert outcome.value["reason"] == "invalid_output" and outcome.value["answers"] == 2
    assert outcome.value["errors"][0]["msg"] == "Field required"
    assert [e.type for e in log].count(OUTPUT_REJECTED) == 2


def test_a_text_answer_is_read_as_json_and_react_proposes_its_final_answer():
    def in_text(request):
        return text('{"city": "Lyon", "celsius": 18}')

    outcome, _ = run(in_text, ToolLoop(output=Forecast))
    assert outcome.value == {"output": {"city": "Lyon", "celsius": 18}}

    def react(request):
        told = [m.content for m in request.messages if m.role == "user" and "Observation" in (m.content or "")]
        assert '"celsius"' in request.messages[0].content  # the schema is in its instructions
        return text('Final Answer: {"city": "Lyon", "celsius": 18}' if told else "Final Answer: 18 C")

    outcome, log = run(react, ReAct(output=Forecast))
    assert outcome.value == {"output": {"city": "Lyon", "celsius": 18}}
    assert [e.type for e in log].count(OUTPUT_REJECTED) == 1


def test_a_reply_calling_tools_besides_final_result_gets_an_answer_for_each():
    def model(request):
        if not any(m.role == "tool" for m in request.messages):
            return tool_calls(("temperature", {"city": "Lyon"}), ("final_result", {"city": "Lyon"}))
        return tool_call("final_result", city="Lyon", celsius=18)

    outcome, log = run(model, ToolLoop(REGISTRY, output=Forecast))
    assert outcome.outcome == "success"
    retry = [e for e in log if e.type == LLM_REQUESTED][1]
    assert [m["content"][:7] for m in retry.data["messages"]] == ["not run", "That an"]
    assert [e for e in log if e.type == TOOL_REQUESTED] == []  # the final answer wins


def test_every_event_delivered_twice_gives_the_same_log():
    model = answers({"city": "Lyon", "celsius": 180}, {"city": "Lyon", "celsius": 18})
    once = run(model, ToolLoop(REGISTRY, output=Forecast))[1]
    twice = run(model, ToolLoop(REGISTRY, output=Forecast), duplicate=True)[1]
    assert trace(twice) == trace(once)


def test_a_config_names_only_a_model_this_process_has_loaded():
    assert "this" not in sys.modules
    with pytest.raises(ValueError, match="its module is not loaded"):
        registry.build(ToolLoop.name, {"output": "this:Zen"})
    assert "this" not in sys.modules
    with pytest.raises(ValueError, match="not a pydantic model"):
        registry.build(ToolLoop.name, {"output": "tests.algos.test_structured_output:temperature"})
    built = registry.build(ToolLoop.name, {"output": "tests.algos.test_structured_output:Forecast"})
    assert json.dumps(built.cfg.output_schema) == json.dumps(Forecast.model_json_schema())
