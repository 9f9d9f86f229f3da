"""The tool execution guard: intent before a side effect, an idempotency key, and a
defined result after a crash between the side effect and its result event."""

from __future__ import annotations

import asyncio

import pytest

from aaa_django.algos import ToolLoop
from aaa_django.events import Event, InMemoryEventStore
from aaa_django.runtime.event_types import decision_id
from aaa_django.tools import ToolHandler, ToolRegistry, reconcile, tool

from .helpers import CrashingStore, arun, make_engine, of_type, types, until
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


async def died_after_side_effect(registry: ToolRegistry, model) -> InMemoryEventStore:
    """The store of run RUN, whose process died once its tool ran, before the tool's
    result was written."""
    store = InMemoryEventStore()
    # started, validated, llm.requested, llm.attempted, llm.completed, tool.requested, tool.started
    crashing = CrashingStore(store, limit=7)
    first = make_engine(model, registry, store=crashing)
    await first.start(ToolLoop(registry), {"task": "pay"}, run_id=RUN)
    await asyncio.wait_for(crashing.crashed.wait(), 5)
    await first.close(drain=False)
    assert types(await store.read(RUN))[-1] == "aaa.tool.started"
    return store


async def crash_after_side_effect(idempotent: bool, calls: list, *, answer=None, uncertain: str = "reconcile"):
    """The tool runs, then the process dies before its result is written; another
    engine adopts the run. ``answer(engine, gate)``: what a person says then (the run
    waits for it)."""
    registry = ToolRegistry([charge_tool(idempotent, calls)])
    model = call_once_then_report("charge", amount=5)
    store = await died_after_side_effect(registry, model)
    second = make_engine(model, None, store=store)
    ToolHandler(registry, uncertain=uncertain).attach(second)
    async with second:
        await second.resume()
        if answer is not None:
            gate = await until_gate(second)
            await asyncio.sleep(0.3)
            assert await second.outcome(RUN) is None  # waiting for the person
            await answer(second, gate)
        outcome = await second.run(RUN).result(timeout=10)
        await second.drain(5)
    return outcome, await store.read(RUN)


async def until_gate(engine) -> Event:
    async def found() -> bool:
        return bool(of_type(await engine.store.read(RUN), "aaa.approval.requested"))

    await until(found)
    (gate,) = of_type(await engine.store.read(RUN), "aaa.approval.requested")
    return gate


def test_not_idempotent_after_crash_is_never_run_twice_and_the_run_waits_for_a_person():
    """Found uncertain: a gate a person answers (here "it did not run": the model is
    told so, and ends the run on it), never a second execution, never a success on
    the uncertain call itself."""
    calls: list = []

    async def did_not_run(engine, gate):
        assert gate.data["reconcile"]["choices"] == ["ran", "not_run", "run_again"]
        assert gate.data["name"] == "charge" and gate.id == reconcile.gate_id(gate.data["tool_request_id"])
        assert await engine.deny(RUN, gate.id, by="ops", reason="no charge on the card")

    outcome, log = arun(crash_after_side_effect(False, calls, answer=did_not_run))
    assert len(calls) == 1  # the side effect happened once, before the crash
    (failed,) = of_type(log, "aaa.tool.failed")
    assert failed.data["reason"] == "not_run" and "ops" in failed.data["error"]
    assert of_type(log, "aaa.approval.denied")[0].seq < failed.seq
    assert outcome.ok and "did not run" in outcome.value["text"]


