"""The graph of a WorkflowGraph or FSM run and the path it took
(aaa_django.admin.graphs: the picture model, pure; pictures.graph draws it)."""

from __future__ import annotations

import asyncio
import re
from dataclasses import replace

from aaa_django.admin.graphs import fsm_picture, graph_picture, workflow_picture
from aaa_django.admin.pictures import graph
from aaa_django.algos import FSM, ToolLoop, WorkflowGraph
from aaa_django.algos.control import FSM_ENTERED
from aaa_django.events import Event
from aaa_django.models import EventRecord
from aaa_django.runtime.event_types import (
    APPROVAL_REQUESTED,
    LLM_COMPLETED,
    RUN_COMPLETED,
    RUN_STARTED,
    TOOL_COMPLETED,
    TOOL_REQUESTED,
    result_id,
    started_id,
)
from aaa_django.store import DjangoEventStore, runindex
from tests.algos import scenarios
from tests.golden.replay import load

from . import support
from .test_run_pages import run_url, text


def config_of(events: list[Event]) -> dict:
    return events[0].data["config"]


def statuses(picture) -> dict[str, str]:
    return {n.id: n.status for n in picture.nodes}


def taken(picture) -> dict[tuple[str, str], int]:
    return {(e.src, e.dst): e.taken for e in picture.edges if e.taken}


def run(case) -> list[Event]:
    return asyncio.run(case()).log


# -- WorkflowGraph -----------------------------------------------------------------------------


def test_a_workflow_run_shows_each_node_as_it_ended_and_the_fallback_it_took():
    events = load("workflow_graph")  # the facts tool fails; its fallback, recall, answers
    picture = graph_picture(WorkflowGraph, config_of(events), events)
    assert statuses(picture) == {
        "outline": "done",
        "facts": "failed",
        "recall": "done",
        "draft": "done",
        "title": "done",
    }
    assert picture.path == ("outline", "facts", "title", "recall", "draft")
    assert [picture.node(n).steps for n in picture.path] == [(1,), (2,), (3,), (4,), (5,)]
    assert taken(picture) == {
        ("outline", "draft"): 1,
        ("facts", "draft"): 1,
        ("outline", "title"): 1,
        ("facts", "recall"): 1,
    }
    assert (picture.outcome, picture.note) == ("success", "")
    # columns along the edges; a fallback under the node it replaces
    place = {n.id: (n.rank, n.row) for n in picture.nodes}
    assert place == {
        "outline": (0, 0),
        "facts": (0, 1),
        "recall": (0, 2),
        "title": (1, 0),
        "draft": (1, 1),
    }  # title sits by its one input


def test_a_workflow_run_as_it_goes_and_as_it_failed():
    events = load("workflow_graph")
    cfg = WorkflowGraph.Config.model_validate(config_of(events))
    just_started = workflow_picture(cfg, events[:1])
    assert set(statuses(just_started).values()) == {"idle"} and just_started.path == ()
    assert not taken(just_started) and just_started.outcome is None
    first_requests = [e for e in events if e.type == LLM_COMPLETED][0].seq - 1
    going = workflow_picture(cfg, events[:first_requests])
    assert statuses(going)["outline"] == "running" and statuses(going)["draft"] == "idle"

    failed = run(scenarios.wf_failed)  # no fallback: the run fails, the rest is cancelled
    picture = graph_picture(WorkflowGraph, config_of(failed), failed)
    assert picture.outcome == "failed" and statuses(picture)["facts"] == "failed"
    assert statuses(picture)["outline"] == "stopped" and statuses(picture)["draft"] == "idle"
    assert picture.note == "facts failed: error: TimeoutError: the facts service did not answer"


def test_the_picture_needs_no_payload_of_a_claim_checked_event():
    """A claim-checked event keeps only its stub in the log: the picture is the same."""
    events = load("workflow_graph")
    hot = ("tag", "call_id", "name", "usage", "cost")
    stubs = [
        replace(e, data={"$claim": True, **{k: e.data[k] for k in hot if k in e.data}})
        if e.type not in (RUN_STARTED, RUN_COMPLETED)
        else e
        for e in events
    ]
    cfg = WorkflowGraph.Config.model_validate(config_of(events))
    assert workflow_picture(cfg, stubs) == workflow_picture(cfg, events)
    fsm = load("fsm")
    stubs = [
        replace(e, data={"$claim": True, **{k: e.data[k] for k in hot if k in e.data}})
        if e.type not in (RUN_STARTED, RUN_COMPLETED, FSM_ENTERED)
        else e
        for e in fsm
    ]
    fcfg = FSM.Config.model_validate(config_of(fsm))
    assert fsm_picture(fcfg, stubs) == fsm_picture(fcfg, fsm)


