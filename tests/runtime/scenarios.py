"""One scenario per outcome and per limit, each runnable on a normal bus or on a bus
that delivers every event twice.

A scenario returns its outcome, the log (every stream it touched, raw as stored) and
what its tools observed; ``EXPECTED`` says which outcome and event types it must
produce. Run ids are fixed, so every event id is deterministic and two runs of a
scenario can be compared id for id.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any, Awaitable, Callable

from aaa_django.algos import ToolLoop
from aaa_django.events import Event
from aaa_django.llm.fake import text, tool_call
from aaa_django.runtime import Budget, Engine, Outcome
from aaa_django.tools import ToolRegistry, tool

from . import algos  # noqa: F401  (registers the test algorithms)
from .helpers import FAR_DEADLINE, make_engine, pass_deadline, tool_messages, until

RUN = "run-scenario"


@dataclass
class Result:
    outcome: Outcome
    log: list[Event]
    seen: dict[str, Any] = field(default_factory=dict)
    engine: Engine | None = None


async def finish(engine: Engine, run_ids: list[str], seen: dict | None = None) -> Result:
    """Wait for the first run to end and the bus to go idle; collect the logs."""
    outcome = await engine.run(run_ids[0]).result(timeout=10)
    await engine.drain(10)
    log: list[Event] = []
    for rid in run_ids:
        log.extend(await engine.store.read(rid))
    return Result(outcome, log, seen or {}, engine)


# -- tools ------------------------------------------------------------------------------


@tool
def add(a: int, b: int) -> int:
    """Adds two numbers.

    Args:
        a: the first number
        b: the second number
    """
    return a + b


def slow_tool(seen: dict, seconds: float = 30.0):
    """An async tool that signals when it starts and then sleeps."""
    started = asyncio.Event()
    seen["started"] = started

    @tool(name="slow")
    async def slow() -> str:
        """Takes its time."""
        started.set()
        await asyncio.sleep(seconds)
        return "finally"

    return slow


def add_then_answer(request):
    return tool_call("add", a=1, b=2) if tool_messages(request) == 0 else text("1 + 2 = 3")


def call_once_then_report(name: str, **args):
    """A model that calls ``name`` once, then reports what the tool said."""

    def model(request):
        if tool_messages(request) == 0:
            return tool_call(name, **args)
        return text(f"tool said: {request.messages[-1].content}")

    return model


# -- the seven outcomes -------------------------------------------------------------------


async def success(duplicate: bool) -> Result:
    async with make_engine(add_then_answer, ToolRegistry([add]), duplicate=duplicate) as engine:
        await engine.start(ToolLoop(ToolRegistry([add])), {"task": "add 1 and 2"}, run_id=RUN)
        return await finish(engine, [RUN])


async def no_solution(duplicate: bool) -> Result:
    def model(request):
        return tool_call("add", a=1, b=tool_messages(request))

    async with make_engine(model, ToolRegistry([add]), duplicate=duplicate) as engine:
        await engine.start(ToolLoop(ToolRegistry([add]), max_turns=2), {"task": "loop"}, run_id=RUN)
        return await finish(engine, [RUN])


async def timeout(duplicate: bool) -> Result:
    seen: dict = {}
    registry = ToolRegistry([slow_tool(seen)])
    async with make_engine(call_once_then_report("slow"), registry, duplicate=duplicate) as engine:
        await engine.start(ToolLoop(registry), {"task": "be slow"}, deadline=FAR_DEADLINE, run_id=RUN)
        await asyncio.wait_for(seen["started"].wait(), 5)
        await pass_deadline(engine, RUN)  # (once the tool runs, whatever the machine's load)
        return await finish(engine, [RUN], seen)


def budget_scenario(budget: Budget, model: Callable, task: str = "add 1 and 2"):
    async def scenario(duplicate: bool) -> Result:
        calls = {"tool": 0}

        @tool(name="add")
        def counted_add(a: int, b: int) -> int:
            """Adds, counting its calls."""
            calls["tool"] += 1
            return a + b

        registry = ToolRegistry([counted_add])
        async with make_engine(model, registry, duplicate=duplicate) as engine:
            client = engine._handlers["aaa.llm.requested"][0].client
            await engine.start(ToolLoop(registry), {"task": task}, budget=budget, run_id=RUN)
            result = await finish(engine, [RUN], calls)
            calls["model"] = client.calls
            return result

    return scenario


def always_add(request):
    return tool_call("add", a=1, b=tool_messages(request))


budget_tokens = budget_scenario(Budget(tokens=30), add_then_answer, task="x" * 100)
budget_cost = budget_scenario(Budget(cost=0.00002), add_then_answer, task="x" * 100)
budget_model_calls = budget_scenario(Budget(model_calls=1), always_add)
budget_tool_calls = budget_scenario(Budget(tool_calls=1), always_add)


async def invalid_input(duplicate: bool) -> Result:
    async with make_engine(add_then_answer, ToolRegistry([add]), duplicate=duplicate) as engine:
        await engine.start(ToolLoop(ToolRegistry([add])), {"job": "no task here"}, run_id=RUN)
        return await finish(engine, [RUN])


async def cancelled(duplicate: bool) -> Result:
    seen: dict = {}
    registry = ToolRegistry([slow_tool(seen)])
    async with make_engine(call_once_then_report("slow"), registry, duplicate=duplicate) as engine:
        run = await engine.start(ToolLoop(registry), {"task": "be slow"}, run_id=RUN)
        await asyncio.wait_for(seen["started"].wait(), 5)
        await run.cancel("changed my mind", by="tester")
        return await finish(engine, [RUN], seen)


async def failed(duplicate: bool) -> Result:
    async with make_engine(duplicate=duplicate) as engine:
        await engine.start("tests.boom", {}, run_id=RUN)
        return await finish(engine, [RUN])


async def failed_model(duplicate: bool) -> Result:
    def model(request):
        raise ConnectionError("the provider is down")

    async with make_engine(model, ToolRegistry([add]), duplicate=duplicate) as engine:
        await engine.start(ToolLoop(ToolRegistry([add])), {"task": "anything"}, run_id=RUN)
        return await finish(engine, [RUN])


# -- limits ---------------------------------------------------------------------------------


def _approval_scenario(decide: str):
    async def scenario(duplicate: bool) -> Result:
        seen = {"deployed": 0}

        @tool(requires_approval=True, approval_expires=0.5 if decide == "expire" else None)
        def deploy(env: str) -> str:
            """Deploys to an environment."""
            seen["deployed"] += 1
            return f"deployed to {env}"

        registry = ToolRegistry([deploy])
        model = call_once_then_report("deploy", env="prod")
        async with make_engine(model, registry, duplicate=duplicate) as engine:
            run = await engine.start(ToolLoop(registry), {"task": "ship it"}, run_id=RUN)

            async def pending() -> bool:
                return bool((await run.meta()).approvals)

            await until(pending)
            (request_id,) = (await run.meta()).approvals
            seen["request_id"] = request_id
            if decide == "grant":
                seen["decided"] = await engine.approve(RUN, request_id, by="alice")
            elif decide == "deny":
                seen["decided"] = await engine.deny(RUN, request_id, by="bob", reason="not today")
            return await finish(engine, [RUN], seen)

    return scenario


approval_granted = _approval_scenario("grant")
approval_denied = _approval_scenario("deny")
approval_expired = _approval_scenario("expire")


async def tool_timeout(duplicate: bool) -> Result:
    @tool(timeout=0.05)
    async def sluggish() -> str:
        """Never answers in time."""
        await asyncio.sleep(5)
        return "too late"

    registry = ToolRegistry([sluggish])
    async with make_engine(call_once_then_report("sluggish"), registry, duplicate=duplicate) as engine:
        await engine.start(ToolLoop(registry), {"task": "try"}, run_id=RUN)
        return await finish(engine, [RUN])


async def tool_crash(duplicate: bool) -> Result:
    @tool
    def broken(x: int) -> int:
        """Always raises."""
        raise ValueError(f"cannot handle {x}")

    registry = ToolRegistry([broken])
    async with make_engine(call_once_then_report("broken", x=7), registry, duplicate=duplicate) as engine:
        await engine.start(ToolLoop(registry), {"task": "try"}, run_id=RUN)
        return await finish(engine, [RUN])


async def pool(duplicate: bool) -> Result:
    seen = {"now": 0, "max": 0, "calls": 0}

    @tool(pool="db")
    async def query(i: int) -> int:
        """A query that records how many run at once."""
        seen["calls"] += 1
        seen["now"] += 1
        seen["max"] = max(seen["max"], seen["now"])
        await asyncio.sleep(0.005 * (i + 1))
        seen["now"] -= 1
        return i

    registry = ToolRegistry([query])
    async with make_engine(registry=registry, pools={"db": 2}, duplicate=duplicate) as engine:
        await engine.start(algos.FanOut(tool="query", n=10), {}, run_id=RUN)
        return await finish(engine, [RUN], seen)


async def late_model_result(duplicate: bool) -> Result:
    called = asyncio.Event()

    async def model(request):
        called.set()
        await asyncio.sleep(0.2)
        return text("an answer nobody waits for")

    async with make_engine(model, ToolRegistry([add]), duplicate=duplicate) as engine:
        run = await engine.start(ToolLoop(ToolRegistry([add])), {"task": "think"}, run_id=RUN)
        await asyncio.wait_for(called.wait(), 5)
        await run.cancel("no time")
        return await finish(engine, [RUN])


CHILD = {"algorithm": "aaa.algos.ToolLoop", "config": ToolLoop(ToolRegistry([add])).config()}


async def child_run(duplicate: bool) -> Result:
    async with make_engine(add_then_answer, ToolRegistry([add]), duplicate=duplicate) as engine:
        await engine.start(algos.Parent(child=CHILD), {"task": "add"}, run_id=RUN)
        outcome = await engine.run(RUN).result(timeout=10)
        await engine.drain(10)
        meta = await engine.meta(RUN)
        (child,) = {e.data["child"] for e in await engine.store.read(RUN) if e.type == "aaa.child.requested"}
        log = await engine.store.read(RUN) + await engine.store.read(child)
        return Result(outcome, log, {"child": child, "open": dict(meta.children)}, engine)


async def cascade_cancel(duplicate: bool) -> Result:
    seen: dict = {}
    registry = ToolRegistry([slow_tool(seen)])
    child = {"algorithm": "aaa.algos.ToolLoop", "config": ToolLoop(registry).config()}
    async with make_engine(call_once_then_report("slow"), registry, duplicate=duplicate) as engine:
        run = await engine.start(algos.Parent(child=child), {"task": "slow child"}, run_id=RUN)
        await asyncio.wait_for(seen["started"].wait(), 5)
        await run.cancel("stop everything")
        outcome = await run.result(timeout=10)
        (child_id,) = {e.data["child"] for e in await engine.store.read(RUN) if e.type == "aaa.child.requested"}
        await engine.run(child_id).result(timeout=10)
        await engine.drain(10)
        log = await engine.store.read(RUN) + await engine.store.read(child_id)
        seen["child_outcome"] = await engine.outcome(child_id)
        return Result(outcome, log, seen, engine)


Scenario = Callable[[bool], Awaitable[Result]]

STARTED = ["aaa.run.started", "aaa.input.validated"]
#: a model call: its request, its attempt (on the log before it is sent), its result
LLM = ["aaa.llm.requested", "aaa.llm.attempted", "aaa.llm.completed"]
TOOL_OK = ["aaa.tool.requested", "aaa.tool.completed"]
DONE = ["aaa.run.completed"]

#: scenario -> (its function, the outcome, the event types of its log in order)
EXPECTED: dict[str, tuple[Scenario, str, list[str]]] = {
    "success": (success, "success", STARTED + LLM + TOOL_OK + LLM + DONE),
    "no_solution": (no_solution, "no_solution", STARTED + LLM + TOOL_OK + LLM + DONE),
    # the run's end records the tool call it cut off; nothing follows the end
    "timeout": (timeout, "timeout", STARTED + LLM + ["aaa.tool.requested", "aaa.tool.failed"] + DONE),
    "budget_tokens": (budget_tokens, "budget_exceeded", STARTED + LLM + TOOL_OK + LLM + DONE),
    "budget_cost": (budget_cost, "budget_exceeded", STARTED + LLM + DONE),
    # the request over a call budget is refused: never recorded
    "budget_model_calls": (budget_model_calls, "budget_exceeded", STARTED + LLM + TOOL_OK + DONE),
    "budget_tool_calls": (budget_tool_calls, "budget_exceeded", STARTED + LLM + TOOL_OK + LLM + DONE),
    "invalid_input": (invalid_input, "invalid_input", ["aaa.run.started", "aaa.input.rejected"] + DONE),
    "cancelled": (
        cancelled,
        "cancelled",
        STARTED + LLM + ["aaa.tool.requested", "aaa.cancel.requested", "aaa.tool.failed"] + DONE,
    ),
    "failed": (failed, "failed", STARTED + DONE),
    "failed_model": (
        failed_model,
        "failed",
        STARTED + ["aaa.llm.requested", "aaa.llm.attempted", "aaa.llm.failed"] + DONE,
    ),
    "approval_granted": (
        approval_granted,
        "success",
        STARTED
        + LLM
        + ["aaa.tool.requested", "aaa.approval.requested", "aaa.approval.granted", "aaa.tool.completed"]
        + LLM
        + DONE,
    ),
    "approval_denied": (
        approval_denied,
        "success",
        STARTED
        + LLM
        + ["aaa.tool.requested", "aaa.approval.requested", "aaa.approval.denied", "aaa.tool.failed"]
        + LLM
        + DONE,
    ),
    "approval_expired": (
        approval_expired,
        "success",
        STARTED
        + LLM
        + ["aaa.tool.requested", "aaa.approval.requested", "aaa.approval.expired", "aaa.tool.failed"]
        + LLM
        + DONE,
    ),
    "tool_timeout": (tool_timeout, "success", STARTED + LLM + ["aaa.tool.requested", "aaa.tool.failed"] + LLM + DONE),
    "tool_crash": (tool_crash, "success", STARTED + LLM + ["aaa.tool.requested", "aaa.tool.failed"] + LLM + DONE),
    "pool": (pool, "success", STARTED + ["aaa.tool.requested"] * 10 + ["aaa.tool.completed"] * 10 + DONE),
    "late_model_result": (
        late_model_result,
        "cancelled",
        STARTED + ["aaa.llm.requested", "aaa.llm.attempted", "aaa.cancel.requested", "aaa.llm.failed"] + DONE,
    ),
    "child_run": (
        child_run,
        "success",
        STARTED + ["aaa.child.requested", "aaa.child.completed"] + DONE + STARTED + LLM + TOOL_OK + LLM + DONE,
    ),
    "cascade_cancel": (
        cascade_cancel,
        "cancelled",
        STARTED
        + ["aaa.child.requested", "aaa.cancel.requested"]
        + DONE
        + STARTED
        + LLM
        + ["aaa.tool.requested", "aaa.cancel.requested", "aaa.tool.failed"]
        + DONE,
    ),
}