def test_a_decision_delivered_while_the_call_is_driven_again_is_acted_on_after():
    """A person answers the gate while a delivery of the call, driven again (a worker's
    re-drive), is in flight here, having read the log before the decision: the
    decision's own delivery does not drop it, it is acted on once that delivery ends
    (the run does not wait for a person who has answered)."""
    calls: list = []
    registry = ToolRegistry([charge_tool(False, calls)])
    model = call_once_then_report("charge", amount=5)

    async def scenario():
        store = await died_after_side_effect(registry, model)
        second = make_engine(model, None, store=store)
        handler = ToolHandler(registry).attach(second)
        async with second:
            await second.resume()
            gate = await until_gate(second)
            await second.drain(5)
            (request,) = of_type(await store.read(RUN), "aaa.tool.requested")
            read, release = asyncio.Event(), asyncio.Event()
            find_after = second.find_after

            async def reads_then_waits(event, ids, **kwargs):
                found = await find_after(event, ids, **kwargs)
                if not release.is_set():
                    read.set()
                    await release.wait()
                return found

            second.find_after = reads_then_waits
            driving = asyncio.ensure_future(handler.on_request(await second.hydrate(request)))
            await read.wait()  # the re-drive has read the log: the gate, no decision
            assert await second.deny(RUN, gate.id, by="ops", reason="no charge on the card")
            await second.drain(5)  # (the decision's delivery: while the re-drive is in flight)
            release.set()
            await driving
            outcome = await second.run(RUN).result(timeout=10)
            await second.drain(5)
        return outcome, await store.read(RUN)

    outcome, log = arun(scenario())
    assert len(calls) == 1
    (failed,) = of_type(log, "aaa.tool.failed")
    assert failed.data["reason"] == "not_run" and "ops" in failed.data["error"]
    assert outcome.ok and "did not run" in outcome.value["text"]


def test_a_call_driven_again_after_its_gate_was_decided_acts_on_the_decision():
    """The decision is on the log and its delivery was lost (its process died): a
    delivery of the call itself (a re-drive) finds the decided gate and acts on it."""
    calls: list = []
    registry = ToolRegistry([charge_tool(False, calls)])
    model = call_once_then_report("charge", amount=5)

    async def scenario():
        store = await died_after_side_effect(registry, model)
        async with make_engine(model, registry, store=store) as second:
            await second.resume()
            gate = await until_gate(second)
            await second.drain(5)
        denied = Event(
            id=decision_id(gate.id),
            stream=RUN,
            type="aaa.approval.denied",
            data={**{k: gate.data[k] for k in ("tool_request_id", "tool_request_seq", "call_id", "name")}, "by": "ops"},
            causation=gate.id,
        )
        assert await store.append([denied])  # (on the log; its delivery never ran)
        third = make_engine(model, None, store=store)
        handler = ToolHandler(registry).attach(third)
        async with third:
            (request,) = of_type(await store.read(RUN), "aaa.tool.requested")
            await handler.on_request(await third.hydrate(request))
            await third.drain(5)
        return await store.read(RUN)

    log = arun(scenario())
    assert len(calls) == 1
    (failed,) = of_type(log, "aaa.tool.failed")
    assert failed.data["reason"] == "not_run" and "ops" in failed.data["error"]


def test_an_uncertain_call_a_person_says_ran_is_recorded_with_what_they_give():
    calls: list = []

    async def ran(engine, gate):
        assert await reconcile.reconcile(engine, RUN, gate.id, "ran", by="ops", result="charged 5 (seen)")

    outcome, log = arun(crash_after_side_effect(False, calls, answer=ran))
    assert len(calls) == 1
    (completed,) = of_type(log, "aaa.tool.completed")
    assert completed.data["result"] == "charged 5 (seen)"
    assert completed.data["reconciled"] == {"verdict": "ran", "by": "ops", "evidence": None}
    assert outcome.ok and "charged 5 (seen)" in outcome.value["text"]


def test_an_uncertain_call_a_person_runs_again_runs_once_more_with_the_same_key():
    calls: list = []

    async def again(engine, gate):
        assert await engine.approve(RUN, gate.id, by="ops")

    outcome, log = arun(crash_after_side_effect(False, calls, answer=again))
    assert len(calls) == 2 and calls[0] == calls[1]  # the key: the payment provider's dedup
    intents = of_type(log, "aaa.tool.started")
    assert len(intents) == 2 and intents[1].data["again"] == of_type(log, "aaa.approval.granted")[0].id
    assert of_type(log, "aaa.tool.completed")[0].data["result"] == "charged 5"
    assert outcome.ok


