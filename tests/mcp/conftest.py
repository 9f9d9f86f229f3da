"""MCP servers started as real processes (``tests/mcp/server.py``, written with the
``mcp`` SDK): over stdio (each session spawns its own process) and over streamable HTTP
(``http_server``: one process for the test, on a free port, stopped by its PID)."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

SERVER = Path(__file__).with_name("server.py")
ROOT = SERVER.parents[2]


def stdio_config(mark: Path | None = None, **kw) -> dict:
    env = {**os.environ, **({"AAA_TEST_MCP_MARK": str(mark)} if mark else {})}
    return {"command": sys.executable, "args": [str(SERVER), "stdio"], "env": env, "cwd": str(ROOT), **kw}


class HttpServer:
    def __init__(self, mark: Path) -> None:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self.proc = subprocess.Popen(
            [sys.executable, str(SERVER), "http", str(self.port)],
            cwd=ROOT,
            env={**os.environ, "AAA_TEST_MCP_MARK": str(mark)},
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        self.url = f"http://127.0.0.1:{self.port}/mcp"

    def wait_ready(self, timeout: float = 60) -> None:
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            if self.proc.poll() is not None:
                raise RuntimeError("the MCP HTTP server exited")
            with socket.socket() as s:
                if s.connect_ex(("127.0.0.1", self.port)) == 0:
                    return
            time.sleep(0.05)
        raise RuntimeError(f"the MCP HTTP server did not listen within {timeout} s")

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(10)


@pytest.fixture
def mark(tmp_path) -> Path:
    """The file the ``hang`` tool writes ``started <pid>`` to."""
    return tmp_path / "hang.mark"


@pytest.fixture
def http_server(mark):
    server = HttpServer(mark)
    try:
        server.wait_ready()
        yield server
    finally:
        server.kill()


@pytest.fixture(params=["stdio", "http"])
def transport(request, mark):
    """``(MCPServer keywords, kill)``: the server over each transport, and how to kill the
    process serving a call now (its PID is in ``mark``)."""
    if request.param == "stdio":
        return stdio_config(mark), lambda: os.kill(int(mark.read_text().split()[1]), signal.SIGKILL)
    server = request.getfixturevalue("http_server")
    return {"url": server.url}, server.kill