def test_a_child_node_is_done_when_its_run_succeeds():
    events = run(scenarios.wf_child)
    mine = [e for e in events if e.stream == scenarios.RUN]
    picture = graph_picture(WorkflowGraph, config_of(mine), mine)
    assert statuses(picture) == {"count": "done", "report": "done"}
    assert picture.node("count").detail == "child aaa.algos.ToolLoop"


# -- FSM ---------------------------------------------------------------------------------------


def test_an_fsm_run_shows_the_states_it_entered_and_the_transitions_it_followed():
    events = load("fsm")  # triage -bug-> reproduce -reproduced-> answer -sent-> done
    picture = graph_picture(FSM, config_of(events), events)
    assert picture.path == ("triage", "reproduce", "answer", "done")
    assert statuses(picture) == {"triage": "done", "reproduce": "done", "answer": "done", "done": "done"}
    assert taken(picture) == {("triage", "reproduce"): 1, ("reproduce", "answer"): 1, ("answer", "done"): 1}
    labels = {(e.src, e.dst): e.label for e in picture.edges}
    assert labels[("reproduce", "answer")] == "error / reproduced"  # one edge, both labels
    assert labels[("reproduce", "triage")] == "not_reproduced"
    assert {n.id: n.rank for n in picture.nodes} == {"triage": 0, "reproduce": 1, "answer": 1, "done": 2}
    assert picture.node("done").kind == "final"


def test_an_fsm_run_that_loops_counts_each_edge_and_one_that_ends_stuck_says_why():
    looped = run(scenarios.fsm_max_transitions)  # triage <-> reproduce until the limit
    picture = graph_picture(FSM, config_of(looped), looped)
    assert picture.path == ("triage", "reproduce", "triage", "reproduce", "triage")
    assert taken(picture) == {("triage", "reproduce"): 2, ("reproduce", "triage"): 2}
    assert picture.node("triage").steps == (1, 3, 5) and statuses(picture)["triage"] == "failed"
    assert picture.outcome == "no_solution" and "max_transitions" in picture.note

    stuck = run(scenarios.fsm_unknown_transition)  # the model answers a label with no edge
    picture = graph_picture(FSM, config_of(stuck), stuck)
    assert picture.path == ("triage",) and statuses(picture)["triage"] == "failed"
    assert picture.note == "triage: the label 'feature_request' names no transition"

    down = run(scenarios.fsm_model_down)
    assert statuses(graph_picture(FSM, config_of(down), down))["triage"] == "failed"


def test_only_graph_algorithms_have_a_picture():
    assert graph_picture(ToolLoop, {}, []) is None


# -- the SVG -----------------------------------------------------------------------------------


def test_the_svg_draws_every_node_and_edge_and_strengthens_the_path():
    events = load("fsm")
    svg = str(graph(graph_picture(FSM, config_of(events), events)))
    nodes = {
        node: status
        for status, node in re.findall(r'<g class="aaa-node aaa-node-(\w+) aaa-kind-\w+" data-node="(\w+)"', svg)
    }
    assert nodes == {"triage": "done", "reproduce": "done", "answer": "done", "done": "done"}
    edges = re.findall(
        r'<g class="aaa-edge aaa-edge-transition( aaa-edge-taken)?" data-src="(\w+)" '
        r'data-dst="(\w+)"',
        svg,
    )
    assert len(edges) == 5 and sum(1 for t, _, _ in edges if t) == 3
    assert "path: triage → reproduce → answer → done" in svg
    assert "<title>triage (model): done, reached at step 1</title>" in svg


def test_the_svg_escapes_what_a_config_says():
    cfg = FSM.Config.model_validate(
        {"states": {"a": {"prompt": "p", "transitions": {"<b>ok</b>": "z"}}}, "initial": "a", "finals": ["z"]}
    )
    started = Event(id="s", stream="r", type=RUN_STARTED, seq=1)
    svg = str(graph(fsm_picture(cfg, [started])))
    assert "<b>" not in svg and "&lt;b&gt;ok&lt;/b&gt;" in svg and "nothing started yet" in svg


