"""The admin's pictures in a real browser (headless Chromium, ``tests/browser.py``):
what Chromium lays out, and a screenshot of each in ``artifacts/screenshots/``."""

from __future__ import annotations

import random
from datetime import datetime, timedelta, timezone

import pytest
from django.urls import reverse

from ..browser import browser, shot, wait  # noqa: F401  (browser: the fixture)
from .test_browser import log_in
from .test_charts import a_run

pytestmark = [pytest.mark.browser, pytest.mark.slow]

#: what the browser drew of the run list's chart: its bars, and their boxes on screen
READ_CHART = """
const svg = document.querySelector("#aaa-spend-chart svg.aaa-spend");
if (!svg) return null;
const box = svg.getBoundingClientRect();
const height = sel => Array.from(svg.querySelectorAll(sel), r => r.getBBox().height);
return {
  width: box.width, height: box.height,
  bars: svg.querySelectorAll("g.aaa-period").length,
  tokens: height("rect.aaa-tokens-in").map((h, i) => h + height("rect.aaa-tokens-out")[i]),
  cost: height("rect.aaa-cost"),
  text: svg.textContent,
};
"""


def test_the_run_list_charts_many_runs_and_none(browser, live_server, transactional_db, admin_user):
    rng = random.Random(16)
    first = datetime(2026, 10, 1, tzinfo=timezone.utc)
    for i in range(400):  # 400 runs over 45 days, busier towards the end
        when = first + timedelta(days=int(45 * rng.random() ** 0.6), minutes=rng.randrange(1440))
        tokens_in = rng.randrange(200, 6000)
        a_run(
            f"run-{i:03d}",
            when,
            tokens_in,
            tokens_in // rng.randrange(3, 9),
            tokens_in * 2.5e-6,
            outcome="failed" if i % 9 == 0 else "success",
        )
    log_in(browser, live_server)

    browser.get(live_server.url + reverse("admin:aaa_runrecord_changelist"))
    drawn = wait(browser, lambda d: d.execute_script(READ_CHART))
    assert drawn["bars"] == 45 and drawn["width"] > 600 and drawn["height"] > 150
    assert max(drawn["tokens"]) == pytest.approx(100, abs=0.2)  # the busiest day fills the panel
    assert max(drawn["cost"]) == pytest.approx(60, abs=0.2)
    assert all(h >= 0 for h in drawn["tokens"] + drawn["cost"]) and min(drawn["tokens"]) < 100
    assert "tokens per day" in drawn["text"] and "2026-10-01" in drawn["text"]
    shot(browser, "08-run-list-spend-per-day", width=1900)

    browser.get(live_server.url + reverse("admin:aaa_runrecord_changelist") + "?outcome=timeout")
    empty = wait(browser, lambda d: d.execute_script(READ_CHART))
    assert empty["bars"] == 0 and "No runs match" in empty["text"]
    shot(browser, "09-run-list-spend-none", width=1900)


#: the run page's graph as the browser lays it out: each node's status and box
READ_GRAPH = """
const svg = document.querySelector("#aaa-graph svg.aaa-graph");
if (!svg || document.readyState !== "complete") return null;
const nodes = {};
for (const g of svg.querySelectorAll("g.aaa-node[data-node]")) {
  const r = g.querySelector("rect").getBoundingClientRect();
  nodes[g.dataset.node] = {status: g.dataset.status, width: r.width, height: r.height};
}
return {
  nodes, kind: svg.dataset.kind, width: svg.getBoundingClientRect().width,
  taken: Array.from(svg.querySelectorAll("g.aaa-edge-taken"), g => g.dataset.src + ">" + g.dataset.dst),
  text: svg.textContent,
};
"""


