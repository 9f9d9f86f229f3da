"""The engine's scenarios, written once, run on either bus (see ``harness.py``).

Each scenario starts a run of the tools and models in ``site.py``, acts on it as a
person or another process would (cancel, approve, deny), and returns the outcome, the
log and what the tools observed. ``SCENARIOS`` says what each must produce: its
outcome, the event types of its log in order, and a check of the details.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any, Awaitable, Callable

from aaa_django.data import is_claimed
from aaa_django.runtime import Budget
from aaa_django.runtime.event_types import (
    APPROVAL_DENIED,
    APPROVAL_EXPIRED,
    APPROVAL_GRANTED,
    APPROVAL_REQUESTED,
    CANCEL_REQUESTED,
    CHILD_COMPLETED,
    CHILD_REQUESTED,
    INPUT_REJECTED,
    INPUT_VALIDATED,
    LLM_ATTEMPTED,
    LLM_COMPLETED,
    LLM_FAILED,
    LLM_REQUESTED,
    RUN_COMPLETED,
    RUN_STARTED,
    TOOL_COMPLETED,
    TOOL_FAILED,
    TOOL_REQUESTED,
)

from . import site
from .harness import Harness, Result

# -- the seven outcomes -------------------------------------------------------------------


async def success(h: Harness) -> Result:
    run_id = h.run_id()
    async with h.engine() as engine:
        await engine.start(site.loop("add_then_answer"), {"task": "add 1 and 2"}, run_id=run_id)
        return await h.finish(engine, [run_id])


async def no_solution(h: Harness) -> Result:
    run_id = h.run_id()
    async with h.engine() as engine:
        await engine.start(site.loop("always_add", max_turns=2), {"task": "loop"}, run_id=run_id)
        return await h.finish(engine, [run_id])


async def timeout(h: Harness) -> Result:
    """The deadline passes while a slow tool runs: the run ends ``timeout``, its end
    records the call it cut off, and the tool call is cancelled (its own result is not
    recorded: nothing follows a run's end)."""
    run_id = h.run_id()
    async with h.engine() as engine:
        await engine.start(site.loop("once:lingering"), {"task": "be slow"}, deadline=2.5, run_id=run_id)
        result = await h.finish(engine, [run_id])
    result.seen["cancelled"] = h.probe.get(f"{run_id}:slow:cancelled")
    return result


def _budget(budget: Budget, model: str, task: str):
    async def scenario(h: Harness) -> Result:
        run_id = h.run_id()
        async with h.engine() as engine:
            await engine.start(site.loop(model), {"task": task}, budget=budget, run_id=run_id)
            result = await h.finish(engine, [run_id])
        result.seen.update(tool=h.probe.count(f"{run_id}:add"), model=h.probe.count(f"{run_id}:model:calls"))
        return result

    return scenario


# Token counts are exact (four characters a token, run ids of one length): the first
# call (10 tokens) is within 15, the second (13 more) is not.
budget_tokens = _budget(Budget(tokens=15), "add_then_answer", "add 1 and 2")
budget_cost = _budget(Budget(cost=0.00002), "add_then_answer", "x" * 100)
budget_model_calls = _budget(Budget(model_calls=3), "always_add", "add forever")
budget_tool_calls = _budget(Budget(tool_calls=3), "always_add", "add forever")


async def invalid_input(h: Harness) -> Result:
    run_id = h.run_id()
    async with h.engine() as engine:
        await engine.start(site.loop("add_then_answer"), {"job": "no task here"}, run_id=run_id)
        return await h.finish(engine, [run_id])


async def cancelled(h: Harness) -> Result:
    """Cancelled while a slow tool runs (in another process, on the Celery bus)."""
    run_id = h.run_id()
    async with h.engine() as engine:
        run = await engine.start(site.loop("once:lingering"), {"task": "be slow"}, run_id=run_id)
        await h.until(lambda: h.probe.get(f"{run_id}:slow:started"))
        await run.cancel("changed my mind", by="tester")
        result = await h.finish(engine, [run_id])
    result.seen["cancelled"] = h.probe.get(f"{run_id}:slow:cancelled")
    return result


async def failed(h: Harness) -> Result:
    run_id = h.run_id()
    async with h.engine() as engine:
        await engine.start("tests.boom", {}, run_id=run_id)
        return await h.finish(engine, [run_id])


async def failed_model(h: Harness) -> Result:
    run_id = h.run_id()
    async with h.engine() as engine:
        await engine.start(site.loop("provider_down"), {"task": "anything"}, run_id=run_id)
        return await h.finish(engine, [run_id])


# -- limits ---------------------------------------------------------------------------------


def _approval(decide: str):
    async def scenario(h: Harness) -> Result:
        run_id = h.run_id()
        tool = "deploy_soon" if decide == "expire" else "deploy"
        seen: dict[str, Any] = {}
        async with h.engine() as engine:
            run = await engine.start(site.loop(f'once:{tool}:{{"env": "prod"}}'), {"task": "ship it"}, run_id=run_id)
            if decide != "expire":

                async def pending() -> bool:
                    return bool((await run.meta()).approvals)

                await h.until(pending)
                (request_id,) = (await run.meta()).approvals
                seen["request_id"] = request_id
                if decide == "grant":
                    seen["decided"] = await engine.approve(run_id, request_id, by="alice")
                else:
                    seen["decided"] = await engine.deny(run_id, request_id, by="bob", reason="not today")
            result = await h.finish(engine, [run_id], seen)
        result.seen["deployed"] = h.probe.count(f"{run_id}:deployed")
        return result

    return scenario


approval_granted = _approval("grant")
approval_denied = _approval("deny")
approval_expired = _approval("expire")


async def tool_timeout(h: Harness) -> Result:
    run_id = h.run_id()
    async with h.engine() as engine:
        await engine.start(site.loop("once:sluggish"), {"task": "try"}, run_id=run_id)
        return await h.finish(engine, [run_id])


async def tool_crash(h: Harness) -> Result:
    run_id = h.run_id()
    async with h.engine() as engine:
        await engine.start(site.loop('once:broken:{"x": 7}'), {"task": "try"}, run_id=run_id)
        return await h.finish(engine, [run_id])


async def pool(h: Harness) -> Result:
    """Ten calls at once of a tool in a pool of two: never more than two run (on the
    Celery bus: in any of the workers' processes together)."""
    run_id = h.run_id()
    async with h.engine() as engine:
        await engine.start(site.FanOut(tool="query", n=10), {}, run_id=run_id)
        result = await h.finish(engine, [run_id])
    result.seen.update(max=h.probe.count(f"{run_id}:query:max"), calls=h.probe.count(f"{run_id}:query:calls"))
    return result


async def late_model_result(h: Harness) -> Result:
    run_id = h.run_id()
    async with h.engine() as engine:
        run = await engine.start(site.loop("thinks_for_a_second"), {"task": "think"}, run_id=run_id)
        await h.until(lambda: h.probe.get(f"{run_id}:model:called"))
        await run.cancel("no time")
        # after the end: the call answers, or is cancelled where the run's end is delivered
        await h.until(lambda: h.probe.get(f"{run_id}:model:answered") or h.probe.get(f"{run_id}:model:cancelled"))
        return await h.finish(engine, [run_id])


CHILD = {"algorithm": "aaa.algos.ToolLoop", "config": site.loop("add_then_answer").config()}


async def child_run(h: Harness) -> Result:
    run_id = h.run_id()
    async with h.engine() as engine:
        await engine.start(_parent(CHILD), {"task": "add"}, run_id=run_id)
        outcome = await engine.run(run_id).result(timeout=h.patience)
        (child,) = {e.data["child"] for e in await engine.store.read(run_id) if e.type == CHILD_REQUESTED}
        result = await h.finish(engine, [run_id, child])
        result.outcome = outcome
        result.seen.update(child=child, open=dict((await engine.meta(run_id)).children))
        return result


async def cascade_cancel(h: Harness) -> Result:
    run_id = h.run_id()
    child_config = {"algorithm": "aaa.algos.ToolLoop", "config": site.loop("once:lingering").config()}
    async with h.engine() as engine:
        run = await engine.start(_parent(child_config), {"task": "slow child"}, run_id=run_id)

        async def child_started() -> str | None:
            found = [e.data["child"] for e in await engine.store.read(run_id) if e.type == CHILD_REQUESTED]
            return found and h.probe.get(f"{found[0]}:slow:started")

        await h.until(child_started)
        await run.cancel("stop everything")
        (child,) = {e.data["child"] for e in await engine.store.read(run_id) if e.type == CHILD_REQUESTED}
        result = await h.finish(engine, [run_id, child])
        result.seen["child_outcome"] = await engine.run(child).result(timeout=h.patience)
        return result


def _large_input(size: int):
    """A run whose input is ``size`` bytes of JSON, with an owner, a budget and a
    deadline: over the claim threshold, the start keeps all of them (only the input
    moves to the blob), and the model sees the whole input."""

    async def scenario(h: Harness) -> Result:
        run_id = h.run_id()
        task = "x" * (size - len('{"task":""}'))
        async with h.engine() as engine:
            await engine.start(
                site.loop("echo_size"),
                {"task": task},
                run_id=run_id,
                owner="42",
                budget={"model_calls": 3},
                deadline=h.patience * 3,
            )
            result = await h.finish(engine, [run_id])
            result.seen.update(
                size=len(task), meta=await engine.meta(run_id), hydrated=await engine.hydrate(result.log[0])
            )
        return result

    return scenario


def check_large_input(r: Result) -> None:
    assert r.outcome.value == {"text": f"{r.seen['size']} chars"}
    started, meta = r.log[0], r.seen["meta"]
    assert is_claimed(started.data)  # the start is over 16 KiB
    assert "input" not in started.data and started.blobs
    assert started.data["algorithm"] == "aaa.algos.ToolLoop" and started.data["owner"] == "42"
    assert started.data["budget"] == {"model_calls": 3} and started.data["deadline"] is not None
    assert r.seen["hydrated"].data["input"] == {"task": "x" * r.seen["size"]}
    assert (meta.algorithm, meta.owner, meta.budget.model_calls) == ("aaa.algos.ToolLoop", "42", 3)


def _parent(child: dict):
    from tests.runtime.algos import Parent

    return Parent(child=child)


# -- crash and resume ------------------------------------------------------------------------

RESUME_TURNS = 4


async def crash_resume(h: Harness, cut: int) -> tuple[Result, Result, list[str]]:
    """A run whose process died after ``cut`` appended events: ``engine.resume``
    finishes it exactly as an uninterrupted run, but for a model attempt the cut left
    without its result (recorded abandoned, and made again).

    The reference run goes to the end first; then its log is erased and its first
    ``cut`` events are written to a new run's stream (same ids: every later id derives
    from them), as a crashed process would have left them, and the run is resumed.
    """
    reference_id, resumed_id = h.run_id(), h.run_id()
    async with h.engine() as engine:
        await engine.start(site.loop(f"turns:{RESUME_TURNS}"), {"task": "four turns"}, run_id=reference_id)
        reference = await h.finish(engine, [reference_id])
        await engine.erase(reference_id)
        await engine.store.append([replace(e, stream=resumed_id, seq=None) for e in reference.log[:cut]])
        adopted = await engine.resume([resumed_id])
        resumed = await h.finish(engine, [resumed_id])
    return reference, resumed, adopted


# -- what each must produce ----------------------------------------------------------------

STARTED = [RUN_STARTED, INPUT_VALIDATED]
#: a model call: its request, its attempt (on the log before it is sent), its result
LLM = [LLM_REQUESTED, LLM_ATTEMPTED, LLM_COMPLETED]
TOOL_OK = [TOOL_REQUESTED, TOOL_COMPLETED]
DONE = [RUN_COMPLETED]
RESUME_LOG = STARTED + (LLM + TOOL_OK) * (RESUME_TURNS - 1) + LLM + DONE


def of_type(log, type: str):
    return [e for e in log if e.type == type]


def _no_check(r: Result) -> None:
    pass


def check_success(r: Result) -> None:
    assert r.outcome.value == {"text": "1 + 2 = 3"}
    (done,) = of_type(r.log, TOOL_COMPLETED)
    assert done.data["name"] == "add" and done.data["result"] == 3


def check_no_solution(r: Result) -> None:
    assert r.outcome.value == {"reason": "max_turns", "turns": 2}


def check_timeout(r: Result) -> None:
    assert [e.type for e in r.log[-2:]] == [TOOL_FAILED, RUN_COMPLETED]  # the call cut off, then the end
    assert (r.log[-2].data["reason"], r.log[-2].data["cut_off"]) == ("timeout", True)
    assert "deadline" in r.outcome.value
    assert r.seen["cancelled"]  # the tool itself saw the cancellation


def _check_budget(dimension: str):
    def check(r: Result) -> None:
        assert r.outcome.value["dimension"] == dimension
        if dimension in ("model_calls", "tool_calls"):
            # a budget of 3 calls: 3 made, the 4th refused (never recorded, never sent)
            assert r.outcome.value == {"dimension": dimension, "limit": 3, "spent": 3}
        else:
            assert r.outcome.value["spent"] > r.outcome.value["limit"]
        if dimension == "model_calls":
            assert r.seen["model"] == 3  # the request over budget was never sent
        if dimension == "tool_calls":
            assert r.seen["tool"] == 3  # the call over budget never ran

    return check


def check_invalid_input(r: Result) -> None:
    (rejected,) = of_type(r.log, INPUT_REJECTED)
    assert ("job",) in {tuple(e["loc"]) for e in rejected.data["errors"]}
    assert r.outcome.value["errors"] == rejected.data["errors"]


def check_cancelled(r: Result) -> None:
    assert r.outcome.value == {"reason": "changed my mind", "by": "tester"}
    assert [e.type for e in r.log[-2:]] == [TOOL_FAILED, RUN_COMPLETED]  # the call cut off, then the end
    assert (r.log[-2].data["reason"], r.log[-2].data["cut_off"]) == ("cancelled", True)
    assert r.seen["cancelled"]


def check_failed(r: Result) -> None:
    assert r.outcome.value["error"] == "RuntimeError: the algorithm blew up"
    assert "Traceback" in r.outcome.value["traceback"]


def check_failed_model(r: Result) -> None:
    (failed,) = of_type(r.log, LLM_FAILED)
    assert "ConnectionError: the provider is down" in failed.data["error"]


def check_granted(r: Result) -> None:
    assert r.seen["decided"] is True and r.seen["deployed"] == 1
    (granted,) = of_type(r.log, APPROVAL_GRANTED)
    assert granted.data["by"] == "alice" and granted.data["request_id"] == r.seen["request_id"]
    assert r.outcome.value == {"text": "tool said: deployed to prod"}


def check_denied(r: Result) -> None:
    assert r.seen["decided"] is True and r.seen["deployed"] == 0
    (failed,) = of_type(r.log, TOOL_FAILED)
    assert failed.data["reason"] == "denied" and "not today" in failed.data["error"]


def check_expired(r: Result) -> None:
    assert r.seen["deployed"] == 0
    (failed,) = of_type(r.log, TOOL_FAILED)
    assert failed.data["reason"] == "expired"


def check_tool_timeout(r: Result) -> None:
    (failed,) = of_type(r.log, TOOL_FAILED)
    assert failed.data["reason"] == "timeout"
    assert r.outcome.value["text"].startswith("tool said: error (timeout)")


def check_tool_crash(r: Result) -> None:
    (failed,) = of_type(r.log, TOOL_FAILED)
    assert failed.data["reason"] == "error" and failed.data["error"] == "ValueError: cannot handle 7"


def check_pool(r: Result) -> None:
    assert r.seen["max"] == 2, r.seen  # two at once, never more
    assert r.seen["calls"] == 10
    assert r.outcome.value == {"ok": 10}


def check_child(r: Result) -> None:
    assert r.outcome.value == {"child": {"text": "1 + 2 = 3"}}
    assert r.seen["open"] == {}


def check_cascade(r: Result) -> None:
    assert r.seen["child_outcome"].outcome == "cancelled"
    # the parent ended first: no notice of its child's end follows its own
    assert of_type(r.log, CHILD_COMPLETED) == []


Scenario = Callable[[Harness], Awaitable[Result]]

#: name -> (scenario, outcome, event types of its log in order, check)
SCENARIOS: dict[str, tuple[Scenario, str, list[str], Callable[[Result], None]]] = {
    "success": (success, "success", STARTED + LLM + TOOL_OK + LLM + DONE, check_success),
    "no_solution": (no_solution, "no_solution", STARTED + LLM + TOOL_OK + LLM + DONE, check_no_solution),
    # a run's end records the calls it cut off; nothing follows it (late results are refused)
    "timeout": (timeout, "timeout", STARTED + LLM + [TOOL_REQUESTED, TOOL_FAILED] + DONE, check_timeout),
    "budget_tokens": (budget_tokens, "budget_exceeded", STARTED + LLM + TOOL_OK + LLM + DONE, _check_budget("tokens")),
    "budget_cost": (budget_cost, "budget_exceeded", STARTED + LLM + DONE, _check_budget("cost")),
    "budget_model_calls": (
        budget_model_calls,
        "budget_exceeded",
        STARTED + (LLM + TOOL_OK) * 3 + DONE,
        _check_budget("model_calls"),
    ),
    "budget_tool_calls": (
        budget_tool_calls,
        "budget_exceeded",
        STARTED + (LLM + TOOL_OK) * 3 + LLM + DONE,
        _check_budget("tool_calls"),
    ),
    "invalid_input": (invalid_input, "invalid_input", [RUN_STARTED, INPUT_REJECTED] + DONE, check_invalid_input),
    "cancelled": (
        cancelled,
        "cancelled",
        STARTED + LLM + [TOOL_REQUESTED, CANCEL_REQUESTED, TOOL_FAILED] + DONE,
        check_cancelled,
    ),
    "failed": (failed, "failed", STARTED + DONE, check_failed),
    "failed_model": (
        failed_model,
        "failed",
        STARTED + [LLM_REQUESTED, LLM_ATTEMPTED, LLM_FAILED] + DONE,
        check_failed_model,
    ),
    "approval_granted": (
        approval_granted,
        "success",
        STARTED + LLM + [TOOL_REQUESTED, APPROVAL_REQUESTED, APPROVAL_GRANTED, TOOL_COMPLETED] + LLM + DONE,
        check_granted,
    ),
    "approval_denied": (
        approval_denied,
        "success",
        STARTED + LLM + [TOOL_REQUESTED, APPROVAL_REQUESTED, APPROVAL_DENIED, TOOL_FAILED] + LLM + DONE,
        check_denied,
    ),
    "approval_expired": (
        approval_expired,
        "success",
        STARTED + LLM + [TOOL_REQUESTED, APPROVAL_REQUESTED, APPROVAL_EXPIRED, TOOL_FAILED] + LLM + DONE,
        check_expired,
    ),
    "tool_timeout": (
        tool_timeout,
        "success",
        STARTED + LLM + [TOOL_REQUESTED, TOOL_FAILED] + LLM + DONE,
        check_tool_timeout,
    ),
    "tool_crash": (tool_crash, "success", STARTED + LLM + [TOOL_REQUESTED, TOOL_FAILED] + LLM + DONE, check_tool_crash),
    "pool": (pool, "success", STARTED + [TOOL_REQUESTED] * 10 + [TOOL_COMPLETED] * 10 + DONE, check_pool),
    "late_model_result": (
        late_model_result,
        "cancelled",
        STARTED + [LLM_REQUESTED, LLM_ATTEMPTED, CANCEL_REQUESTED, LLM_FAILED] + DONE,
        _no_check,
    ),
    "child_run": (
        child_run,
        "success",
        STARTED + [CHILD_REQUESTED, CHILD_COMPLETED] + DONE + STARTED + LLM + TOOL_OK + LLM + DONE,
        check_child,
    ),
    # inputs of any size (the claim threshold is 16 KiB): what routes a run stays in its start
    **{
        f"input_{size}": (_large_input(size), "success", STARTED + LLM + DONE, check_large_input)
        for size in (16_383, 16_385, 1_000_000)
    },
    "cascade_cancel": (
        cascade_cancel,
        "cancelled",
        STARTED
        + [CHILD_REQUESTED, CANCEL_REQUESTED]
        + DONE
        + STARTED
        + LLM
        + [TOOL_REQUESTED, CANCEL_REQUESTED, TOOL_FAILED]
        + DONE,
        check_cascade,
    ),
}
