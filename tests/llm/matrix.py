"""The site of the provider matrix (tests/llm/test_matrix.py): its settings, its tool,
its agent, importable by the pytest process and by the Celery workers
(``tests.llm.matrix_worker_settings``).

One site a (provider, streaming, bus): ``AAA["LLM"]`` of that provider on the model
server of tests/field/model_server.py, ``STREAM_TOKENS`` on or off, and tools from the
three places a site has them: ``AAA["TOOLS"]`` (:func:`lookup`), an MCP server's
(``mcp_add``, tests/mcp/server.py over streamable HTTP) and an agent's (:data:`helper`, whose
tool is ``shout``). The agent has no model of its own: its runs are answered by the
site's provider too.
"""

from __future__ import annotations

from typing import Any

from pydantic_ai import Agent

from aaa_django.tools import tool

PROVIDERS = ("openai", "anthropic", "pydantic-ai")
MODEL = "matrix-model"
PRICES = {MODEL: {"input": 1.0, "output": 2.0}}
AGENT = "tests.llm.matrix:helper"
#: the three places a run's tools come from: what each run asks, and what it ends with
SOURCES = {
    "settings": (
        "aaa.algos.ToolLoop",
        {},
        {"call": "lookup", "args": {"city": "Lyon"}},
        {"text": "the tool said: 522250"},
    ),
    "mcp": (
        "aaa.algos.ToolLoop",
        {},
        {"call": "mcp_add", "args": {"a": 2, "b": 40}},
        {"text": 'the tool said: {"result": 42}'},
    ),
    "agent": (
        "aaa.algos.PydanticAIAgent",
        {"agent": AGENT},
        {"call": "shout", "args": {"text": "hi"}},
        {"output": "the tool said: HI!"},
    ),
}
#: what a ToolLoop is offered: every tool of the site; the agent's run, its own
SITE_TOOLS = ["lookup", "mcp_add", "shout"]


@tool(timeout=10)
def lookup(city: str) -> int:
    """The population of a city."""
    return {"Lyon": 522_250, "Porto": 231_800}[city]


helper = Agent(instructions="Use your tools.")


@helper.tool_plain
def shout(text: str) -> str:
    """The text, loud."""
    return text.upper() + "!"


def site_aaa(provider: str, stream: bool, url: str, mcp_url: str, **extra: Any) -> dict[str, Any]:
    """The ``AAA`` settings of the site of one (provider, streaming) pair; ``url`` is the
    model server's root, ``mcp_url`` the MCP server's (streamable HTTP)."""
    llm: dict[str, Any] = {
        "PROVIDER": provider,
        "API_KEY": "sk-matrix",
        "MODEL": MODEL,
        "PRICING": PRICES,
        "MAX_RETRIES": 0,
        "TIMEOUT": 30,
        "BASE_URL": url + "/v1",
    }
    if provider == "anthropic":
        llm["BASE_URL"] = url  # the SDK adds /v1/messages
    elif provider == "pydantic-ai":
        llm["MODEL"] = f"openai-chat:{MODEL}"
    return {
        "LLM": llm,
        "STREAM_TOKENS": stream,
        "TOOLS": ["tests.llm.matrix.lookup"],
        "MCP_SERVERS": {"calc": {"url": mcp_url, "prefix": "mcp_", "only": ["add"]}},
        "AGENTS": ["tests.llm.matrix.helper"],
        **extra,
    }
