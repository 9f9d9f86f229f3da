"""Every algorithm reaches each of its outcomes; the log says how (event types)."""

from __future__ import annotations

from collections import Counter

import pytest

from aaa_django.algos import FSM
from aaa_django.runtime import OUTCOMES
from tests.runtime.helpers import arun, of_type, types

from .scenarios import EXPECTED, REPORT, RUN, SUPPORT, reproduce, scenario, support_model

ALGORITHMS = {"GenerateTestRepair", "GeneratorCritic", "PlanAndExecute", "WorkflowGraph", "FSM", "SelfConsistency"}


@pytest.mark.parametrize("name", list(EXPECTED))
def test_scenario_outcome_and_log(name):
    expected = EXPECTED[name]
    r = arun(expected.run(False))
    assert r.outcome.outcome == expected.outcome, r.outcome
    if expected.types is not None:
        assert types(r.log) == expected.types
    else:
        assert Counter(types(r.log)) == Counter(expected.bag)
        assert types(r.log)[:2] == ["aaa.run.started", "aaa.input.validated"]
        assert types(r.log)[-1] == "aaa.run.completed"
    assert r.engine.errors == [] and r.engine.bus.errors == []
    assert len(of_type(r.log, "aaa.run.completed")) == 1


def test_every_algorithm_reaches_success_and_its_own_failures():
    reached = {(e.algorithm, e.outcome) for e in EXPECTED.values()}
    assert {a for a, _ in reached} == ALGORITHMS
    for algorithm in ALGORITHMS:
        assert (algorithm, "success") in reached
    assert {o for _, o in reached} <= set(OUTCOMES)
    # the outcomes the brief names for each
    assert {
        ("GeneratorCritic", "no_solution"),
        ("GenerateTestRepair", "no_solution"),
        ("SelfConsistency", "failed"),
        ("PlanAndExecute", "no_solution"),
        ("WorkflowGraph", "failed"),
        ("FSM", "no_solution"),
    } <= reached
    # and a limit of each kind, enforced by the engine for free
    assert {"budget_exceeded", "timeout", "cancelled"} <= {o for _, o in reached}


def outcome(name):
    return arun(EXPECTED[name].run(False))


# -- GenerateTestRepair ------------------------------------------------------------------


def test_gtr_repairs_with_the_test_feedback_and_tests_the_code_block():
    r = outcome("gtr_repaired")
    assert r.outcome.value["iterations"] == 2
    assert r.outcome.value["candidate"] == "def add(a, b):\n    return a + b\n"
    tested = [e.data["args"]["candidate"] for e in of_type(r.log, "aaa.tool.requested")]
    assert tested[0] == "def add(a, b):\n    return a - b\n"  # the fence is stripped
    repair = of_type(r.log, "aaa.llm.requested")[1]
    assert repair.data["tag"] == "generate-2"
    assert "add(2, 3) returned -1, expected 5" in repair.data["messages"][0]["content"]


def test_gtr_a_raising_test_is_a_failed_test_the_model_sees():
    r = outcome("gtr_broken_then_fixed")
    (failed,) = of_type(r.log, "aaa.tool.failed")
    assert failed.data["reason"] == "error" and "SyntaxError" in failed.data["error"]
    repair = of_type(r.log, "aaa.llm.requested")[1]
    assert "SyntaxError" in repair.data["messages"][0]["content"]
    assert r.outcome.ok


def test_gtr_gives_up_after_max_repairs():
    r = outcome("gtr_no_solution")
    v = r.outcome.value
    assert v["reason"] == "max_repairs" and v["iterations"] == 3  # the first + 2 repairs
    assert v["feedback"] == "add(2, 3) returned -1, expected 5"


def test_gtr_a_test_tool_that_cannot_run_fails_the_run():
    r = outcome("gtr_no_test_tool")
    assert "unknown_tool" in r.outcome.value["error"]


# -- GeneratorCritic ------------------------------------------------------------------------


def test_critic_approval_ends_with_the_approved_candidate():
    r = outcome("gc_approved")
    assert r.outcome.value["candidate"].startswith("Draft 2")
    assert r.outcome.value["iterations"] == 2
    reqs = of_type(r.log, "aaa.llm.requested")
    assert [e.data["thread"] for e in reqs] == ["main", "critic", "main", "critic"]
    assert [e.data["tag"] for e in reqs] == ["generate-1", "critique-1", "generate-2", "critique-2"]
    assert "census year" in reqs[2].data["messages"][0]["content"]  # the feedback is passed on


