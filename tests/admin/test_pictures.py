"""The admin's pictures (aaa_django.admin.pictures): inline SVG drawn by the server."""

from __future__ import annotations

import re

from aaa_django import runindex
from aaa_django.admin.pictures import budget_bars
from aaa_django.runtime import Budget, Spend

from . import support
from .test_run_pages import run_url, text


def bars(page: str) -> dict[str, tuple[str, float]]:
    """dimension -> (state, share) of each bar of the page's budget picture."""
    svg = re.search(r'<svg class="aaa-budget".*?</svg>', page, re.S).group(0)
    return {d: (state, float(share)) for state, d, share in
            re.findall(r'<g class="aaa-bar aaa-(\w+)" data-dimension="(\w+)" data-share="([\d.]+)">', svg)}


def test_budget_bars_say_how_much_of_each_limit_is_used():
    svg = budget_bars(Budget(tokens=1000, cost=0.5, tool_calls=4),
                      Spend(tokens_in=600, tokens_out=250, cost=0.6, tool_calls=1, model_calls=3))
    found = bars(str(svg))
    assert found == {"tokens": ("near", 0.85), "cost": ("over", 1.2), "tool_calls": ("ok", 0.25)}
    # a bar is as long as its share (a full track at most)
    fills = [float(w) for w in re.findall(r'width="([\d.]+)" height="12" rx="2" class="aaa-bar-fill"', str(svg))]
    track = float(re.search(r'width="([\d.]+)" height="12" rx="2" class="aaa-bar-track"', str(svg)).group(1))
    assert fills == [round(track * 0.85, 1), track, round(track * 0.25, 1)]
    assert "<title>cost: $0.6000 / $0.5000 (120%)</title>" in str(svg)
    assert budget_bars(Budget(), Spend()) is None and budget_bars(None, Spend()) is None


def test_the_run_page_draws_the_budget_of_a_run_that_has_one(client, admin_user, site):
    within = site.call(lambda e: e.start(support.loop(), {"task": "look up the admin"},
                                         budget={"model_calls": 2, "tool_calls": 4})).run_id
    over = site.call(lambda e: e.start(support.loop(), {"task": "look up the admin"},
                                       budget={"model_calls": 1})).run_id
    unlimited = site.call(lambda e: e.start(support.loop(), {"task": "look up the admin"})).run_id
    for run_id in (within, over, unlimited):
        support.wait_until(lambda: (r := runindex.refresh("default", run_id)) and r.outcome)
    client.force_login(admin_user)

    assert bars(text(client.get(run_url(within)))) == {"model_calls": ("near", 1.0), "tool_calls": ("ok", 0.25)}
    assert bars(text(client.get(run_url(over)))) == {"model_calls": ("over", 2.0)}  # the 2nd request ended it
    assert 'class="aaa-budget"' not in text(client.get(run_url(unlimited)))
