"""``ToolHandler``: turns each ``aaa.tool.requested`` into exactly one result event.

Results are ``aaa.tool.completed`` ``{"call_id", "name", "result"}`` or
``aaa.tool.failed`` ``{"call_id", "name", "reason", "error"}`` with reason one of
``error`` (the tool raised; ``traceback`` included), ``timeout``, ``cancelled`` (the
run ended while it ran), ``denied`` / ``expired`` (approval gate), ``uncertain`` (the
guard refused a second execution and the site has runs end then: ``uncertain="fail"``),
``not_run`` (a person reconciled an uncertain call: it did not run),
``unknown_tool``, ``invalid_arguments``. Both share the request's one result id. A
tool that raises :class:`~aaa_django.runtime.conversation.Ask` asks a person:
``aaa.question.asked``, and the answer is the call's result.

Limits enforced here: per-tool timeouts, named concurrency pools, approval gates,
cancellation of in-flight calls when their run ends, and the execution guard. An
uncertain side-effecting call (its intent in the log, its result not, no live
delivery holding it) waits for a person or ends its run, as ``uncertain`` says
(:mod:`aaa_django.tools.reconcile`); such a call's own outcome, come late, is
recorded as ``aaa.tool.returned``, never as its result.

No call is made for a run this process no longer holds (the bus's
:class:`~aaa_django.runtime.holding.HoldsRuns`, detected once in :meth:`ToolHandler.attach`):
another process drives it, or this one has stood down.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
import traceback
from collections.abc import Callable, Mapping
from contextlib import AbstractAsyncContextManager

from pydantic import ValidationError

from aaa_django.data.jsonvalue import JSONObject, JSONValue
from aaa_django.events import Event, derive_id
from aaa_django.runtime import FAILED, Engine, Outcome
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
    TOOL_RETURNED,
    TOOL_STARTED,
    decision_id,
    result_event,
    result_id,
)
from aaa_django.runtime.holding import HoldsRuns
from aaa_django.runtime.retry import transient

from .reconcile import AGAIN_KEY, POLICIES, UNCERTAIN_REASON, gate, gate_id, returned_id, verdict_of
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
    ``uncertain``: what an uncertain side-effecting call does to its run,
    ``"reconcile"`` (it waits for a person) or ``"fail"`` (it ends ``failed``); see
    :mod:`aaa_django.tools.reconcile`.
    """

    #: seconds a call's outcome in hand is tried to be recorded while the store is away
    RECORD_FOR = 600.0

    def __init__(
        self,
        registry: ToolRegistry,
        *,
        pools: Mapping[str, int] | None = None,
        timeout: float | None = None,
        approval_expires: float | None = None,
        pool_factory: Callable[[str, int], AbstractAsyncContextManager[object]] | None = None,
        uncertain: str = "reconcile",
    ) -> None:
        if uncertain not in POLICIES:
            raise ValueError(f"uncertain is one of {', '.join(POLICIES)}, not {uncertain!r}")
        self.uncertain = uncertain
        self.registry = registry
        self.pool_factory = pool_factory or (lambda name, size: asyncio.Semaphore(size))
        self.pools = dict(pools or {})
        self.timeout = timeout
        self.approval_expires = approval_expires
        self.engine: Engine | None = None
        #: the bus's cluster-wide leases, if it has them (detected once, in ``attach``)
        self._leases: ExclusiveLeases | None = None
        #: the bus's answer to "does this process still hold the run?" (detected once)
        self._holds: HoldsRuns | None = None
        self._semaphores: dict[str, AbstractAsyncContextManager[object]] = {}
        self._inflight: set[str] = set()
        #: request id -> a decision on it delivered while a delivery of the request was
        #: in flight here: acted on once that delivery ends (never dropped)
        self._decided: dict[str, Event] = {}
        #: run id -> request id -> the task running the tool
        self._running: dict[str, dict[str, asyncio.Task]] = {}
        for t in registry:
            if t.pool is not None and t.pool not in self.pools:
                log.warning("tool %r names pool %r, which has no size: unlimited", t.name, t.pool)

    def use_pools(self, pool_factory: Callable[[str, int], AbstractAsyncContextManager[object]]) -> None:
        """Build the pools' limiters with ``pool_factory`` from now on (a Celery worker's
        cluster-wide pools); those made already are dropped."""
        self.pool_factory = pool_factory
        self._semaphores.clear()

    def attach(self, engine: Engine) -> ToolHandler:
        """Subscribe to tool requests, approval decisions and run completions."""
        self.engine = engine
        self._leases = engine.bus if isinstance(engine.bus, ExclusiveLeases) else None
        self._holds = engine.bus if isinstance(engine.bus, HoldsRuns) else None
        # itself, so the engine finds the tools it serves (runtime.engine_api.ServesTools)
        engine.subscribe(TOOL_REQUESTED, self)
        for decision in APPROVAL_DECISIONS:
            engine.subscribe(decision, self.on_decision)
        engine.subscribe(RUN_COMPLETED, self.on_run_completed)
        return self

    async def __call__(self, request: Event) -> None:
        await self.on_request(request)

    def tool_specs(self) -> list[JSONObject]:
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
            if gate_id(request.id) in done:  # found uncertain: a person decides
                decided = done.get(decision_id(gate_id(request.id)))
                if decided is not None:  # (decided, and the decision's delivery lost)
                    await self._reconciled(await engine.hydrate(decided), request)
                return
            tool = self.registry.get(request.data.get("name", ""))
            if tool is None:
                await self._fail(request, "unknown_tool", f"no tool named {request.data.get('name')!r}")
            elif tool.requires_approval:
                await self._ask_approval(request, tool)
            else:
                await self._execute(request, tool, done)
        finally:
            await self._settled(request.id)

    async def _settled(self, request_id: str) -> None:
        """A delivery of the request ended here: a decision on it that came meanwhile is
        acted on now."""
        self._inflight.discard(request_id)
        decision = self._decided.pop(request_id, None)
        if decision is not None:
            await self.on_decision(decision)

    async def on_decision(self, decision: Event) -> None:
        """An approval was granted (run the call), denied or expired (fail it)."""
        engine = self._engine()
        d = decision.data
        found = await engine.store.read(decision.stream, after=d["tool_request_seq"] - 1, limit=1)
        if not found or found[0].id != d["tool_request_id"]:
            log.error("approval %s names a tool request that is not in the log", d.get("request_id"))
            return
        request = await engine.hydrate(found[0])
        if request.id in self._inflight:  # (its delivery may have read the log before it)
            self._decided[request.id] = decision
            return
        self._inflight.add(request.id)
        try:
            if d.get("request_id") == gate_id(request.id):
                await self._reconciled(decision, request)
                return
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
            await self._settled(request.id)

    async def on_run_completed(self, completion: Event) -> None:
        """The run ended: cancel its in-flight calls (each records ``cancelled``)."""
        for task in list(self._running.get(completion.stream, {}).values()):
            task.cancel()

    # -- doing ----------------------------------------------------------------------------

    async def _progress(self, request: Event) -> dict[str, Event]:
        """The request's result, its question to a person (a tool that asks), and (for
        a guarded tool) its intents, its reconciliation gate, the gate's decision and
        its late outcome, if they are in the log."""
        ids = [result_id(request.id), asked_id(request)]
        tool = self.registry.get(request.data.get("name", ""))
        if tool is not None and tool.guard.side_effects:
            ids += [
                request.derive(TOOL_STARTED).id,
                request.derive(TOOL_STARTED, key=AGAIN_KEY).id,
                gate_id(request.id),
                decision_id(gate_id(request.id)),
                returned_id(request.id),
            ]
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

    async def _execute(self, request: Event, tool: Tool, done: dict[str, Event], *, again: Event | None = None) -> None:
        """Run the call (``again``: a person's answer that runs an uncertain call again)."""
        if tool.guard.side_effects and self._leases is not None:
            # Another delivery of this request may be running the call in another
            # process. The call's lease makes a duplicate wait for it, then find its
            # result; an intent without a result is "uncertain" only once its holder
            # is gone (its lease expired), never while the call still runs.
            engine = self._engine()
            name = request.derive(TOOL_STARTED, key=AGAIN_KEY if again is not None else "").id
            async with contextlib.AsyncExitStack() as held:
                async with engine.waiting():  # perhaps on another process's call
                    await held.enter_async_context(self._leases.exclusive(name))
                engine.tail.stale(request.stream)  # what the holder wrote meanwhile
                done = await self._progress(request)
                if result_id(request.id) not in done:
                    await self._run(request, tool, done, again=again)
            return
        await self._run(request, tool, done, again=again)

    def _may_call(self, request: Event) -> bool:
        """Does this process still hold the request's run (no call otherwise)?"""
        if self._holds is None or self._holds.holds(request.stream):
            return True
        log.info(
            "run %s: tool call %s not made here: this process no longer holds the run",
            request.stream,
            request.data.get("call_id"),
        )
        return False

    async def _run(self, request: Event, tool: Tool, done: dict[str, Event], *, again: Event | None = None) -> None:
        engine = self._engine()
        if not self._may_call(request):
            return
        key = derive_id(request.id, "aaa.idempotency")
        if tool.guard.side_effects:
            intent = request.derive(
                TOOL_STARTED,
                {
                    "call_id": request.data.get("call_id"),
                    "name": tool.name,
                    "idempotency_key": key,
                    **({"again": again.id} if again is not None else {}),
                },
                key=AGAIN_KEY if again is not None else "",
            )
            if intent.id in done:
                # It may have run before a crash. Run again only if that is safe.
                if not tool.guard.idempotent:
                    await self._uncertain(request, tool, again=again is not None)
                    return
            elif gate_id(request.id) in done and again is None:
                return  # found uncertain already: a person decides
            elif not await engine.append([intent]):
                return  # another worker wrote the intent first: it runs the call
        try:
            args = tool.validate(request.data.get("args") or {})
        except ValidationError as exc:
            await self._fail(request, "invalid_arguments", str(exc), errors=json.loads(exc.json(include_url=False)))
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
        await self._record(request, tool, task, again=again is not None)

    async def _record(self, request: Event, tool: Tool, task: asyncio.Future, *, again: bool) -> None:
        """Record what the call did: its result, or (a guarded call settled otherwise
        meanwhile) its late outcome. A guarded call's outcome in hand is never thrown
        away and never bought again by running the call again: when the store is away
        (this process cut off), the append is tried again, with backoff, for up to
        :attr:`RECORD_FOR` seconds. (Another tool's failed append fails its delivery,
        which the bus delivers again: the call is made again.)"""
        if not tool.guard.side_effects:
            await self._answer(request, tool, task)
            return
        loop = asyncio.get_running_loop()
        give_up, delay = loop.time() + self.RECORD_FOR, 0.5
        while True:
            try:
                if await self._late(request, tool, task, again=again):
                    return
                await self._answer(request, tool, task)
                return
            except Exception as exc:
                if not transient(exc) or loop.time() + delay > give_up:
                    raise
                log.warning(
                    "run %s: recording the outcome of tool call %s failed (%s: %s); trying again in %.1f s",
                    request.stream,
                    request.data.get("call_id"),
                    type(exc).__name__,
                    exc,
                    delay,
                )
                await asyncio.sleep(delay)
                delay = min(delay * 2, 10.0)

    async def _answer(self, request: Event, tool: Tool, task: asyncio.Future) -> None:
        engine = self._engine()
        error = task.exception()
        if isinstance(error, Ask):  # the answer will be the result
            await ask_for_tool(engine, request, error)
        elif isinstance(error, _ToolTimeout):
            await self._fail(request, "timeout", str(error))
        elif error is not None:
            tb = "".join(traceback.format_exception(type(error), error, error.__traceback__))
            await self._fail(request, "error", f"{type(error).__name__}: {error}", traceback=tb)
        else:
            data = {"call_id": request.data.get("call_id"), "name": tool.name, "result": task.result()}
            await engine.answer([result_event(request, TOOL_COMPLETED, data)])

    async def _late(self, request: Event, tool: Tool, task: asyncio.Future, *, again: bool) -> bool:
        """After a guarded call: was it settled otherwise meanwhile (found uncertain by
        another process, which asked a person, or recorded it)? Then its outcome is
        recorded as ``aaa.tool.returned`` (the reconciliation's evidence), not as its
        result; True. (Read afresh: this process's view of the run may be old.)"""
        engine = self._engine()
        engine.tail.stale(request.stream)
        done = await self._progress(request)
        if result_id(request.id) not in done and (again or gate_id(request.id) not in done):
            return False
        error = task.exception()
        outcome: JSONObject = (
            {"result": task.result()}
            if error is None
            else {
                "reason": "timeout" if isinstance(error, _ToolTimeout) else "error",
                "error": f"{type(error).__name__}: {error}",
            }
        )
        late = Event(
            id=returned_id(request.id),
            stream=request.stream,
            type=TOOL_RETURNED,
            data={"call_id": request.data.get("call_id"), "name": tool.name, "request_id": request.id, **outcome},
            causation=request.id,
            tenant=request.tenant,
        )
        if await engine.append([late]):
            log.warning(
                "run %s: tool call %s returned after it was found uncertain; its outcome is recorded "
                "as %s for the person who reconciles it",
                request.stream,
                request.data.get("call_id"),
                TOOL_RETURNED,
            )
        elif returned_id(request.id) not in done:
            log.warning(
                "run %s: tool call %s returned after its run ended (it was found uncertain): its outcome "
                "cannot join the log: %r",
                request.stream,
                request.data.get("call_id"),
                outcome,
            )
        return True

    async def _uncertain(self, request: Event, tool: Tool, *, again: bool) -> None:
        """The call may have run (its intent is in the log, its result is not, and no
        live delivery holds it): never run again by itself. ``"reconcile"``: a person
        decides (a gate); ``"fail"`` (or a call a person ran again that was cut off
        again): the run ends ``failed``, naming the call."""
        engine = self._engine()
        call_id = request.data.get("call_id")
        if self.uncertain == "reconcile" and not again:
            log.warning(
                "run %s: tool call %s (%s) may have run and is not run again: the run waits for a "
                "person to reconcile it",
                request.stream,
                call_id,
                tool.name,
            )
            await engine.append([gate(request, tool.name)])
            return
        why = (
            "the call may have run (its intent is in the log, its result is not) and the tool is not "
            "idempotent: not running it again"
        )
        failed = result_event(
            request, TOOL_FAILED, {"call_id": call_id, "name": tool.name, "reason": "uncertain", "error": why}
        )
        ended = engine.completion(
            request.stream,
            Outcome(
                FAILED,
                {
                    "error": f"tool call {call_id} ({tool.name}) may have run, and its run cannot go on as if it had not",
                    "reason": UNCERTAIN_REASON,
                    "call_id": call_id,
                    "name": tool.name,
                    "tool_request_id": request.id,
                },
            ),
            cause=request,
        )
        log.warning(
            "run %s: tool call %s (%s) may have run: the run ends failed (%s)",
            request.stream,
            call_id,
            tool.name,
            UNCERTAIN_REASON,
        )
        await engine.append([failed, ended])

    async def _reconciled(self, decision: Event, request: Event) -> None:
        """A person answered an uncertain call's gate: it ran (recorded with the result
        its late outcome brought, or the one given), it did not (failed, ``not_run``),
        or run it again."""
        engine = self._engine()
        done = await self._progress(request)
        if result_id(request.id) in done or await engine.over(request):
            return
        verdict, by = verdict_of(decision), decision.data.get("by")
        name = request.data.get("name", "")
        if verdict == "run_again":
            tool = self.registry.get(name)
            if tool is None:
                await self._fail(request, "unknown_tool", f"no tool named {name!r}")
            else:
                await self._execute(request, tool, done, again=decision)
        elif verdict == "not_run":
            why = decision.data.get("reason")
            await self._fail(
                request,
                "not_run",
                "a person reconciled the call: it did not run"
                + (f" ({by})" if by else "")
                + (f": {why}" if why else ""),
            )
        else:
            late = done.get(returned_id(request.id))
            result = (
                late.data.get("result") if late is not None and "result" in late.data else decision.data.get("result")
            )
            data = {
                "call_id": request.data.get("call_id"),
                "name": name,
                "result": result,
                "reconciled": {"verdict": "ran", "by": by, "evidence": late.id if late is not None else None},
            }
            await engine.answer([result_event(request, TOOL_COMPLETED, data)])

    async def _invoke(self, tool: Tool, args: Mapping[str, object], key: str) -> JSONValue:
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

    def _pool(self, name: str | None) -> AbstractAsyncContextManager[object] | None:
        if name is None or name not in self.pools:
            return None
        pool = self._semaphores.get(name)
        if pool is None:
            pool = self._semaphores[name] = self.pool_factory(name, self.pools[name])
        return pool

    async def _fail(self, request: Event, reason: str, error: str, **extra: object) -> None:
        data = {
            "call_id": request.data.get("call_id"),
            "name": request.data.get("name"),
            "reason": reason,
            "error": error,
            **extra,
        }
        await self._engine().answer([result_event(request, TOOL_FAILED, data)])

    def _engine(self) -> Engine:
        assert self.engine is not None, "attach the handler to an engine first"
        return self.engine