def test_critic_never_approving_is_no_solution_after_the_limit():
    r = outcome("gc_no_solution")
    assert r.outcome.value["reason"] == "max_iterations"
    assert r.outcome.value["iterations"] == 2
    assert r.outcome.value["feedback"] == "Say which census year the figure comes from."


def test_a_failing_critic_call_fails_the_run():
    r = outcome("gc_critic_down")
    assert r.outcome.value["stage"] == "critique"
    assert "provider is down" in r.outcome.value["error"]["error"]


def test_cancel_stops_the_critic_loop():
    r = outcome("gc_cancelled")
    assert r.outcome.value == {"reason": "not needed", "by": "tester"}


# -- PlanAndExecute -------------------------------------------------------------------------


def test_plan_is_a_fact_and_steps_run_in_order():
    r = outcome("pe_success")
    (made,) = of_type(r.log, "aaa.plan.made")
    assert made.data["steps"][0] == "Find the population of Lyon" and made.data["revision"] == 1
    tags = [e.data["tag"] for e in of_type(r.log, "aaa.llm.requested")]
    assert tags == ["plan-1", "step-0", "step-1", "step-2"]
    assert r.outcome.value["answer"] == "754,000 in total" and r.outcome.value["replans"] == 0


def test_a_failed_step_makes_the_planner_replan_what_is_left():
    r = outcome("pe_replanned")
    plans = of_type(r.log, "aaa.plan.made")
    assert [p.data["revision"] for p in plans] == [1, 2]
    replan = [e for e in of_type(r.log, "aaa.llm.requested") if e.data["tag"] == "plan-2"][0]
    content = replan.data["messages"][0]["content"]
    assert "Find the population of Porto" in content and "no source gives" in content
    assert "Lyon: 522,000" in content  # what was done already is kept
    v = r.outcome.value
    assert v["replans"] == 1
    assert [s["step"] for s in v["steps"]] == [
        "Find the population of Lyon",
        "Estimate Porto from the 2021 census",
        "Add the two numbers",
    ]


def test_replanning_is_bounded():
    r = outcome("pe_no_solution")
    v = r.outcome.value
    assert v["reason"] == "max_replans" and v["replans"] == 1
    assert v["error"] == "the archive is closed"


def test_an_unusable_plan_is_rejected_and_asked_again():
    r = outcome("pe_rejected_then_made")
    (rejected,) = of_type(r.log, "aaa.plan.rejected")
    assert "no steps found" in rejected.data["error"]
    assert r.outcome.value["replans"] == 1


def test_steps_as_child_runs():
    r = outcome("pe_children")
    assert [o.outcome for o in r.seen["children"].values()] == ["success", "success"]
    assert r.outcome.value["answer"] == "found 232000"
    second = of_type(r.log, "aaa.child.requested")[1]
    assert second.data["key"] == "step-1"
    assert "Done so far:\n- Look up Lyon: found 522000" in second.data["input"]["task"]


def test_plan_and_execute_times_out_on_a_slow_step():
    r = outcome("pe_timeout")
    assert "deadline" in r.outcome.value


# -- WorkflowGraph --------------------------------------------------------------------------


def test_workflow_branches_run_in_parallel_and_join():
    r = outcome("wf_success")
    first = r.log[2:5]  # one batch (a model request with its first attempt)
    assert {e.type for e in first} == {"aaa.llm.requested", "aaa.llm.attempted", "aaa.tool.requested"}
    draft = [e for e in of_type(r.log, "aaa.llm.requested") if e.data["tag"] == "node-draft"][0]
    assert r.log.index(draft) > max(
        r.log.index(e) for e in r.log if e.type in ("aaa.tool.completed",)
    )  # the join waited for the tool
    assert "founded 43 BC" in draft.data["messages"][0]["content"]
    assert set(r.outcome.value["results"]) == {"draft", "title"}


def test_workflow_fallback_replaces_a_failed_node():
    r = outcome("wf_fallback")
    recall = [e for e in of_type(r.log, "aaa.llm.requested") if e.data["tag"] == "node-recall"][0]
    assert "facts service did not answer" in recall.data["messages"][0]["content"]  # {error}
    assert "Roman origins" in r.outcome.value["results"]["draft"]


