"""What each algorithm is: a registered name, input and config schemas that say no to
bad values, pure helpers, and projections whose folds split and snapshot cleanly."""

from __future__ import annotations

import copy

import pytest
from pydantic import BaseModel, ValidationError

from aaa_django.algos import (
    FSM,
    FSM_STATE,
    LOOP,
    PLAN,
    REFINE,
    SAMPLES,
    WF,
    Algorithm,
    GenerateTestRepair,
    GeneratorCritic,
    PlanAndExecute,
    SelfConsistency,
    ToolLoop,
    WorkflowGraph,
)
from aaa_django.algos.common import child_result, opening
from aaa_django.algos.control import read_llm_choice, read_tool_choice
from aaa_django.algos.ensemble import extract_answer, normalise, vote
from aaa_django.algos.plan import parse_plan
from aaa_django.algos.refine import Check, approved, extract_fenced, verdict_of
from aaa_django.runtime import registry
from aaa_django.tools import ToolRegistry
from tests.golden.replay import load
from tests.runtime.helpers import arun, types

from .scenarios import ARTICLE, GOLDEN, SUPPORT, population, run_tests, scenario, writes

ALGORITHMS = [GenerateTestRepair, GeneratorCritic, PlanAndExecute, WorkflowGraph, FSM, SelfConsistency]
EXAMPLES = {
    GenerateTestRepair: {"test_tool": "run_tests"},
    GeneratorCritic: {},
    PlanAndExecute: {"executor": {"algorithm": "aaa.algos.ToolLoop"}},
    WorkflowGraph: {"nodes": ARTICLE},
    FSM: SUPPORT,
    SelfConsistency: {"n": 3},
}


@pytest.mark.parametrize("cls", ALGORITHMS, ids=lambda c: c.__name__)
def test_registered_with_schemas_and_a_docstring(cls):
    assert issubclass(cls, Algorithm)
    assert cls.name == f"aaa.algos.{cls.__name__}"
    assert registry.get(cls.name) is cls
    assert issubclass(cls.Input, BaseModel) and issubclass(cls.Config, BaseModel)
    assert cls.Input.model_json_schema()["required"] == ["task"]
    assert cls.Config.model_json_schema()["type"] == "object"
    assert len((cls.__doc__ or "").split()) > 20
    for word in ("success",):
        assert word in cls.__doc__


@pytest.mark.parametrize("cls", ALGORITHMS, ids=lambda c: c.__name__)
def test_config_round_trips_through_json(cls):
    algo = cls(**EXAMPLES[cls])
    again = registry.build(cls.name, algo.config())
    assert again.config() == algo.config()
    with pytest.raises(ValidationError):
        cls(**EXAMPLES[cls], no_such_setting=1)


def test_python_objects_are_saved_as_names():
    assert GenerateTestRepair(test_tool=run_tests).cfg.test_tool == "run_tests"
    p = PlanAndExecute(executor=ToolLoop(ToolRegistry([population]), max_turns=3))
    assert p.config()["executor"]["algorithm"] == "aaa.algos.ToolLoop"
    assert p.config()["executor"]["config"]["max_turns"] == 3
    assert p.cfg.executor.build().cfg.max_turns == 3
    assert PlanAndExecute(executor=ToolLoop).config()["executor"] == {"algorithm": "aaa.algos.ToolLoop", "config": {}}


def test_input_must_fit_the_schema():
    r = arun(scenario(lambda: GeneratorCritic(), {"question": "?"}, writes("x"))(False))
    assert r.outcome.outcome == "invalid_input"
    assert types(r.log) == ["aaa.run.started", "aaa.input.rejected", "aaa.run.completed"]


# -- configs that cannot work are refused up front ---------------------------------------------

