"""The admin's pictures (aaa_django.admin.pictures): inline SVG drawn by the server."""

from __future__ import annotations

import re

from aaa_django.admin.pictures import budget_bars
from aaa_django.runtime import Budget, Spend
from aaa_django.store import runindex

from . import support
from .test_run_pages import run_url, text


def bars(page: str) -> dict[str, tuple[str, float]]:
    """dimension -> (state, share) of each bar of the page's budget picture."""
    svg = re.search(r'<svg class="aaa-budget".*?</svg>', page, re.S).group(0)
    return {
        d: (state, float(share))
        for state, d, share in re.findall(
            r'<g class="aaa-bar aaa-(\w+)" data-dimension="(\w+)" data-share="([\d.]+)">', svg
        )
    }


def test_budget_bars_say_how_much_of_each_limit_is_used():
    svg = budget_bars(
        Budget(tokens=1000, cost=0.5, tool_calls=4),
        Spend(tokens_in=600, tokens_out=250, cost=0.6, tool_calls=1, model_calls=3),
    )
    found = bars(str(svg))
    assert found == {"tokens": ("near", 0.85), "cost": ("over", 1.2), "tool_calls": ("ok", 0.25)}
    # a bar is as long as its share (a full track at most)
    fills = [float(w) for w in re.findall(r'width="([\d.]+)" height="12" rx="2" class="aaa-bar-fill"', str(svg))]
    track = float(re.search(r'width="([\d.]+)" height="12" rx="2" class="aaa-bar-track"', str(svg)).group(1))
    assert fills == [round(track * 0.85, 1), track, round(track * 0.25, 1)]
    assert "<title>cost: $0.6000 / $0.5000 (120%)</title>" in str(svg)
    assert budget_bars(Budget(), Spend()) is None and budget_bars(None, Spend()) is None


def test_the_run_page_draws_the_budget_of_a_run_that_has_one(client, admin_user, site):
    within = site.call(
        lambda e: e.start(support.loop(), {"task": "look up the admin"}, budget={"model_calls": 2, "tool_calls": 4})
    ).run_id
    over = site.call(lambda e: e.start(support.loop(), {"task": "look up the admin"}, budget={"model_calls": 1})).run_id
    unlimited = site.call(lambda e: e.start(support.loop(), {"task": "look up the admin"})).run_id
    for run_id in (within, over, unlimited):
        support.wait_until(lambda: (r := runindex.refresh("default", run_id)) and r.outcome)
    client.force_login(admin_user)

    assert bars(text(client.get(run_url(within)))) == {"model_calls": ("near", 1.0), "tool_calls": ("ok", 0.25)}
    # the 2nd request ended the run unrecorded (#12 item 7: spent is what was made)
    assert bars(text(client.get(run_url(over)))) == {"model_calls": ("near", 1.0)}
    assert 'class="aaa-budget"' not in text(client.get(run_url(unlimited)))


def test_the_timeline_bars_go_from_each_request_to_its_answer():
    from aaa_django.admin.pictures import timeline, timeline_spans
    from aaa_django.runtime.event_types import (
        APPROVAL_DENIED,
        APPROVAL_REQUESTED,
        LLM_COMPLETED,
        LLM_REQUESTED,
        RUN_STARTED,
        TOOL_REQUESTED,
        decision_id,
        result_id,
    )

    model, tool, ask = "e-model", "e-tool", "e-ask"
    events = [
        ("e-start", 1, RUN_STARTED, 100.0, ""),
        (model, 2, LLM_REQUESTED, 100.0, ""),
        (result_id(model), 3, LLM_COMPLETED, 101.0, ""),
        (tool, 4, TOOL_REQUESTED, 101.0, "deploy"),
        (ask, 5, APPROVAL_REQUESTED, 101.5, "deploy"),
        (decision_id(ask), 6, APPROVAL_DENIED, 103.0, ""),
    ]
    bars, start, stop = timeline_spans(events, now=104.0)
    assert (start, stop) == (100.0, 104.0)  # the run goes on: up to now
    assert [(b["lane"], b["start"], b["end"], b["open"], b["failed"]) for b in bars] == [
        ("model", 100.0, 101.0, False, False),
        ("tool", 101.0, 104.0, True, False),  # no result yet: to now, faded
        ("approval", 101.5, 103.0, False, True),  # denied
    ]
    svg = str(timeline(events, now=104.0))
    assert svg.count("<rect") == 3 and "aaa-span-tool aaa-span-open" in svg and "aaa-span-failed" in svg
    assert "<title>#4 deploy: 3.0 s (waiting)</title>" in svg
    empty = str(timeline(events[:1], now=100.0))
    assert "<rect" not in empty and "no model or tool calls yet" in empty


def test_the_run_page_draws_a_run_of_a_thousand_events_and_an_empty_one(client, admin_user, site):
    from aaa_django.events import Event
    from aaa_django.runtime.event_types import (
        LLM_COMPLETED,
        LLM_REQUESTED,
        RUN_STARTED,
        TOOL_COMPLETED,
        TOOL_REQUESTED,
        result_id,
        started_id,
    )
    from aaa_django.store import DjangoEventStore

    store, run_id = DjangoEventStore(), "run-thousand"
    events = [
        Event(
            id=started_id(run_id),
            stream=run_id,
            type=RUN_STARTED,
            data={"algorithm": "tests.none", "config": {}, "input": {}},
        )
    ]
    calls = 0
    while len(events) < 1000:  # model calls and tool calls, one after the other
        kind = (LLM_REQUESTED, LLM_COMPLETED) if calls % 2 == 0 else (TOOL_REQUESTED, TOOL_COMPLETED)
        request = Event(id=f"req-{calls}", stream=run_id, type=kind[0], data={"name": "noop"})
        events += [request, Event(id=result_id(request.id), stream=run_id, type=kind[1], data={}, causation=request.id)]
        calls += 1
    for i in range(0, len(events), 100):
        store.append_sync(events[i : i + 100])
    store.append_sync(
        [
            Event(
                id=started_id("run-empty"),
                stream="run-empty",
                type=RUN_STARTED,
                data={"algorithm": "tests.none", "config": {}, "input": {}},
            )
        ]
    )
    for r in (run_id, "run-empty"):
        runindex.refresh("default", r)
    client.force_login(admin_user)

    page = text(client.get(run_url(run_id)))
    picture = re.search(r'<svg class="aaa-timeline".*?</svg>', page, re.S).group(0)
    assert picture.count("<rect") == calls  # a bar per call
    assert f"model calls ({(calls + 1) // 2})" in picture and f"tool calls ({calls // 2})" in picture
    empty = re.search(r'<svg class="aaa-timeline".*?</svg>', text(client.get(run_url("run-empty"))), re.S).group(0)
    assert "<rect" not in empty and "no model or tool calls yet" in empty
