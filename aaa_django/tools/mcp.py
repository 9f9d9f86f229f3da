"""The tools of an MCP server, as our tools (needs the ``mcp`` SDK: ``aaa_django[mcp]``).

    from aaa_django.tools import ToolHandler, ToolRegistry
    from aaa_django.tools.mcp import MCPServer

    files = MCPServer("files", command="python", args=["-m", "my_mcp_server"])   # stdio
    search = MCPServer("search", url="http://search:8000/mcp", timeout=30)       # streamable HTTP
    registry = ToolRegistry([*files.tools(), *search.tools()])
    ToolHandler(registry, pools={"search": 4}).attach(engine)

Each tool keeps its name (or ``prefix + name``), description and JSON schema, and runs
through the :class:`~aaa_django.tools.ToolHandler` like any tool: the guard, pools,
timeouts, approvals and the claim-check of a large result are ours. A call the server
answers with an error, or one it cannot answer because it died or the connection
dropped, is a tool failure the model sees (``aaa.tool.failed``), never a hung run.

**Who holds the session.** Every process that runs tools (the web process's engine,
each Celery worker process) holds its own session per event loop, opened on the first
call and kept for the next ones; a stdio server is therefore one subprocess per such
process. A session that failed is dropped and the next call opens a new one (a new
subprocess, for stdio). Nothing about a session is in the log: a run's tool calls are
plain ``aaa.tool.requested`` events that any process can serve.

**Rebuilding the registry in any process.** :meth:`MCPServer.tools` lists the server's
tools (one short connection) when the process wires its engine: the same config gives
the same tools in every process (``AAA["MCP_SERVERS"]`` does it from settings).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import sys
import threading
from collections.abc import Awaitable, Iterable, Mapping, Sequence
from types import ModuleType
from typing import TYPE_CHECKING, Any, TypeVar

from .tool import GuardConfig, SchemaTool

if TYPE_CHECKING:  # an optional dependency: imported where it is used
    from mcp.client import Client
    from mcp.client._transport import Transport
    from mcp_types import ContentBlock, Tool

T = TypeVar("T")

log = logging.getLogger("aaa_django.tools")


class MCPToolError(Exception):
    """The server answered a call with an error (``isError``): its text says why."""


class MCPConnectionError(Exception):
    """The server could not be reached, or it went away during the call."""


def _import() -> ModuleType:
    try:
        import mcp.client
    except ImportError:  # pragma: no cover - depends on the installation
        raise ImportError("MCP tools need the 'mcp' package: pip install 'aaa_django[mcp]'") from None
    return mcp


class _Session:
    """One open session, owned by a task of its own (anyio scopes are entered and left
    in one task); calls from any task of the loop go through it while it is alive."""

    def __init__(self, server: MCPServer) -> None:
        self.server = server
        self.client: Client | None = None
        self.ready = asyncio.Event()
        #: set when the session ended (the server died, the connection dropped, closed)
        self.dead = asyncio.Event()
        self.error: BaseException | None = None
        self._stop = asyncio.Event()
        self.task = asyncio.ensure_future(self._own())

    async def _own(self) -> None:
        from mcp.client import Client

        try:
            async with Client(self.server.target(), read_timeout_seconds=self.server.timeout) as client:
                self.client = client
                self.ready.set()
                await self._stop.wait()
        except BaseException as exc:
            self.error = exc
            if isinstance(exc, asyncio.CancelledError):
                raise
        finally:
            self.dead.set()
            self.ready.set()

    async def opened(self) -> Client:
        await self.ready.wait()
        if self.client is None or self.dead.is_set():
            raise MCPConnectionError(f"MCP server {self.server.name!r}: {_describe(self.error)}")
        return self.client

    async def run(self, coro: Awaitable[T]) -> T:
        """Await ``coro`` unless the session dies first (then :class:`MCPConnectionError`)."""
        call = asyncio.ensure_future(coro)
        death = asyncio.ensure_future(self.dead.wait())
        try:
            await asyncio.wait({call, death}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            death.cancel()
            if not call.done():
                call.cancel()
                with contextlib.suppress(BaseException):
                    await call
        if call.cancelled() or not call.done():
            raise MCPConnectionError(
                f"MCP server {self.server.name!r} went away during the call: {_describe(self.error)}"
            )
        exc = call.exception()
        if exc is not None:
            if self.dead.is_set() or _is_connection_error(exc):
                raise MCPConnectionError(f"MCP server {self.server.name!r}: {_describe(exc)}") from None
            raise exc
        return call.result()

    async def close(self) -> None:
        self._stop.set()
        with contextlib.suppress(BaseException):
            await asyncio.wait_for(asyncio.shield(self.task), 5)
        if not self.task.done():
            self.task.cancel()
            with contextlib.suppress(BaseException):
                await self.task


class MCPServer:
    """An MCP server and how its tools run here.

    Give ``command`` (with ``args``, ``env``, ``cwd``: a stdio server this process
    starts) or ``url`` (a streamable HTTP endpoint). ``prefix`` is put before every tool
    name (two servers may both have a ``search``); ``timeout`` bounds each request to the
    server (seconds; the ToolHandler's own timeout bounds the whole call);
    ``pool``, ``requires_approval`` (True, or the names that need it), ``side_effects`` /
    ``idempotent`` (the guard; True or a set of names) apply to its tools; ``only``
    keeps just the named tools.
    """

    def __init__(
        self,
        name: str,
        *,
        command: str | None = None,
        args: Sequence[str] = (),
        env: Mapping[str, str] | None = None,
        cwd: str | None = None,
        url: str | None = None,
        prefix: str = "",
        timeout: float | None = 30.0,
        tool_timeout: float | None = None,
        pool: str | None = None,
        requires_approval: bool | Iterable[str] = False,
        approval_expires: float | None = None,
        side_effects: bool | Iterable[str] = False,
        idempotent: bool | Iterable[str] = False,
        only: Iterable[str] | None = None,
    ) -> None:
        _import()
        if (command is None) == (url is None):
            raise ValueError(f"MCP server {name!r}: give either command (stdio) or url (streamable HTTP)")
        self.name = name
        self.command = command
        self.args = list(args)
        self.env = dict(env) if env is not None else None
        self.cwd = cwd
        self.url = url
        self.prefix = prefix
        self.timeout = timeout
        self.tool_timeout = tool_timeout
        self.pool = pool
        self.requires_approval = requires_approval
        self.approval_expires = approval_expires
        self.side_effects = side_effects
        self.idempotent = idempotent
        self.only = set(only) if only is not None else None
        self._sessions: dict[asyncio.AbstractEventLoop, _Session] = {}

    def __repr__(self) -> str:
        where = self.url or " ".join([self.command or "", *self.args])
        return f"MCPServer({self.name!r}, {where!r})"

    @classmethod
    def from_config(cls, name: str, config: Mapping[str, Any]) -> MCPServer:
        """From a settings entry: ``{"command": ..., "args": [...]}`` or ``{"url": ...}``
        plus any keyword of the constructor."""
        return cls(name, **dict(config))

    def target(self) -> str | Transport:
        """What the SDK's ``Client`` connects to."""
        if self.url is not None:
            return self.url
        from mcp.client.stdio import StdioServerParameters, stdio_client

        params = StdioServerParameters(command=self.command or "", args=self.args, env=self.env, cwd=self.cwd)
        return stdio_client(params, errlog=_errlog())

    # -- the tools --------------------------------------------------------------------------

    async def list_tools(self) -> list[SchemaTool]:
        """The server's tools as ours (on the running loop's session)."""
        session = await self._session()
        client = await session.opened()
        tools, cursor = [], None
        while True:
            page = await session.run(client.list_tools(cursor=cursor))
            tools.extend(page.tools)
            cursor = page.next_cursor
            if not cursor:
                break
        return [self._tool(t) for t in tools if self.only is None or t.name in self.only]

    def tools(self) -> list[SchemaTool]:
        """:meth:`list_tools` from sync code (wiring an engine, a Django setting): on a
        loop of its own in a thread, whose session is closed after."""
        result: list[SchemaTool] = []
        failed: list[BaseException] = []

        def main() -> None:
            async def go() -> None:
                try:
                    result.extend(await self.list_tools())
                finally:
                    await self.aclose()

            try:
                asyncio.run(go())
            except BaseException as exc:
                failed.append(exc)

        thread = threading.Thread(target=main, name=f"mcp-list-{self.name}", daemon=True)
        thread.start()
        thread.join()
        if failed:
            raise failed[0]
        return result

    def _tool(self, t: Tool) -> SchemaTool:
        remote = t.name

        async def call(args: dict[str, object], key: str | None) -> object:
            return await self.call(remote, args)

        local = self.prefix + remote
        return SchemaTool(
            local,
            dict(t.input_schema or {}),
            call,
            description=t.description or "",
            timeout=self.tool_timeout,
            pool=self.pool,
            requires_approval=_named(self.requires_approval, remote),
            approval_expires=self.approval_expires,
            guard=GuardConfig(
                side_effects=_named(self.side_effects, remote), idempotent=_named(self.idempotent, remote)
            ),
        )

    async def call(self, name: str, args: dict[str, object]) -> object:
        """Call tool ``name`` (the server's own name): its structured content, else its
        text. Raises :class:`MCPToolError` (the tool failed) or
        :class:`MCPConnectionError` (no answer: the session is dropped, the next call
        opens a new one)."""
        session = await self._session()
        try:
            client = await session.opened()
            result = await session.run(client.call_tool(name, args))
        except MCPConnectionError:
            await self._drop(session)
            raise
        if result.is_error:
            raise MCPToolError(_text(result.content) or f"tool {name!r} failed")
        if result.structured_content is not None:
            return result.structured_content
        return _text(result.content)

    # -- sessions, one per event loop ----------------------------------------------------------

    async def _session(self) -> _Session:
        loop = asyncio.get_running_loop()
        for other in [lp for lp in self._sessions if lp is not loop and lp.is_closed()]:
            self._sessions.pop(other, None)  # its loop is gone, and its process or socket with it
        session = self._sessions.get(loop)
        if session is None or session.dead.is_set():
            session = self._sessions[loop] = _Session(self)
        return session

    async def _drop(self, session: _Session) -> None:
        loop = asyncio.get_running_loop()
        if self._sessions.get(loop) is session:
            del self._sessions[loop]
        await session.close()

    async def aclose(self) -> None:
        """Close the running loop's session (a stdio server's process ends with it)."""
        session = self._sessions.pop(asyncio.get_running_loop(), None)
        if session is not None:
            await session.close()


def _named(value: bool | Iterable[str], name: str) -> bool:
    return value if isinstance(value, bool) else name in set(value)


def _text(content: Sequence[ContentBlock]) -> str:
    """Text contents as they are; other kinds (images, resources) as their JSON."""
    from mcp_types import TextContent

    return "\n".join(
        c.text if isinstance(c, TextContent) else json.dumps(c.model_dump(mode="json", by_alias=True)) for c in content
    )


def _is_connection_error(exc: BaseException) -> bool:
    import anyio
    from mcp.shared.exceptions import MCPError
    from mcp_types import CONNECTION_CLOSED

    if isinstance(exc, MCPError):
        return exc.code == CONNECTION_CLOSED
    return isinstance(
        exc,
        (anyio.ClosedResourceError, anyio.BrokenResourceError, anyio.EndOfStream, ConnectionError, EOFError, OSError),
    )


def _describe(exc: BaseException | None) -> str:
    if exc is None:
        return "the session ended"
    if isinstance(exc, BaseExceptionGroup):
        return "; ".join(_describe(e) for e in exc.exceptions)
    from mcp.shared.exceptions import MCPError

    if isinstance(exc, MCPError):
        return f"{exc.message} (MCP error {exc.code})"
    return f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__


def servers_from_settings(config: Mapping[str, Mapping[str, Any]] | None) -> list[MCPServer]:
    """``AAA["MCP_SERVERS"]`` (name -> constructor keywords) as :class:`MCPServer` objects."""
    return [MCPServer.from_config(name, entry) for name, entry in (config or {}).items()]


def _errlog() -> Any:
    """Where a stdio server's stderr goes: this process's ``sys.stderr`` when it is a
    file, else the process's own stderr. The SDK's default is the ``sys.stderr`` of the
    moment it was imported, which in a Celery worker can be Celery's logging proxy (it
    redirects ``sys.stderr`` to its logger), and a subprocess cannot write to that."""
    try:
        sys.stderr.fileno()
    except (AttributeError, OSError, ValueError):
        return sys.__stderr__
    return sys.stderr
