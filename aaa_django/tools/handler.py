"""``ToolHandler``: turns each ``aaa.tool.requested`` into exactly one result event.

Results are ``aaa.tool.completed`` ``{"call_id", "name", "result"}`` or
``aaa.tool.failed`` ``{"call_id", "name", "reason", "error"}`` with reason one of
``error`` (the tool raised; ``traceback`` included), ``timeout``, ``cancelled`` (the
run ended while it ran), ``denied`` / ``expired`` (approval gate), ``uncertain`` (the
guard refused a second execution: the call's intent is in the log, its result is not,
and no live delivery holds it), ``unknown_tool``, ``invalid_arguments``. Both
share the request's one result id. A tool that raises
:class:`~aaa_django.runtime.conversation.Ask` asks a person: ``aaa.question.asked``,
and the answer is the call's result.

Limits enforced here: per-tool timeouts, named concurrency pools, approval gates,
cancellation of in-flight calls when their run ends, and the execution guard.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
import traceback
from typing import Any, AsyncContextManager, Callable, Mapping

from pydantic import ValidationError

from aaa_django.events import Event, derive_id
from aaa_django.runtime import Engine
from aaa_django.runtime.bus import ExclusiveLeases
from aaa_django.runtime.conversation import Ask, ask_for_tool, asked_id
from aaa_django.runtime.event_types import (
    APPROVAL_DECISIONS,
    APPROVAL_EXPIRED,
    APPROVAL_GRANTED,
    APPROVAL_REQUESTED,
    RUN_COMPLETED,
    TOOL_COMPLETED,
    TOOL_FAILED,
    TOOL_REQUESTED,
    TOOL_STARTED,
    result_event,
    result_id,
)

from .registry import ToolRegistry
from .tool import Tool

log = logging.getLogger("aaa_django.tools")


class _ToolTimeout(Exception):
    """The call ran out of time (kept apart from a TimeoutError the tool raises)."""


class ToolHandler:
    """Runs tools from ``registry``.

    ``pools`` sizes named concurrency pools (``{"db": 2}``: at most two calls of
    ``@tool(pool="db")`` tools at once; a pool not listed is unlimited);
    ``timeout`` is the default per-call timeout in seconds; ``approval_expires`` the
    default expiry of approval gates in seconds (None: wait forever);
    ``pool_factory(name, size)`` builds a pool's limiter, any async context manager
    (default ``asyncio.Semaphore(size)``, per process; a cluster passes a shared one).
    """

    def __init__(
        self,
        registry: ToolRegistry,
        *,
        pools: Mapping[str, int] | None = None,
        timeout: float | None = None,
        approval_expires: float | None = None,
        pool_factory: Callable[[str, int], AsyncContextManager[Any]] | None = None,
    ) -> None:
        self.registry = registry
        self.pool_factory = pool_factory or (lambda name, size: asyncio.Semaphore(size))
        self.pools = dict(pools or {})
        self.timeout = timeout
        self.approval_expires = approval_expires
        self.engine: "Engine | None" = None
        #: the bus's cluster-wide leases, if it has them (detected once, in ``attach``)
        self._leases: ExclusiveLeases | None = None
        self._semaphores: dict[str, AsyncContextManager[Any]] = {}
        self._inflight: set[str] = set()
        #: run id -> request id -> the task running the tool
        self._running: dict[str, dict[str, asyncio.Task]] = {}
        for t in registry:
            if t.pool is not None and t.pool not in self.pools:
                log.warning("tool %r names pool %r, which has no size: unlimited", t.name, t.pool)

    def attach(self, engine: "Engine") -> "ToolHandler":
        """Subscribe to tool requests, approval decisions and run completions."""
        self.engine = engine
        self._leases = engine.bus if isinstance(engine.bus, ExclusiveLeases) else None
        # itself, so the engine finds the tools it serves (runtime.engine_api.ServesTools)
        engine.subscribe(TOOL_REQUESTED, self)
        for decision in APPROVAL_DECISIONS:
            engine.subscribe(decision, self.on_decision)
        engine.subscribe(RUN_COMPLETED, self.on_run_completed)
        return self

    async def __call__(self, request: Event) -> None:
        await self.on_request(request)

    def tool_specs(self) -> list[dict[str, Any]]:
        """The JSON specs of the tools it runs: what a run's model is offered when its
        config names none (:mod:`aaa_django.runtime.offered`)."""
        return self.registry.specs()

    def running(self, run_id: str) -> int:
        """Tool calls of the run executing now in this process."""
        return len(self._running.get(run_id, ()))

    # -- events -------------------------------------------------------------------------

    async def on_request(self, request: Event) -> None:
        """A tool was requested: gate it, or run it."""
        if request.id in self._inflight:  # delivered again while we are on it
            return
        self._inflight.add(request.id)
        try:
            engine = self._engine()
            if await engine.over(request):
                return
            done = await self._progress(request)
            if result_id(request.id) in done or asked_id(request) in done:
                return  # answered, or waiting for a person's answer
            tool = self.registry.get(request.data.get("name", ""))
            if tool is None:
                await self._fail(request, "unknown_tool",
                                 f"no tool named {request.data.get('name')!r}")
            elif tool.requires_approval:
                await self._ask_approval(request, tool)
            else:
                await self._execute(request, tool, done)
        finally:
            self._inflight.discard(request.id)

    async def on_decision(self, decision: Event) -> None:
        """An approval was granted (run the call), denied or expired (fail it)."""
        engine = self._engine()
        d = decision.data
        found = await engine.store.read(decision.stream, after=d["tool_request_seq"] - 1, limit=1)
        if not found or found[0].id != d["tool_request_id"]:
            log.error("approval %s names a tool request that is not in the log", d.get("request_id"))
            return
        request = await engine.hydrate(found[0])
        if request.id in self._inflight:
            return
        self._inflight.add(request.id)
        try:
            done = await self._progress(request)
            if result_id(request.id) in done or await engine.over(request):
                return
            if decision.type == APPROVAL_GRANTED:
                tool = self.registry.get(request.data.get("name", ""))
                if tool is None:
                    await self._fail(request, "unknown_tool", f"no tool named {request.data.get('name')!r}")
                else:
                    await self._execute(request, tool, done)
            else:
                reason = "expired" if decision.type == APPROVAL_EXPIRED else "denied"
                why = d.get("reason")
                await self._fail(request, reason, f"approval {reason}" + (f": {why}" if why else ""))
        finally:
            self._inflight.discard(request.id)

    async def on_run_completed(self, completion: Event) -> None:
        """The run ended: cancel its in-flight calls (each records ``cancelled``)."""
        for task in list(self._running.get(completion.stream, {}).values()):
            task.cancel()

    # -- doing ----------------------------------------------------------------------------

    async def _progress(self, request: Event) -> dict[str, Event]:
        """The request's result and (for a guarded tool) its intent, if they are in
        the log."""
        ids = [result_id(request.id), asked_id(request)]
        tool = self.registry.get(request.data.get("name", ""))
        if tool is not None and tool.guard.side_effects:
            ids.append(request.derive(TOOL_STARTED).id)
        return await self._engine().find_after(request, ids)

    async def _ask_approval(self, request: Event, tool: Tool) -> None:
        expires = tool.approval_expires if tool.approval_expires is not None else self.approval_expires
        d = request.data
        data = {
            "tool_request_id": request.id,
            "tool_request_seq": request.seq,
            "call_id": d.get("call_id"),
            "name": tool.name,
            "args": d.get("args") or {},
            "expires_at": time.time() + expires if expires is not None else None,
        }
        await self._engine().append([request.derive(APPROVAL_REQUESTED, data)])

    async def _execute(self, request: Event, tool: Tool, done: dict[str, Event]) -> None:
        if tool.guard.side_effects and self._leases is not None:
            # Another delivery of this request may be running the call in another
            # process. The call's lease makes a duplicate wait for it, then find its
            # result; an intent without a result is "uncertain" only once its holder
            # is gone (its lease expired), never while the call still runs.
            engine = self._engine()
            async with contextlib.AsyncExitStack() as held:
                async with engine.waiting():  # perhaps on another process's call
                    await held.enter_async_context(self._leases.exclusive(request.derive(TOOL_STARTED).id))
                engine.tail.stale(request.stream)  # what the holder wrote meanwhile
                done = await self._progress(request)
                if result_id(request.id) not in done:
                    await self._run(request, tool, done)
            return
        await self._run(request, tool, done)

    async def _run(self, request: Event, tool: Tool, done: dict[str, Event]) -> None:
        engine = self._engine()
        key = derive_id(request.id, "aaa.idempotency")
        if tool.guard.side_effects:
            intent = request.derive(
                TOOL_STARTED,
                {"call_id": request.data.get("call_id"), "name": tool.name, "idempotency_key": key},
            )
            if intent.id in done:
                # It may have run before a crash. Run again only if that is safe.
                if not tool.guard.idempotent:
                    await self._fail(
                        request,
                        "uncertain",
                        "the call may have run (its intent is in the log, its result is "
                        "not) and the tool is not idempotent: not running it again",
                    )
                    return
            elif not await engine.append([intent]):
                return  # another worker wrote the intent first: it runs the call
        try:
            args = tool.validate(request.data.get("args") or {})
        except ValidationError as exc:
            await self._fail(request, "invalid_arguments", str(exc),
                             errors=json.loads(exc.json(include_url=False)))
            return
        if await engine.over(request):
            return
        task = asyncio.ensure_future(self._invoke(tool, args, key))
        running = self._running.setdefault(request.stream, {})
        running[request.id] = task
        try:
            async with engine.waiting():  # (its pool, then the call) other runs' work goes on
                await asyncio.wait({task})
        except asyncio.CancelledError:  # the delivery itself is cancelled (shutdown)
            task.cancel()
            raise
        finally:
            running.pop(request.id, None)
            if not running:
                self._running.pop(request.stream, None)
        if task.cancelled():
            await self._fail(request, "cancelled", "the run ended while the tool was running")
            return
        error = task.exception()
        if isinstance(error, Ask):  # the answer will be the result
            await ask_for_tool(engine, request, error)
        elif isinstance(error, _ToolTimeout):
            await self._fail(request, "timeout", str(error))
        elif error is not None:
            tb = "".join(traceback.format_exception(type(error), error, error.__traceback__))
            await self._fail(request, "error", f"{type(error).__name__}: {error}", traceback=tb)
        else:
            data = {"call_id": request.data.get("call_id"), "name": tool.name,
                    "result": task.result()}
            await engine.answer([result_event(request, TOOL_COMPLETED, data)])

    async def _invoke(self, tool: Tool, args: dict[str, Any], key: str) -> Any:
        pool = self._pool(tool.pool)
        async with pool if pool is not None else contextlib.nullcontext():
            timeout = tool.timeout if tool.timeout is not None else self.timeout
            if timeout is None:
                return await tool.invoke(args, idempotency_key=key)
            limit = asyncio.timeout(timeout)
            try:
                async with limit:
                    return await tool.invoke(args, idempotency_key=key)
            except TimeoutError:
                if limit.expired():  # ours (not a TimeoutError the tool raised itself)
                    raise _ToolTimeout(f"tool {tool.name!r} timed out after {timeout}s") from None
                raise

    def _pool(self, name: str | None) -> AsyncContextManager[Any] | None:
        if name is None or name not in self.pools:
            return None
        pool = self._semaphores.get(name)
        if pool is None:
            pool = self._semaphores[name] = self.pool_factory(name, self.pools[name])
        return pool

    async def _fail(self, request: Event, reason: str, error: str, **extra: Any) -> None:
        data = {"call_id": request.data.get("call_id"), "name": request.data.get("name"),
                "reason": reason, "error": error, **extra}
        await self._engine().answer([result_event(request, TOOL_FAILED, data)])

    def _engine(self) -> "Engine":
        assert self.engine is not None, "attach the handler to an engine first"
        return self.engine
