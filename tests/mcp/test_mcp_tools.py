"""An MCP server's tools, run by the engine's ToolHandler: the server is a real process
(``server.py``, the ``mcp`` SDK), over stdio and over streamable HTTP."""

from __future__ import annotations

import asyncio
import json

from aaa_django.algos import ToolLoop
from aaa_django.data import InMemoryBlobStore, is_claimed
from aaa_django.llm.fake import text, tool_call
from aaa_django.runtime.event_types import (
    APPROVAL_GRANTED,
    APPROVAL_REQUESTED,
    TOOL_COMPLETED,
    TOOL_FAILED,
)
from aaa_django.tools import ToolRegistry
from aaa_django.tools.mcp import MCPServer
from tests.runtime.helpers import arun, make_engine, of_type


def call_then_report(name, **args):
    """A model that calls one tool, then answers with what the tool said."""

    def model(request):
        results = [m for m in request.messages if m.role == "tool"]
        return tool_call(name, **args) if not results else text(f"tool said: {results[-1].content}")

    return model


async def run_loop(server: MCPServer, model, *, engine_kw=None, until_started=None, act=None):
    registry = ToolRegistry(await server.list_tools())
    async with make_engine(model, registry, **(engine_kw or {})) as engine:
        run = await engine.start(ToolLoop(registry), {"task": "use the tool"})
        if act is not None:
            await act(engine, run)
        outcome = await run.result(timeout=60)
        await engine.drain(5)
        log = await engine.store.read(run.run_id)
    await server.aclose()
    return registry, outcome, log


def test_tools_keep_their_names_descriptions_and_schemas(transport):
    config, _ = transport
    tools = arun(_listed(MCPServer("t", prefix="srv_", **config)), timeout=60)
    add = tools["srv_add"].spec()
    assert add["description"] == "Adds two numbers."
    assert add["parameters"]["properties"] == {
        "a": {"title": "A", "type": "integer"},
        "b": {"title": "B", "type": "integer"},
    }
    assert add["parameters"]["required"] == ["a", "b"]
    assert set(tools) == {"srv_add", "srv_shout", "srv_fail", "srv_hang"}


async def _listed(server):
    try:
        return {t.name: t for t in await server.list_tools()}
    finally:
        await server.aclose()


def test_a_tool_loop_calls_an_mcp_tool(transport):
    config, _ = transport
    _, outcome, log = arun(run_loop(MCPServer("t", **config), call_then_report("add", a=2, b=40)), timeout=90)
    assert (outcome.outcome, outcome.value) == ("success", {"text": 'tool said: {"result": 42}'})
    [done] = of_type(log, TOOL_COMPLETED)
    assert done.data["result"] == {"result": 42}


def test_a_tool_error_is_a_failure_the_model_sees(transport):
    config, _ = transport
    _, outcome, log = arun(run_loop(MCPServer("t", **config), call_then_report("fail", why="no disk")), timeout=90)
    [failed] = of_type(log, TOOL_FAILED)
    assert failed.data["reason"] == "error" and "MCPToolError" in failed.data["error"]
    assert "cannot do it: no disk" in failed.data["error"]
    assert outcome.outcome == "success" and "cannot do it: no disk" in outcome.value["text"]


def test_a_server_killed_mid_call_is_a_failure_not_a_hung_run(transport, mark):
    config, kill = transport

    async def kill_when_started(engine, run):
        while not mark.exists():
            await asyncio.sleep(0.02)
        kill()

    _, outcome, log = arun(
        run_loop(MCPServer("t", **config), call_then_report("hang", seconds=120), act=kill_when_started), timeout=90
    )
    [failed] = of_type(log, TOOL_FAILED)
    assert failed.data["reason"] == "error" and "MCPConnectionError" in failed.data["error"], failed.data
    # the model was told, and the run ended on its answer: nothing waited for the dead server
    assert outcome.outcome == "success" and "MCPConnectionError" in outcome.value["text"]


def test_a_stdio_session_is_reopened_after_its_server_died(mark):
    from .conftest import stdio_config

    server = MCPServer("t", **stdio_config(mark))

    async def main():
        first = asyncio.ensure_future(server.call("hang", {"seconds": 120}))
        while not mark.exists():
            await asyncio.sleep(0.02)
        import os
        import signal

        os.kill(int(mark.read_text().split()[1]), signal.SIGKILL)
        try:
            await first
        except Exception as exc:  # noqa: BLE001
            error = exc
        again = await server.call("shout", {"text": "still here"})
        await server.aclose()
        return error, again

    error, again = arun(main(), timeout=90)
    assert type(error).__name__ == "MCPConnectionError"
    assert again == {"result": "STILL HERE!"}


def test_an_approval_gate_applies_to_an_mcp_tool(transport):
    config, _ = transport
    server = MCPServer("t", requires_approval=["add"], **config)

    async def approve(engine, run):
        while True:
            meta = await engine.meta(run.run_id)
            if meta.approvals:
                await engine.approve(run.run_id, next(iter(meta.approvals)), by="ops")
                return
            await asyncio.sleep(0.02)

    registry, outcome, log = arun(run_loop(server, call_then_report("add", a=1, b=1), act=approve), timeout=90)
    assert registry["add"].requires_approval and not registry["shout"].requires_approval
    assert [e.type for e in log if e.type.startswith("aaa.approval")] == [APPROVAL_REQUESTED, APPROVAL_GRANTED]
    assert outcome.outcome == "success" and outcome.value["text"] == 'tool said: {"result": 2}'


def test_a_large_mcp_result_is_claim_checked(transport):
    config, _ = transport
    loud = "x" * 3000
    _, outcome, log = arun(
        run_loop(
            MCPServer("t", **config),
            call_then_report("shout", text=loud),
            engine_kw={"blobs": InMemoryBlobStore(), "claim_threshold": 1024},
        ),
        timeout=90,
    )
    [done] = of_type(log, TOOL_COMPLETED)
    assert is_claimed(done.data)  # 3 KB of result went to the blob store
    assert outcome.outcome == "success" and json.dumps({"result": loud.upper() + "!"}) in outcome.value["text"]


def test_a_stdio_server_starts_where_sys_stderr_is_not_a_file():
    # A Celery worker replaces sys.stderr with its logging proxy; the SDK's default
    # stderr for the server is the sys.stderr of the moment it was imported.
    import subprocess
    import sys

    from .conftest import ROOT, SERVER

    script = (
        "import asyncio, io, sys\n"
        "sys.stderr = io.StringIO()  # as Celery's proxy: no file descriptor\n"
        "from aaa_django.tools.mcp import MCPServer\n"
        f"server = MCPServer('calc', command=sys.executable, args=[{str(SERVER)!r}, 'stdio'])\n"
        "print(sorted(t.name for t in server.tools()))\n"
    )
    done = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "['add', 'fail', 'hang', 'shout']"
