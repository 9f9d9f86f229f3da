"""Each of the seven outcomes and each limit: the outcome and the events in the log."""

from __future__ import annotations

import pytest

from aaa_django.runtime import Budget
from aaa_django.runtime.event_types import result_id

from .helpers import arun, of_type, types
from .scenarios import EXPECTED, RUN, always_add, budget_scenario


@pytest.mark.parametrize("name", list(EXPECTED))
def test_scenario_outcome_and_log(name):
    scenario, outcome, expected_types = EXPECTED[name]
    result = arun(scenario(False))
    assert result.outcome.outcome == outcome, result.outcome
    assert types(result.log) == expected_types
    assert result.engine.errors == [] and result.engine.bus.errors == []
    # exactly one completion per run, whatever raced
    for stream in {e.stream for e in result.log}:
        assert len([e for e in result.log if e.stream == stream and e.type == "aaa.run.completed"]) == 1


def test_seven_outcomes_are_covered():
    assert {o for _, o, _ in EXPECTED.values()} == {
        "success",
        "no_solution",
        "timeout",
        "budget_exceeded",
        "invalid_input",
        "cancelled",
        "failed",
    }


def test_success_value_is_the_final_text():
    r = arun(EXPECTED["success"][0](False))
    assert r.outcome.ok and r.outcome.value == {"text": "1 + 2 = 3"}
    (done,) = of_type(r.log, "aaa.tool.completed")
    assert done.data == {"call_id": done.data["call_id"], "name": "add", "result": 3}


def test_no_solution_says_why():
    r = arun(EXPECTED["no_solution"][0](False))
    assert r.outcome.value == {"reason": "max_turns", "turns": 2}


def test_timeout_cancels_the_slow_tool_and_nothing_follows_the_end():
    r = arun(EXPECTED["timeout"][0](False))
    assert types(r.log)[-2:] == ["aaa.tool.failed", "aaa.run.completed"]
    (request,) = of_type(r.log, "aaa.tool.requested")
    (cut,) = of_type(r.log, "aaa.tool.failed")  # the run's end records the call it cut off
    assert cut.id == result_id(request.id) and cut.causation == request.id
    assert cut.data == {
        "call_id": request.data["call_id"],
        "name": "slow",
        "reason": "timeout",
        "cut_off": True,
        "error": "the run ended (timeout) before the tool call had a result",
    }
    assert of_type(r.log, "aaa.tool.completed") == []  # the cancelled call's own result is not recorded
    assert r.seen["started"].is_set()  # (it was running)
    assert "deadline" in r.outcome.value


@pytest.mark.parametrize(
    "name, dimension",
    [
        ("budget_tokens", "tokens"),
        ("budget_cost", "cost"),
        ("budget_model_calls", "model_calls"),
        ("budget_tool_calls", "tool_calls"),
    ],
)
def test_each_budget_dimension(name, dimension):
    r = arun(EXPECTED[name][0](False))
    assert r.outcome.outcome == "budget_exceeded"
    assert r.outcome.value["dimension"] == dimension
    if dimension in ("model_calls", "tool_calls"):
        # counted when asked: the request over budget is refused, never recorded nor sent
        assert r.outcome.value["spent"] == r.outcome.value["limit"] == 1
    else:  # known after the call: the run ends once the spend is over
        assert r.outcome.value["spent"] > r.outcome.value["limit"]
    if dimension == "model_calls":
        assert r.seen["model"] == 1  # the request over budget was never sent
    if dimension == "tool_calls":
        assert r.seen["tool"] == 1  # the call over budget never ran


@pytest.mark.parametrize("dimension", ["model_calls", "tool_calls"])
def test_a_call_budget_reports_the_calls_made_not_the_one_refused(dimension):
    """A budget of 3 calls: three are made, the fourth is refused (never recorded, never
    sent), and the run says it spent 3, as its log and its meta do."""
    r = arun(budget_scenario(Budget(**{dimension: 3}), always_add)(False))
    assert r.outcome.outcome == "budget_exceeded"
    assert r.outcome.value == {"dimension": dimension, "limit": 3, "spent": 3}
    requested = "aaa.llm.requested" if dimension == "model_calls" else "aaa.tool.requested"
    assert len(of_type(r.log, requested)) == 3
    assert r.seen["model" if dimension == "model_calls" else "tool"] == 3
    meta = arun(r.engine.meta(r.log[0].stream))
    assert getattr(meta.spend, dimension) == 3


