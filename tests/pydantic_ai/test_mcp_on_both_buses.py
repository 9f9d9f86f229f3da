"""An MCP server's tools on both buses: on the Celery bus every worker process that runs
a tool holds its own stdio session (its own server process), listed from the same
config when the worker wired its engine."""

from __future__ import annotations

import json

from asgiref.sync import async_to_sync

from aaa_django.algos import ToolLoop
from aaa_django.runtime.event_types import TOOL_COMPLETED

from . import site


def test_a_tool_loop_calls_an_mcp_tool(bus):
    async def main():
        async with bus.engine(mcp=True) as engine:
            loop = ToolLoop(tools=["mcp_add"], system="Use the tools.")  # by name: resolved where it starts
            r = await engine.start(loop, {"task": json.dumps({"call": "mcp_add", "args": {"a": 2, "b": 40}})})
            return await r.result(timeout=90), await r.events()

    outcome, log = async_to_sync(main)()
    assert (outcome.outcome, outcome.value) == ("success", {"text": 'tool said: {"result": 42}'})
    [done] = [e for e in log if e.type == TOOL_COMPLETED]
    assert done.data["name"] == "mcp_add" and done.data["result"] == {"result": 42}
    assert bus.errors() == []