def test_the_run_page_draws_the_graph_of_a_workflow_an_fsm_and_a_run_just_started(
    browser, live_server, admin_user, site
):
    from aaa_django.events import Event
    from aaa_django.runtime.event_types import RUN_STARTED, started_id
    from aaa_django.store import DjangoEventStore, runindex

    from . import support
    from .test_browser import run_page

    graph = site.call(lambda e: e.start(support.workflow(), {"task": "Lyon"})).run_id
    machine = site.call(lambda e: e.start(support.machine(), {"task": "It crashes"})).run_id
    started = "run-just-started"
    DjangoEventStore().append_sync(
        [
            Event(
                id=started_id(started),
                stream=started,
                type=RUN_STARTED,
                data={"algorithm": "aaa.algos.FSM", "config": support.SUPPORT_FSM, "input": {"task": "?"}},
            )
        ]
    )
    for run_id in (graph, machine):
        support.wait_until(lambda r=run_id: (row := runindex.refresh("default", r)) and row.outcome)
    runindex.refresh("default", started)
    log_in(browser, live_server)

    browser.get(run_page(live_server, graph))
    page = wait(browser, lambda d: d.execute_script(READ_GRAPH))
    assert {n: v["status"] for n, v in page["nodes"].items()} == {
        "outline": "done",
        "page": "failed",
        "recall": "done",
        "sources": "done",
        "draft": "done",
        "title": "done",
    }
    assert all(v["width"] > 60 and v["height"] > 20 for v in page["nodes"].values())
    assert "page>recall" in page["taken"] and page["kind"] == "workflow"
    shot(browser, "10-run-page-workflow-graph")

    browser.get(run_page(live_server, machine))
    page = wait(browser, lambda d: d.execute_script(READ_GRAPH))
    assert page["nodes"]["human"]["status"] == "idle" and page["nodes"]["done"]["status"] == "done"
    assert sorted(page["taken"]) == ["answer>done", "investigate>answer", "investigate>triage", "triage>investigate"]
    assert "bug ×2" in page["text"] and page["kind"] == "fsm"
    shot(browser, "11-run-page-fsm-states")

    browser.get(run_page(live_server, started))
    page = wait(browser, lambda d: d.execute_script(READ_GRAPH))
    assert {v["status"] for v in page["nodes"].values()} == {"idle"} and not page["taken"]
    assert "nothing started yet" in page["text"]
    shot(browser, "12-run-page-graph-just-started")


#: the run page's three pictures as the browser lays them out
READ_RUN_PICTURES = """
const one = sel => document.querySelector(sel);
const timeline = one("#aaa-picture svg.aaa-timeline"), graph = one("#aaa-graph svg.aaa-graph"),
      budget = one("#aaa-budget svg.aaa-budget");
if (!timeline || !graph || !budget || document.readyState !== "complete") return null;
return {
  status: document.getElementById("aaa-status").textContent.trim(),
  bars: timeline.querySelectorAll("rect[data-seq]").length,
  bar_widths: Array.from(timeline.querySelectorAll("rect[data-seq]"), r => r.getBBox().width),
  lanes: Array.from(timeline.querySelectorAll(".aaa-lane-label"), t => t.textContent),
  timeline_width: timeline.getBoundingClientRect().width,
  timeline_text: timeline.textContent,
  nodes: Object.fromEntries(Array.from(graph.querySelectorAll("g.aaa-node[data-node]"),
                                       g => [g.dataset.node, g.dataset.status])),
  taken: Object.fromEntries(Array.from(graph.querySelectorAll("g.aaa-edge-taken"),
                                       g => [g.dataset.src + ">" + g.dataset.dst, +g.dataset.taken])),
  graph_text: graph.textContent,
  budget: Object.fromEntries(Array.from(budget.querySelectorAll("g.aaa-bar"), g => [g.dataset.dimension,
    {state: g.classList[1].replace("aaa-", ""), share: +g.dataset.share,
     fill: g.querySelector(".aaa-bar-fill").getBBox().width,
     track: g.querySelector(".aaa-bar-track").getBBox().width}])),
};
"""

#: times a long support run goes round triage and investigate before its usual path
#: (three events a state entered: 1,003 events in all)
ROUNDS = 164
BUDGET = {"model_calls": 400, "tool_calls": 10}


