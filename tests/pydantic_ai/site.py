"""What the Pydantic AI tests run, importable by any process (the pytest process on the
in-process bus, the Celery workers of ``conftest.py`` through ``setup``).

One model client serves every run: a ``PydanticAIClient`` whose own model is a
``FunctionModel`` (:func:`reply`), which builds ``"test"`` as Pydantic AI's ``TestModel``
and ``"openai-chat:<name>"`` as an OpenAI chat model on the local OpenAI-compatible
server (``AAA_TEST_OPENAI_URL``, started by the test). A ``ToolLoop`` picks one with its
``model``.
"""

from __future__ import annotations

import os

from pydantic_ai.messages import ModelResponse, TextPart, ToolCallPart, ToolReturnPart
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


REGISTRY = ToolRegistry([get_weather])


def reply(messages: list, info: AgentInfo) -> ModelResponse:
    """The FunctionModel's script: ask for Porto's weather, then say what the tool said."""
    returns = [p for m in messages for p in getattr(m, "parts", ()) if isinstance(p, ToolReturnPart)]
    if not returns:
        return ModelResponse(parts=[ToolCallPart("get_weather", {"city": "Porto"}, tool_call_id="fn-1")])
    return ModelResponse(parts=[TextPart(f"In Porto: {returns[-1].content}")])


def client() -> PydanticAIClient:
    url = os.environ.get("AAA_TEST_OPENAI_URL", "http://127.0.0.1:9")
    return PydanticAIClient(lambda: FunctionModel(reply), base_url=url + "/v1", api_key="sk-local-test",
                            pricing=PRICES, timeout=10, max_retries=0)


def loop(model: str | None = None) -> ToolLoop:
    return ToolLoop(REGISTRY, model=model, system="Use the tools to answer.")


def attach(engine) -> None:
    """The handlers every process that delivers events needs."""
    LLMHandler(client()).attach(engine)
    ToolHandler(REGISTRY).attach(engine)


def setup(engine) -> None:
    """``AAA["WORKER_SETUP"]`` of this package's Celery workers."""
    attach(engine)
