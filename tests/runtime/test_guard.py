"""The tool execution guard: intent before a side effect, an idempotency key, and a
defined result after a crash between the side effect and its result event."""

from __future__ import annotations

import asyncio

import pytest

from aaa_django.algos import ToolLoop
from aaa_django.events import InMemoryEventStore
from aaa_django.tools import ToolRegistry, tool

from .helpers import CrashingStore, arun, make_engine, of_type, types
from .scenarios import call_once_then_report

RUN = "run-guard"


def charge_tool(idempotent: bool, calls: list):
    @tool(side_effects=True, idempotent=idempotent)
    def charge(amount: int, idempotency_key: str) -> str:
        """Charges a card (a side effect).

        Args:
            amount: cents to charge
        """
        calls.append(idempotency_key)
        return f"charged {amount}"

    return charge


def test_key_parameter_is_not_in_the_schema():
    spec = charge_tool(False, []).spec()
    assert list(spec["parameters"]["properties"]) == ["amount"]
    assert spec["parameters"]["properties"]["amount"]["description"] == "cents to charge"


def test_intent_is_recorded_before_the_call_and_the_key_is_passed():
    calls: list = []

    async def scenario():
        registry = ToolRegistry([charge_tool(False, calls)])
        async with make_engine(call_once_then_report("charge", amount=5), registry) as engine:
            run = await engine.start(ToolLoop(registry), {"task": "pay"}, run_id=RUN)
            assert (await run.result(timeout=10)).ok
            await engine.drain(5)
            return await engine.store.read(RUN)

    log = arun(scenario())
    t = types(log)
    assert t.index("aaa.tool.started") < t.index("aaa.tool.completed")
    (intent,) = of_type(log, "aaa.tool.started")
    assert calls == [intent.data["idempotency_key"]]


async def crash_after_side_effect(idempotent: bool, calls: list):
    """The tool runs, then the process dies before its result is written."""
    store = InMemoryEventStore()
    registry = ToolRegistry([charge_tool(idempotent, calls)])
    model = call_once_then_report("charge", amount=5)
    # started, validated, llm.requested, llm.attempted, llm.completed, tool.requested, tool.started
    crashing = CrashingStore(store, limit=7)
    first = make_engine(model, registry, store=crashing)
    await first.start(ToolLoop(registry), {"task": "pay"}, run_id=RUN)
    await asyncio.wait_for(crashing.crashed.wait(), 5)
    await first.close(drain=False)
    assert types(await store.read(RUN))[-1] == "aaa.tool.started"
    async with make_engine(model, registry, store=store) as second:
        await second.resume()
        outcome = await second.run(RUN).result(timeout=10)
        await second.drain(5)
    return outcome, await store.read(RUN)


def test_not_idempotent_after_crash_fails_as_uncertain_never_runs_twice():
    calls: list = []
    outcome, log = arun(crash_after_side_effect(False, calls))
    assert len(calls) == 1  # the side effect happened once, before the crash
    (failed,) = of_type(log, "aaa.tool.failed")
    assert failed.data["reason"] == "uncertain"
    assert outcome.ok and "uncertain" in outcome.value["text"]


def test_idempotent_after_crash_runs_again_with_the_same_key():
    calls: list = []
    outcome, log = arun(crash_after_side_effect(True, calls))
    assert len(calls) == 2 and calls[0] == calls[1]
    (intent,) = of_type(log, "aaa.tool.started")
    assert calls[0] == intent.data["idempotency_key"]
    assert of_type(log, "aaa.tool.completed") and not of_type(log, "aaa.tool.failed")


@pytest.mark.parametrize("duplicate", [False, True], ids=["once", "twice"])
def test_side_effect_runs_once_under_double_delivery(duplicate):
    calls: list = []

    async def scenario():
        registry = ToolRegistry([charge_tool(False, calls)])
        async with make_engine(call_once_then_report("charge", amount=5), registry,
                               duplicate=duplicate) as engine:
            run = await engine.start(ToolLoop(registry), {"task": "pay"}, run_id=RUN)
            return await run.result(timeout=10)

    assert arun(scenario()).ok
    assert len(calls) == 1
