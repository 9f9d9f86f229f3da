"""Pydantic AI agents the durable-agent tests run (importable by any process, found by
their dotted path: ``tests.pydantic_ai.agents:forecaster``).

Their tools record each execution (``EXECUTIONS``: the process's list; the Celery tests
read the table ``record_to`` writes to), so a test can tell that no tool ran twice.
"""

from __future__ import annotations

import os

from pydantic import BaseModel
from pydantic_ai import Agent
from pydantic_ai.messages import ModelResponse, TextPart, ToolCallPart, ToolReturnPart
from pydantic_ai.models.function import AgentInfo, FunctionModel
from pydantic_ai.models.test import TestModel

#: (tool, argument) of every execution in this process
EXECUTIONS: list[tuple[str, str]] = []


def executed(tool: str, arg: str) -> None:
    EXECUTIONS.append((tool, arg))
    table = os.environ.get("AAA_TEST_AGENT_TABLE")
    if table:  # a Celery worker: where the pytest process can count them
        from django.db import connections

        with connections["postgres"].cursor() as cur:
            cur.execute(f"INSERT INTO {table} (tool, arg, pid) VALUES (%s, %s, %s)", [tool, arg, os.getpid()])


class Forecast(BaseModel):
    """The forecaster's structured output."""

    city: str
    temperature: int


# -- Pydantic AI's TestModel: calls every tool, then answers with what they said ------------

weather = Agent(TestModel(), instructions="Answer about the weather.")


@weather.tool_plain
def get_temperature(city: str) -> int:
    """The temperature in a city."""
    executed("get_temperature", city)
    return 18


@weather.tool_plain
def get_sky(city: str) -> str:
    """The sky in a city."""
    executed("get_sky", city)
    return "sunny"


# -- a FunctionModel: two tools at once (one needs approval), then a structured answer ------


def plan(messages: list, info: AgentInfo) -> ModelResponse:
    returns = [p for m in messages for p in getattr(m, "parts", ()) if isinstance(p, ToolReturnPart)]
    if not returns:
        return ModelResponse(
            parts=[
                ToolCallPart("temperature", {"city": "Lyon"}, tool_call_id="t1"),
                ToolCallPart("book", {"city": "Lyon"}, tool_call_id="t2"),
            ]
        )
    if len(returns) == 2 and "first" not in str(returns[0].content) and info.output_tools:
        answer = {"city": "Lyon", "temperature": returns[0].content}
        return ModelResponse(parts=[ToolCallPart(info.output_tools[0].name, answer, tool_call_id="o1")])
    return ModelResponse(parts=[TextPart("no forecast")])


forecaster = Agent(FunctionModel(plan), output_type=Forecast, instructions="Forecast the weather.")


@forecaster.tool_plain
def temperature(city: str) -> int:
    """The temperature in a city."""
    executed("temperature", city)
    return 18


@forecaster.tool_plain(requires_approval=True)
def book(city: str) -> str:
    """Books a trip (a person approves it first)."""
    executed("book", city)
    return f"booked {city}"


# -- a FunctionModel agent the Celery tests run in real workers (and kill) --------------------


class Trip(BaseModel):
    """The planner's structured output."""

    city: str
    hotel: str
    sky: str
    booking: str


async def _hold_once(request: int) -> None:
    """Holds model request number ``request`` for good, once, if the test armed it (a
    Redis key): the worker holding it is the one the test kills."""
    url = os.environ.get("AAA_TEST_CELERY_BROKER")
    if not url:
        return
    import asyncio

    import redis

    r = redis.Redis.from_url(url)
    if r.delete(f"aaa-test:agent-hold:{request}"):
        r.set("aaa-test:agent-held", os.getpid())
        await asyncio.sleep(600)


async def plan_trip(messages: list, info: AgentInfo) -> ModelResponse:
    """Two tools at once, then a booking with what they said, then the trip."""
    answered = sum(1 for m in messages if isinstance(m, ModelResponse))
    await _hold_once(answered + 1)
    said = {p.tool_name: p.content for m in messages for p in getattr(m, "parts", ()) if isinstance(p, ToolReturnPart)}
    if answered == 0:
        return ModelResponse(
            parts=[
                ToolCallPart("find_hotel", {"city": "Lyon"}, tool_call_id="p1"),
                ToolCallPart("look_at_sky", {"city": "Lyon"}, tool_call_id="p2"),
            ]
        )
    if answered == 1:
        return ModelResponse(
            parts=[ToolCallPart("reserve", {"hotel": said["find_hotel"], "nights": 2}, tool_call_id="p3")]
        )
    trip = {"city": "Lyon", "hotel": said["find_hotel"], "sky": said["look_at_sky"], "booking": said["reserve"]}
    return ModelResponse(parts=[ToolCallPart(info.output_tools[0].name, trip, tool_call_id="p4")])


planner = Agent(FunctionModel(plan_trip), output_type=Trip, instructions="Plan the trip.")


@planner.tool_plain
def find_hotel(city: str) -> str:
    """A hotel in a city."""
    executed("find_hotel", city)
    return "Hotel Lumière"


@planner.tool_plain
def look_at_sky(city: str) -> str:
    """The sky over a city."""
    executed("look_at_sky", city)
    return "clear"


@planner.tool_plain(metadata={"side_effects": True})
def reserve(hotel: str, nights: int) -> str:
    """Books a hotel (a side effect: under the execution guard)."""
    executed("reserve", hotel)
    return f"BK-{len(hotel)}-{nights}"


def setup(engine) -> None:
    """``AAA["WORKER_SETUP"]`` of the agent tests' workers: the planner's model (its
    tools come from ``AAA["AGENTS"]``)."""
    from aaa_django.llm import LLMHandler
    from aaa_django.llm.pydantic_ai_client import PydanticAIClient

    LLMHandler(PydanticAIClient(planner.model)).attach(engine)