def test_workflow_node_failing_without_fallback_fails_the_run():
    r = outcome("wf_failed")
    assert r.outcome.value["node"] == "facts"
    assert "TimeoutError" in r.outcome.value["error"]


def test_workflow_child_node():
    r = outcome("wf_child")
    assert r.outcome.value == {"results": {"report": "REPORT: 232000 PEOPLE"}}


# -- FSM ------------------------------------------------------------------------------------


def test_fsm_follows_model_and_tool_choices_to_a_final_state():
    r = outcome("fsm_success")
    v = r.outcome.value
    assert v["path"] == ["triage", "reproduce", "answer", "done"]
    assert v["output"] == "Thanks for the report: a fix ships in 1.2."
    vias = [e.data["via"] for e in of_type(r.log, "aaa.fsm.entered")]
    assert vias == [None, "bug", "reproduced", "sent"]
    answer = of_type(r.log, "aaa.llm.requested")[1]
    assert "UnicodeDecodeError in the file dialog" in answer.data["messages"][0]["content"]  # {last}


def test_fsm_failed_tool_takes_the_error_transition():
    r = outcome("fsm_error_transition")
    assert r.outcome.value["path"] == ["triage", "reproduce", "answer", "done"]
    assert [e.data["via"] for e in of_type(r.log, "aaa.fsm.entered")][2] == "error"


def test_fsm_unknown_label_is_no_solution():
    r = outcome("fsm_unknown_transition")
    assert r.outcome.value["reason"] == "unknown_transition"
    assert r.outcome.value["label"] == "feature_request" and r.outcome.value["state"] == "triage"


def test_fsm_system_prompt_opens_the_first_model_request_after_a_tool_state():
    starts_with_a_tool = {**SUPPORT, "initial": "reproduce", "system": "You are the support desk."}
    r = arun(scenario(lambda: FSM(**starts_with_a_tool), REPORT, support_model(), [reproduce])())
    assert r.outcome.value["path"] == ["reproduce", "answer", "done"]
    (answer,) = of_type(r.log, "aaa.llm.requested")
    assert answer.data["thread"] == "fsm"
    assert [m["role"] for m in answer.data["messages"]] == ["system", "user"]
    assert answer.data["messages"][0]["content"] == "You are the support desk."


def test_fsm_system_prompt_is_sent_once_per_run():
    with_system = {**SUPPORT, "system": "You are the support desk."}
    r = arun(scenario(lambda: FSM(**with_system), REPORT, support_model(), [reproduce])())
    triage, answer = of_type(r.log, "aaa.llm.requested")
    assert [m["role"] for m in triage.data["messages"]] == ["system", "user"]
    assert [m["role"] for m in answer.data["messages"]] == ["user"]


def test_fsm_stops_after_max_transitions():
    r = outcome("fsm_max_transitions")
    assert r.outcome.value["reason"] == "max_transitions"
    assert len(r.outcome.value["path"]) == 5  # 4 transitions taken, the 5th refused


# -- SelfConsistency -----------------------------------------------------------------------


def test_self_consistency_majority_wins_and_failures_are_counted():
    r = outcome("sc_majority")
    v = r.outcome.value
    assert (v["answer"], v["votes"], v["samples"], v["failures"]) == ("42", 3, 4, 1)
    reqs = of_type(r.log, "aaa.llm.requested")
    assert len({e.data["thread"] for e in reqs}) == 5
    assert all(e.data["params"] == {"temperature": 0.7} for e in reqs)
    assert r.log.index(of_type(r.log, "aaa.llm.completed")[0]) > r.log.index(reqs[-1])  # all at once


def test_self_consistency_every_sample_failing_is_failed():
    r = outcome("sc_all_failed")
    assert r.outcome.value["reason"] == "all_samples_failed" and r.outcome.value["failures"] == 3


def test_self_consistency_without_enough_votes_is_no_solution():
    r = outcome("sc_no_majority")
    assert r.outcome.value["reason"] == "no_majority" and r.outcome.value["votes"] == 1


def test_self_consistency_budget_stops_the_samples_before_they_are_sent():
    r = outcome("sc_budget")
    assert r.outcome.value == {"dimension": "model_calls", "limit": 2, "spent": 0}
    assert of_type(r.log, "aaa.llm.completed") == []


def test_runs_use_the_fixed_run_id():
    r = outcome("gc_approved")
    assert {e.stream for e in r.log} == {RUN}
