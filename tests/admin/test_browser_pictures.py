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
        a_run(f"run-{i:03d}", when, tokens_in, tokens_in // rng.randrange(3, 9), tokens_in * 2.5e-6,
              outcome="failed" if i % 9 == 0 else "success")
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
        browser, live_server, admin_user, site):
    from aaa_django.events import Event
    from aaa_django.runtime.event_types import RUN_STARTED, started_id
    from aaa_django.store import DjangoEventStore, runindex

    from . import support
    from .test_browser import run_page

    graph = site.call(lambda e: e.start(support.workflow(), {"task": "Lyon"})).run_id
    machine = site.call(lambda e: e.start(support.machine(), {"task": "It crashes"})).run_id
    started = "run-just-started"
    DjangoEventStore().append_sync([Event(
        id=started_id(started), stream=started, type=RUN_STARTED,
        data={"algorithm": "aaa.algos.FSM", "config": support.SUPPORT_FSM, "input": {"task": "?"}})])
    for run_id in (graph, machine):
        support.wait_until(lambda r=run_id: (row := runindex.refresh("default", r)) and row.outcome)
    runindex.refresh("default", started)
    log_in(browser, live_server)

    browser.get(run_page(live_server, graph))
    page = wait(browser, lambda d: d.execute_script(READ_GRAPH))
    assert {n: v["status"] for n, v in page["nodes"].items()} == {
        "outline": "done", "page": "failed", "recall": "done", "sources": "done", "draft": "done",
        "title": "done"}
    assert all(v["width"] > 60 and v["height"] > 20 for v in page["nodes"].values())
    assert "page>recall" in page["taken"] and page["kind"] == "workflow"
    shot(browser, "10-run-page-workflow-graph")

    browser.get(run_page(live_server, machine))
    page = wait(browser, lambda d: d.execute_script(READ_GRAPH))
    assert page["nodes"]["human"]["status"] == "idle" and page["nodes"]["done"]["status"] == "done"
    assert sorted(page["taken"]) == ["answer>done", "investigate>answer", "investigate>triage",
                                     "triage>investigate"]
    assert "bug ×2" in page["text"] and page["kind"] == "fsm"
    shot(browser, "11-run-page-fsm-states")

    browser.get(run_page(live_server, started))
    page = wait(browser, lambda d: d.execute_script(READ_GRAPH))
    assert {v["status"] for v in page["nodes"].values()} == {"idle"} and not page["taken"]
    assert "nothing started yet" in page["text"]
    shot(browser, "12-run-page-graph-just-started")