def test_spend_is_recorded_on_llm_completed():
    r = arun(EXPECTED["budget_cost"][0](False))
    (done,) = of_type(r.log, "aaa.llm.completed")
    assert done.data["usage"] == {"input_tokens": 25, "output_tokens": 2}
    assert done.data["cost"] == pytest.approx(25e-6 + 2 * 2e-6)
    assert done.data["tag"] == "turn-1"


def test_invalid_input_errors_are_in_the_log():
    r = arun(EXPECTED["invalid_input"][0](False))
    (rejected,) = of_type(r.log, "aaa.input.rejected")
    locs = {tuple(e["loc"]) for e in rejected.data["errors"]}
    assert ("task",) in locs and ("job",) in locs
    assert r.outcome.value["errors"] == rejected.data["errors"]


def test_cancel_records_reason_and_cancels_the_tool():
    r = arun(EXPECTED["cancelled"][0](False))
    assert r.outcome.value == {"reason": "changed my mind", "by": "tester"}
    assert types(r.log)[-2:] == ["aaa.tool.failed", "aaa.run.completed"]
    (cut,) = of_type(r.log, "aaa.tool.failed")  # recorded by the run's end, before it
    assert cut.data["reason"] == "cancelled" and cut.data["cut_off"] is True


def test_algorithm_exception_fails_with_traceback():
    r = arun(EXPECTED["failed"][0](False))
    assert r.outcome.value["error"] == "RuntimeError: the algorithm blew up"
    assert "Traceback" in r.outcome.value["traceback"]
    assert "the algorithm blew up" in r.outcome.value["traceback"]


def test_model_crash_is_an_event():
    r = arun(EXPECTED["failed_model"][0](False))
    (failed,) = of_type(r.log, "aaa.llm.failed")
    assert failed.data["reason"] == "error"
    assert "ConnectionError: the provider is down" in failed.data["error"]
    assert "Traceback" in failed.data["traceback"]


def test_approval_granted_runs_the_tool_once():
    r = arun(EXPECTED["approval_granted"][0](False))
    assert r.seen["decided"] is True and r.seen["deployed"] == 1
    (granted,) = of_type(r.log, "aaa.approval.granted")
    assert granted.data["by"] == "alice" and granted.data["request_id"] == r.seen["request_id"]
    assert r.outcome.value == {"text": "tool said: deployed to prod"}


def test_approval_denied_fails_the_call_the_model_sees_why():
    r = arun(EXPECTED["approval_denied"][0](False))
    assert r.seen["deployed"] == 0
    (failed,) = of_type(r.log, "aaa.tool.failed")
    assert failed.data["reason"] == "denied" and "not today" in failed.data["error"]
    assert "denied" in r.outcome.value["text"]


def test_approval_expiry_counts_as_denial():
    r = arun(EXPECTED["approval_expired"][0](False))
    assert r.seen["deployed"] == 0
    (failed,) = of_type(r.log, "aaa.tool.failed")
    assert failed.data["reason"] == "expired"


def test_tool_timeout_is_a_failed_event_the_model_sees():
    r = arun(EXPECTED["tool_timeout"][0](False))
    (failed,) = of_type(r.log, "aaa.tool.failed")
    assert failed.data["reason"] == "timeout"
    assert r.outcome.value["text"].startswith("tool said: error (timeout)")


def test_tool_crash_is_a_failed_event_with_traceback():
    r = arun(EXPECTED["tool_crash"][0](False))
    (failed,) = of_type(r.log, "aaa.tool.failed")
    assert failed.data["reason"] == "error"
    assert failed.data["error"] == "ValueError: cannot handle 7"
    assert "Traceback" in failed.data["traceback"]


@pytest.mark.parametrize("duplicate", [False, True], ids=["once", "twice"])
def test_pool_of_two_never_runs_more_than_two(duplicate):
    r = arun(EXPECTED["pool"][0](duplicate))
    assert r.seen["max"] == 2
    assert r.seen["calls"] == 10
    assert r.outcome.value == {"ok": 10}