def test_the_run_pages_pictures_on_a_run_of_1000_events_and_on_an_empty_one(
    browser, live_server, transactional_db, admin_user
):
    from dataclasses import replace

    from aaa_django.algos import FSM
    from aaa_django.events import Event
    from aaa_django.runtime.event_types import RUN_STARTED, started_id
    from aaa_django.store import DjangoEventStore, runindex
    from tests.runtime.helpers import arun, make_engine

    from . import support
    from .test_browser import run_page

    # A support FSM run that goes round ROUNDS times (one model call a state entered),
    # run by an engine on a memory store (in a second, where the site's SQLite log takes
    # a minute on a loaded machine), its log then written to the site's.
    long = FSM(**{**support.SUPPORT_FSM, "max_transitions": 2 * ROUNDS + 10, "system": f"Go round {ROUNDS} times."})

    async def record():
        async with make_engine(support.script) as engine:
            run = await engine.start(long, {"task": "It crashes"}, budget=BUDGET)
            await run.result(timeout=60)
            return run.run_id, await run.events()

    run_id, events = arun(record(), timeout=60)
    store = DjangoEventStore()
    for i in range(0, len(events), 250):
        store.append_sync([replace(e, seq=None) for e in events[i : i + 250]])
    empty = "run-just-started-with-a-budget"
    store.append_sync(
        [
            Event(
                id=started_id(empty),
                stream=empty,
                type=RUN_STARTED,
                data={
                    "algorithm": "aaa.algos.FSM",
                    "config": support.SUPPORT_FSM,
                    "input": {"task": "?"},
                    "budget": BUDGET,
                },
            )
        ]
    )
    row = runindex.refresh("default", run_id)
    runindex.refresh("default", empty)
    calls = 2 * ROUNDS + 5  # the round trips, then bug, unclear, bug, found, sent
    # 1,003 events, and each model call's attempt
    assert (row.outcome, row.last_seq, row.model_calls) == ("success", 1003 + calls, calls)
    log_in(browser, live_server)

    browser.get(run_page(live_server, run_id))
    page = wait(browser, lambda d: d.execute_script(READ_RUN_PICTURES))
    assert page["status"] == "completed · success"
    assert page["bars"] == calls and f"model calls ({calls})" in page["lanes"]
    assert min(page["bar_widths"]) >= 1 and page["timeline_width"] > 600  # each call drawn, visibly
    assert page["taken"] == {
        "triage>investigate": ROUNDS + 2,
        "investigate>triage": ROUNDS + 1,
        "investigate>answer": 1,
        "answer>done": 1,
    }
    assert page["nodes"] == {"triage": "done", "investigate": "done", "answer": "done", "done": "done", "human": "idle"}
    assert f"bug ×{ROUNDS + 2}" in page["graph_text"]
    used = page["budget"]
    assert used["model_calls"]["state"] == "near" and used["model_calls"]["share"] == round(calls / 400, 4)
    assert used["model_calls"]["fill"] == pytest.approx(used["model_calls"]["track"] * calls / 400, abs=0.1)
    assert (used["tool_calls"]["state"], used["tool_calls"]["share"], used["tool_calls"]["fill"]) == ("ok", 0, 0)
    shot(browser, "14-run-page-pictures-1000-events")

    browser.get(run_page(live_server, empty))
    page = wait(browser, lambda d: d.execute_script(READ_RUN_PICTURES))
    assert page["status"] == "pending"  # started, nothing delivered yet
    assert page["bars"] == 0 and "no model or tool calls yet" in page["timeline_text"]
    assert set(page["nodes"].values()) == {"idle"} and not page["taken"]
    assert "nothing started yet" in page["graph_text"]
    assert {d: (b["state"], b["share"], b["fill"]) for d, b in page["budget"].items()} == {
        "model_calls": ("ok", 0, 0),
        "tool_calls": ("ok", 0, 0),
    }
    shot(browser, "15-run-page-pictures-empty")