WF_BAD = {
    "duplicate id": [{"id": "a", "prompt": "x"}, {"id": "a", "prompt": "y"}],
    "unknown input": [{"id": "a", "prompt": "x", "after": ["b"]}],
    "cycle": [{"id": "a", "prompt": "x", "after": ["b"]}, {"id": "b", "prompt": "y", "after": ["a"]}],
    "llm without prompt": [{"id": "a"}],
    "tool without tool": [{"id": "a", "kind": "tool"}],
    "child without algorithm": [{"id": "a", "kind": "child"}],
    "fallback with inputs": [{"id": "a", "prompt": "x", "fallback": "b"}, {"id": "b", "prompt": "y", "after": ["a"]}],
    "depends on a fallback": [
        {"id": "a", "prompt": "x", "fallback": "b"},
        {"id": "b", "prompt": "y"},
        {"id": "c", "prompt": "z", "after": ["b"]},
    ],
    "shared fallback": [
        {"id": "a", "prompt": "x", "fallback": "c"},
        {"id": "b", "prompt": "y", "fallback": "c"},
        {"id": "c", "prompt": "z"},
    ],
    "fallback loop": [{"id": "a", "prompt": "x", "fallback": "b"}, {"id": "b", "prompt": "y", "fallback": "a"}],
    "bad id": [{"id": "a b", "prompt": "x"}],
    "repeated input": [{"id": "a", "prompt": "x"}, {"id": "b", "prompt": "y", "after": ["a", "a"]}],
    "no nodes": [],
}


@pytest.mark.parametrize("why", list(WF_BAD))
def test_workflow_graph_refuses_a_bad_graph(why):
    with pytest.raises(ValidationError):
        WorkflowGraph(nodes=WF_BAD[why])


def test_workflow_graph_says_which_input_is_repeated():
    # (a node waiting for the same input twice would never start: the run would hang)
    with pytest.raises(ValidationError, match=r"node 'b' names \['a'\] more than once in `after`"):
        WorkflowGraph(nodes=WF_BAD["repeated input"])


def test_workflow_graph_sinks_and_primaries():
    cfg = WorkflowGraph(nodes=ARTICLE).cfg
    assert [n.id for n in cfg.sinks()] == ["draft", "title"]
    assert "recall" not in [n.id for n in cfg.primaries()]


def fsm_with(**change):
    return {**SUPPORT, **change}


FSM_BAD = {
    "unknown target": fsm_with(states={"a": {"prompt": "x", "transitions": {"go": "nowhere"}}}, initial="a"),
    "unknown initial": fsm_with(initial="nowhere"),
    "final that acts": fsm_with(finals=["triage"]),
    "no transitions": fsm_with(states={"a": {"prompt": "x", "transitions": {}}}, initial="a"),
    "no finals": fsm_with(finals=[]),
    "tool state without tool": fsm_with(states={"a": {"kind": "tool", "transitions": {"x": "done"}}}, initial="a"),
}


@pytest.mark.parametrize("why", list(FSM_BAD))
def test_fsm_refuses_a_bad_machine(why):
    with pytest.raises(ValidationError):
        FSM(**FSM_BAD[why])


@pytest.mark.parametrize("cfg", [{"n": 0}, {"n": 65}, {"answer_pattern": "("}, {"min_votes": 0}])
def test_self_consistency_refuses_bad_settings(cfg):
    with pytest.raises(ValidationError):
        SelfConsistency(**cfg)


# -- the pure helpers -----------------------------------------------------------------------


def test_parse_plan_reads_json_fenced_json_objects_and_lists():
    assert parse_plan('["a", "b"]', 5) == (["a", "b"], None)
    assert parse_plan('Sure:\n```json\n["a", "b"]\n```', 5) == (["a", "b"], None)
    assert parse_plan('{"steps": ["a"]}', 5) == (["a"], None)
    assert parse_plan("1. look up Lyon\n2) look up Porto\n- add", 5) == (["look up Lyon", "look up Porto", "add"], None)
    assert parse_plan("I will think.", 5)[1].startswith("no steps found")
    assert parse_plan('["a", "b", "c"]', 2)[1] == "3 steps is more than the 2 allowed"