def test_a_late_model_result_is_not_recorded_after_the_end():
    r = arun(EXPECTED["late_model_result"][0](False))
    assert types(r.log)[-1] == "aaa.run.completed" and of_type(r.log, "aaa.llm.completed") == []
    assert r.outcome.outcome == "cancelled"
    # the run's end recorded the call in flight, counted at its attempt's estimate
    (attempt,) = of_type(r.log, "aaa.llm.attempted")
    (cut,) = of_type(r.log, "aaa.llm.failed")
    assert cut.data["reason"] == "cancelled" and cut.data["cut_off"] is True and cut.data["attempt"] == 1
    estimate = attempt.data["estimate"]
    assert cut.data["usage"] == estimate["usage"] and cut.data["cost"] == estimate["cost"] > 0
    assert cut.data["estimated"] is True
    assert r.engine.errors == [] and r.engine.bus.errors == []


def test_child_run_reports_to_its_parent():
    r = arun(EXPECTED["child_run"][0](False))
    assert r.outcome.value == {"child": {"text": "1 + 2 = 3"}}
    assert r.seen["open"] == {}
    child_started = [e for e in r.log if e.stream == r.seen["child"] and e.type == "aaa.run.started"]
    assert child_started[0].data["parent"] == RUN


def test_cancelling_a_parent_cancels_its_child():
    r = arun(EXPECTED["cascade_cancel"][0](False))
    assert r.seen["child_outcome"].outcome == "cancelled"
    assert r.seen["child_outcome"].value["by"] == RUN
    # the parent ended first: no notice of its child's end follows its own
    assert of_type(r.log, "aaa.child.completed") == []
    # the child's log reads whole: its tool call has its result before its end
    child = [e for e in r.log if e.stream != RUN]
    assert [e.type for e in child][-3:] == ["aaa.cancel.requested", "aaa.tool.failed", "aaa.run.completed"]
    assert of_type(child, "aaa.tool.failed")[0].data["reason"] == "cancelled"


def test_pools_can_be_built_by_a_factory():
    """A cluster passes a shared limiter; the handler uses it like a semaphore."""
    import asyncio

    from aaa_django.tools import ToolHandler, ToolRegistry, tool

    built = []

    class Limiter:
        def __init__(self, name, size):
            built.append((name, size))
            self.sem = asyncio.Semaphore(size)

        async def __aenter__(self):
            await self.sem.acquire()

        async def __aexit__(self, *exc):
            self.sem.release()

    @tool(pool="db", inline=True)
    def q(i: int) -> int:
        """Query."""
        return i

    async def scenario():
        from aaa_django.events import FoldCache
        from aaa_django.runtime import Engine

        from . import algos

        async with Engine(cache=FoldCache()) as engine:
            ToolHandler(ToolRegistry([q]), pools={"db": 3}, pool_factory=Limiter).attach(engine)
            run = await engine.start(algos.FanOut(tool="q", n=4), {})
            return await run.result(timeout=5)

    assert arun(scenario()).value == {"ok": 4}
    assert built == [("db", 3)]


def test_a_timeout_error_the_tool_raises_itself_is_its_error_not_a_timeout():
    # A tool with a timeout whose own code raises TimeoutError (a socket's, say) well
    # within its time: that is the tool's error, reason "error".
    import asyncio

    from aaa_django.algos import ToolLoop
    from aaa_django.tools import ToolRegistry, tool

    from .helpers import make_engine
    from .scenarios import call_once_then_report, finish

    @tool(timeout=5)
    async def flaky() -> str:
        """Its connection times out at once."""
        await asyncio.sleep(0)
        raise TimeoutError("connect timed out")

    async def main():
        registry = ToolRegistry([flaky])
        async with make_engine(call_once_then_report("flaky"), registry) as engine:
            await engine.start(ToolLoop(registry), {"task": "try"}, run_id=RUN)
            return await finish(engine, [RUN])

    r = arun(main())
    (failed,) = of_type(r.log, "aaa.tool.failed")
    assert failed.data["reason"] == "error"
    assert failed.data["error"] == "TimeoutError: connect timed out"