def test_a_long_loop_is_drawn_with_its_counts():
    """An FSM run of 1,000 events: 250 times round triage and reproduce."""
    cfg = FSM.Config.model_validate(scenarios.SUPPORT)
    events, seq = [Event(id="s", stream="r", type=RUN_STARTED, seq=1)], 1
    for n in range(250):
        state = "triage" if n % 2 == 0 else "reproduce"
        ask = Event(id=f"ask-{n}", stream="r", type=TOOL_REQUESTED, seq=seq + 2, data={"call_id": f"fsm-{n}"})
        events += [
            Event(
                id=f"in-{n}", stream="r", type=FSM_ENTERED, seq=seq + 1, data={"state": state, "step": n, "via": None}
            ),
            ask,
            Event(id=result_id(ask.id), stream="r", type=TOOL_COMPLETED, seq=seq + 3),
            Event(id=f"x-{n}", stream="r", type="aaa.other", seq=seq + 4),
        ]
        seq += 4
    picture = fsm_picture(cfg, events)
    assert len(events) == 1001 and len(picture.path) == 250
    assert taken(picture) == {("triage", "reproduce"): 125, ("reproduce", "triage"): 124}
    assert statuses(picture)["reproduce"] == "running"
    svg = str(graph(picture))
    assert "not_reproduced ×124" in svg and "path: triage → reproduce" in svg and " … " in svg


# -- on the run page -----------------------------------------------------------------------------


def drawn(page: str) -> dict[str, str]:
    """node -> status of the run page's graph."""
    svg = re.search(r'<svg class="aaa-graph".*?</svg>', page, re.S).group(0)
    return {
        node: status
        for status, node in re.findall(r'<g class="aaa-node aaa-node-(\w+) aaa-kind-\w+" data-node="(\w+)"', svg)
    }


def ended(run_id: str) -> str:
    return support.wait_until(lambda: (r := runindex.refresh("default", run_id)) and r.outcome)


def test_the_run_page_draws_a_workflow_run_an_fsm_run_and_a_run_just_started(client, admin_user, site):
    graph = site.call(lambda e: e.start(support.workflow(), {"task": "Lyon"})).run_id
    machine = site.call(lambda e: e.start(support.machine(), {"task": "It crashes"})).run_id
    assert ended(graph) == "success" and ended(machine) == "success"
    started = "run-just-started"
    DjangoEventStore().append_sync(
        [
            Event(
                id=started_id(started),
                stream=started,
                type=RUN_STARTED,
                data={"algorithm": "aaa.algos.WorkflowGraph", "config": {"nodes": support.ARTICLE}, "input": {}},
            )
        ]
    )
    runindex.refresh("default", started)
    client.force_login(admin_user)

    page = text(client.get(run_url(graph)))
    assert drawn(page) == {
        "outline": "done",
        "page": "failed",
        "recall": "done",
        "sources": "done",
        "draft": "done",
        "title": "done",
    }
    assert "<h2>Workflow" in page
    page = text(client.get(run_url(machine)))
    assert drawn(page) == {"triage": "done", "investigate": "done", "answer": "done", "done": "done", "human": "idle"}
    assert "path: triage → investigate → triage → investigate → answer → done" in page
    assert "bug ×2" in page and "<h2>States" in page
    page = text(client.get(run_url(started)))
    assert set(drawn(page).values()) == {"idle"} and "nothing started yet" in page
    # other algorithms have no graph
    loop = site.call(lambda e: e.start(support.loop(), {"task": "look up the admin"})).run_id
    ended(loop)
    assert 'id="graph"' not in text(client.get(run_url(loop)))


def test_a_workflow_waiting_for_an_approval_shows_the_node_running(client, admin_user, site):
    run_id = site.call(lambda e: e.start(support.workflow(ship=True), {"task": "Lyon"})).run_id
    support.wait_until(lambda: EventRecord.objects.filter(stream=run_id, type=APPROVAL_REQUESTED).exists())
    client.force_login(admin_user)
    nodes = drawn(text(client.get(run_url(run_id))))
    assert nodes["ship"] == "running" and nodes["draft"] == "done"
    assert site.call(lambda e: e.cancel(run_id, reason="not today"))
    ended(run_id)
    assert drawn(text(client.get(run_url(run_id))))["ship"] == "stopped"


def test_a_config_that_does_not_describe_a_graph_is_said_so(client, admin_user, site):
    run_id = "run-bad-graph"
    DjangoEventStore().append_sync(
        [
            Event(
                id=started_id(run_id),
                stream=run_id,
                type=RUN_STARTED,
                data={"algorithm": "aaa.algos.FSM", "config": {"states": {}}, "input": {}},
            )
        ]
    )
    runindex.refresh("default", run_id)
    client.force_login(admin_user)
    page = text(client.get(run_url(run_id)))
    assert "The run&#x27;s config does not describe a graph" in page and '<svg class="aaa-graph"' not in page
