"""Golden logs: each algorithm's recorded run, replayed through the current code.

The replay feeds the recorded model and tool results to the current algorithm and
compares what it decides with the recording (see ``tests/golden/replay.py``). A
change that alters any decision (a prompt, a rule, an id, an outcome) fails here;
when the change is meant, record again with ``python -m tests.golden.record`` and
review the diff.
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import replace

import pytest

from aaa_django.runtime import registry

from tests.golden.replay import FED, load, path_of, replay, replay_file

from .scenarios import GOLDEN, RUN

CLASSES = {
    "tool_loop": "aaa.algos.ToolLoop",
    "react": "aaa.algos.ReAct",
    "generate_test_repair": "aaa.algos.GenerateTestRepair",
    "generator_critic": "aaa.algos.GeneratorCritic",
    "plan_and_execute": "aaa.algos.PlanAndExecute",
    "workflow_graph": "aaa.algos.WorkflowGraph",
    "fsm": "aaa.algos.FSM",
    "self_consistency": "aaa.algos.SelfConsistency",
}


@pytest.mark.parametrize("name", sorted(GOLDEN))
def test_golden_log_replays_with_the_same_decisions(name):
    r = replay_file(name)
    assert r.same, r.explain()
    assert len(r.recorded) >= 4  # requests, plans or states, and the completion
    assert r.recorded[-1]["type"] == "aaa.run.completed"


def test_every_built_in_algorithm_has_a_golden_log():
    built_in = {n for n in registry.names() if n.startswith("aaa.algos.")} - {
        "aaa.algos.PydanticAIAgent"
    }  # replays an agent of yours: tests/pydantic_ai own it
    assert set(CLASSES.values()) == built_in
    for name, algorithm in CLASSES.items():
        events = load(name)
        assert events[0].type == "aaa.run.started" and events[0].data["algorithm"] == algorithm
        assert {e.stream for e in events} == {RUN}


def test_golden_lines_are_normalised():
    for name in GOLDEN:
        for line in path_of(name).read_text(encoding="utf-8").splitlines():
            d = json.loads(line)
            assert "time" not in d and "traceback" not in d["data"]


# -- the replay catches changed decisions (negative controls) ----------------------------------


def replay_events(events):
    return asyncio.run(replay(events))


def test_a_changed_prompt_fails_the_replay(monkeypatch):
    from aaa_django.algos import refine

    monkeypatch.setattr(refine, "REVISE", "Please improve it:\n{feedback}")
    r = replay_file("generator_critic")
    assert not r.same
    assert [d["data"]["tag"] for d in r.missing] == ["generate-2"]
    assert [d["data"]["tag"] for d in r.extra] == ["generate-2"]
    first = r.first_difference()  # where it parts: the revision's request, its messages
    revision = next(e for e in load("generator_critic") if e.data.get("tag") == "generate-2")
    assert first.seq == revision.seq and first.recorded["id"] == first.replayed["id"]
    assert "messages: recorded" in first.describe() and "Please improve it" in first.describe()


def test_a_changed_rule_fails_the_replay(monkeypatch):
    from aaa_django.algos import ensemble

    monkeypatch.setattr(ensemble, "normalise", lambda answer: answer)  # "42." != "42" now
    r = replay_file("self_consistency")
    assert not r.same
    assert [d["type"] for d in r.missing] == ["aaa.run.completed"]
    assert r.extra[0]["data"]["value"]["tally"] != r.missing[0]["data"]["value"]["tally"]


def test_a_changed_config_fails_the_replay():
    events = load("fsm")
    started = events[0]
    config = {**started.data["config"], "max_transitions": 1}
    events[0] = replace(started, data={**started.data, "config": config})
    r = replay_events(events)
    assert not r.same
    (made,) = [d for d in r.extra if d["type"] == "aaa.run.completed"]
    assert made["data"]["outcome"] == "no_solution"


def test_a_different_model_reply_leads_to_different_decisions():
    events = load("generator_critic")
    i = next(i for i, e in enumerate(events) if e.type == "aaa.llm.completed" and e.data["tag"] == "critique-1")
    data = json.loads(json.dumps(events[i].data))
    data["response"]["message"]["content"] = "APPROVED"
    events[i] = replace(events[i], data=data)
    r = replay_events(events)
    assert not r.same
    (done,) = [d for d in r.extra if d["type"] == "aaa.run.completed"]
    assert done["data"]["value"]["iterations"] == 1
    # The approval ends the run at once: the first decision that differs is the one
    # right after the critique (the revision the recording asked for is not asked).
    first = r.first_difference()
    assert first.seq == events[i].seq + 1 and first.replayed is None
    assert first.recorded["data"]["tag"] == "generate-2"


def test_an_unchanged_log_has_no_first_difference():
    assert replay_file("generator_critic").first_difference() is None


def test_the_replay_decides_everything_it_compares():
    # Fed events are never compared, decided ones never fed: the two sets are disjoint
    # and together cover every event of every golden log.
    for name in GOLDEN:
        r = replay_file(name)
        decided = {d["type"] for d in r.recorded}
        assert not decided & FED
        assert decided <= {
            "aaa.llm.requested",
            "aaa.tool.requested",
            "aaa.child.requested",
            "aaa.plan.made",
            "aaa.plan.rejected",
            "aaa.fsm.entered",
            "aaa.run.completed",
        }