def test_a_site_that_fails_uncertain_calls_ends_the_run_failed_naming_the_call():
    calls: list = []
    outcome, log = arun(crash_after_side_effect(False, calls, uncertain="fail"))
    assert len(calls) == 1
    (failed,) = of_type(log, "aaa.tool.failed")
    assert failed.data["reason"] == "uncertain"
    assert outcome.outcome == "failed" and outcome.value["reason"] == "uncertain_tool_call"
    assert outcome.value["tool_request_id"] == failed.causation
    assert types(log)[-2:] == ["aaa.tool.failed", "aaa.run.completed"]


def test_the_late_outcome_of_a_call_found_uncertain_is_its_own_event_the_evidence_of_ran():
    """One engine's guarded call is still running when another engine adopts the run
    (its first holder is cut off, not dead): the adopter finds it uncertain and asks
    a person; the call then returns where it ran. Its outcome is recorded as
    ``aaa.tool.returned`` (not as the call's result), and "it ran" takes its result."""
    release = asyncio.Event()
    ran: list = []

    @tool(side_effects=True)
    async def charge(amount: int, idempotency_key: str) -> str:
        """Charges a card, slowly."""
        ran.append(idempotency_key)
        await release.wait()
        return f"charged {amount} at the bank"

    async def scenario():
        store = InMemoryEventStore()
        registry = ToolRegistry([charge])
        model = call_once_then_report("charge", amount=7)
        first = make_engine(model, registry, store=store)
        second = make_engine(model, registry, store=store)
        async with first, second:
            await first.start(ToolLoop(registry), {"task": "pay"}, run_id=RUN)
            await until(lambda: _async(bool(ran)))
            await second.resume([RUN])  # the adopter: the call may have run
            gate = await until_gate(second)
            release.set()  # the cut-off call returns where it ran
            await until(lambda: _has(store, "aaa.tool.returned"))
            await asyncio.sleep(0.3)
            waiting = await second.outcome(RUN)
            assert await reconcile.reconcile(second, RUN, gate.id, "ran", by="ops")
            outcome = await second.run(RUN).result(timeout=10)
            await first.drain(5)
            await second.drain(5)
        return waiting, outcome, await store.read(RUN)

    waiting, outcome, log = arun(scenario())
    assert waiting is None and len(ran) == 1
    (late,) = of_type(log, "aaa.tool.returned")
    assert late.data["result"] == "charged 7 at the bank" and late.id == reconcile.returned_id(late.causation)
    (completed,) = of_type(log, "aaa.tool.completed")
    assert completed.data["result"] == "charged 7 at the bank"
    assert completed.data["reconciled"]["evidence"] == late.id
    assert outcome.ok and "charged 7 at the bank" in outcome.value["text"]


async def _async(value: bool) -> bool:
    return value


async def _has(store, type: str) -> bool:
    return bool(of_type(await store.read(RUN), type))


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
        async with make_engine(call_once_then_report("charge", amount=5), registry, duplicate=duplicate) as engine:
            run = await engine.start(ToolLoop(registry), {"task": "pay"}, run_id=RUN)
            return await run.result(timeout=10)

    assert arun(scenario()).ok
    assert len(calls) == 1


def test_every_caller_of_a_kept_spec_gets_its_own_copy():
    t = charge_tool(False, [])
    first = t.spec()
    first["parameters"]["properties"].clear()  # a caller that changes what it got
    second = t.spec()
    assert list(second["parameters"]["properties"]) == ["amount"]
    assert second["parameters"] is not t.spec()["parameters"]
    t.description = "charges a card"  # (a site may set it after the decorator)
    assert t.spec()["description"] == "charges a card"
