"""An MCP server for the tests, written with the ``mcp`` SDK; the tests start it as a
real process:

    python tests/mcp/server.py stdio                  # over stdin/stdout
    python tests/mcp/server.py http PORT              # streamable HTTP on 127.0.0.1:PORT/mcp

Its tools: ``add`` (a sum, structured), ``shout`` (text), ``fail`` (a tool error),
``hang`` (writes ``started`` to ``AAA_TEST_MCP_MARK`` with its PID, then sleeps: the
test kills the server while it runs).
"""

from __future__ import annotations

import asyncio
import os
import sys
from pathlib import Path

from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ToolError

server = MCPServer("aaa-test-tools", log_level="CRITICAL")


@server.tool()
def add(a: int, b: int) -> int:
    """Adds two numbers."""
    return a + b


@server.tool()
def shout(text: str) -> str:
    """Says it louder."""
    return text.upper() + "!"


@server.tool()
def fail(why: str) -> str:
    """Always fails, saying why."""
    raise ToolError(f"cannot do it: {why}")


@server.tool()
async def hang(seconds: float = 60.0) -> str:
    """Marks that it started, then takes its time."""
    mark = os.environ.get("AAA_TEST_MCP_MARK")
    if mark:
        Path(mark).write_text(f"started {os.getpid()}")
    await asyncio.sleep(seconds)
    return "woke up"


if __name__ == "__main__":
    if sys.argv[1] == "stdio":
        server.run("stdio")
    else:
        server.run("streamable-http", host="127.0.0.1", port=int(sys.argv[2]))
