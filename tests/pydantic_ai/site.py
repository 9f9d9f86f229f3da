"""What the Pydantic AI tests run, importable by any process (the pytest process on the
in-process bus, the Celery workers of ``conftest.py`` through ``setup``).

One model client serves every run: a ``PydanticAIClient`` whose own model is a
``FunctionModel`` (:func:`reply`), which builds ``"test"`` as Pydantic AI's ``TestModel``
and ``"openai-chat:<name>"`` as an OpenAI chat model on the local OpenAI-compatible
server (``AAA_TEST_OPENAI_URL``, started by the test). A ``ToolLoop`` picks one with its
``model``.
"""

from __future__ import annotations

import json
import os

from pydantic_ai.messages import ModelResponse, TextPart, ToolCallPart, ToolReturnPart, UserPromptPart
from pydantic_ai.models.function import AgentInfo, FunctionModel

from aaa_django.algos import ToolLoop
from aaa_django.llm import LLMHandler
from aaa_django.llm.pydantic_ai_client import PydanticAIClient
from aaa_django.tools import ToolHandler, ToolRegistry, tool

PRICES = {"local-echo-1": {"input": 1.0, "output": 2.0}, "test": {"input": 0.5, "output": 0.5}}


@tool(inline=True)
def get_weather(city: str) -> str:
    """The current weather in a city."""
    return {"Lyon": "18 C, sunny", "Porto": "21 C, windy"}[city]


def mcp_server():
    """The test MCP server over stdio: each process that runs tools starts its own."""
    from aaa_django.tools.mcp import MCPServer
    from tests.mcp.conftest import stdio_config

    return MCPServer("calc", prefix="mcp_", only=["add", "fail"], **stdio_config())


REGISTRY = ToolRegistry([get_weather])


def reply(messages: list, info: AgentInfo) -> ModelResponse:
    """The FunctionModel's script: ask for Porto's weather (or, for a task
    ``{"call": tool, "args": {...}}``, call that), then say what the tool said."""
    parts = [p for m in messages for p in getattr(m, "parts", ())]
    returns = [p for p in parts if isinstance(p, ToolReturnPart)]
    task = next(p.content for p in parts if isinstance(p, UserPromptPart))
    if returns:
        return ModelResponse(
            parts=[
                TextPart(
                    f"In Porto: {returns[-1].content}"
                    if not task.startswith("{")
                    else f"tool said: {returns[-1].content}"
                )
            ]
        )
    if task.startswith("{"):
        plan = json.loads(task)
        return ModelResponse(parts=[ToolCallPart(plan["call"], plan["args"], tool_call_id="fn-1")])
    return ModelResponse(parts=[ToolCallPart("get_weather", {"city": "Porto"}, tool_call_id="fn-1")])


def client() -> PydanticAIClient:
    url = os.environ.get("AAA_TEST_OPENAI_URL", "http://127.0.0.1:9")
    return PydanticAIClient(
        lambda: FunctionModel(reply),
        base_url=url + "/v1",
        api_key="sk-local-test",
        pricing=PRICES,
        timeout=10,
        max_retries=0,
    )


def loop(model: str | None = None) -> ToolLoop:
    return ToolLoop(REGISTRY, model=model, system="Use the tools to answer.")


def attach(engine, *, mcp: bool = False) -> None:
    """The handlers every process that delivers events needs (``mcp``: with the MCP
    server's tools, listed now)."""
    LLMHandler(client()).attach(engine)
    ToolHandler(ToolRegistry([*REGISTRY, *(mcp_server().tools() if mcp else ())])).attach(engine)


def setup(engine) -> None:
    """``AAA["WORKER_SETUP"]`` of this package's Celery workers."""
    attach(engine, mcp=True)
