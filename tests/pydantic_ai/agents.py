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
        return ModelResponse(parts=[ToolCallPart("temperature", {"city": "Lyon"}, tool_call_id="t1"),
                                    ToolCallPart("book", {"city": "Lyon"}, tool_call_id="t2")])
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