def test_gtr_test_verdicts():
    assert verdict_of(Check(ok=True, result=True)) == (True, "")
    assert verdict_of(Check(ok=True, result={"passed": True}))[0] is True
    assert verdict_of(Check(ok=True, result={"passed": False, "feedback": "1 != 2"})) == (False, "1 != 2")
    assert verdict_of(Check(ok=True, result="all good?")) == (False, "all good?")
    assert verdict_of(Check(ok=False, reason="error", error="AssertionError: x")) == (False, "error: AssertionError: x")
    assert extract_fenced("text\n```py\nx = 1\n```\nmore") == "x = 1\n"
    assert extract_fenced("  no fence ") == "no fence"


def test_critic_approval_is_the_first_line():
    assert approved("APPROVED", "APPROVED")
    assert approved("\n**Approved.** Nice work.", "APPROVED")
    assert not approved("Not APPROVED yet", "APPROVED")
    assert not approved("Needs work.\nAPPROVED once fixed", "APPROVED")


def test_fsm_reads_labels():
    assert read_llm_choice("Done.\nNEXT: sent") == ("Done.", "sent")
    assert read_llm_choice("**Next:** bug\nthe rest") == ("the rest", "bug")
    assert read_llm_choice("question") == ("question", "question")
    assert read_tool_choice({"next": "ok", "output": 3}) == ("3", "ok")
    assert read_tool_choice("reproduced") == ("reproduced", "reproduced")


def test_child_results_and_openings():
    assert child_result({"outcome": "success", "value": {"text": "hi", "n": 1}}) == (True, "hi")
    assert child_result({"outcome": "success", "value": {"n": 1}}) == (True, '{"n": 1}')
    assert child_result({"outcome": "timeout", "value": {"text": "hi"}}) == (False, 'timeout: {"text": "hi"}')
    assert [(m.role, m.content) for m in opening("be brief", "task")] == [("system", "be brief"), ("user", "task")]
    assert [(m.role, m.content) for m in opening(None, "task")] == [("user", "task")]


def test_votes_normalise_answers_and_ties_go_to_the_first_sample():
    assert extract_answer("because...\nAnswer: 42.") == "42."
    assert extract_answer("thinking\n\n42\n") == "42"
    assert normalise(" The  Answer. ") == normalise("the answer")
    assert vote({0: "Answer: 7", 1: "Answer: 9", 2: "Answer: 9."})[:2] == ("9", 2)
    assert vote({3: "Answer: b", 1: "Answer: a"})[:2] == ("a", 1)  # a tie: sample 1 first


# -- projections: split folds and snapshots equal the whole fold ---------------------------------

PROJECTIONS = {
    "tool_loop": LOOP,
    "react": LOOP,
    "generate_test_repair": REFINE,
    "generator_critic": REFINE,
    "plan_and_execute": PLAN,
    "workflow_graph": WF,
    "fsm": FSM_STATE,
    "self_consistency": SAMPLES,
}


@pytest.mark.parametrize("name", sorted(GOLDEN))
def test_projection_any_split_and_snapshot_equals_the_whole_fold(name):
    projection = PROJECTIONS[name]
    assert projection.name.startswith("aaa.algos.") and projection.snapshots
    log = load(name)
    whole = projection.fold(log)
    for cut in range(len(log) + 1):
        head = projection.fold(log[:cut])
        snapshot = projection.parse(projection.dump(head))
        assert projection.same(snapshot, head)
        copied = projection.fold(log[cut:], projection.copy(head))
        assert projection.same(copied, whole)
        assert projection.same(projection.fold(log[cut:], snapshot), whole)
        # the copy is independent: folding it on left the original as it was
        assert projection.same(head, projection.fold(log[:cut]))
    assert copy.deepcopy(whole) is not whole
