"""The example site, started as it is deployed, offers a run's model the site's tools.

gunicorn over PostgreSQL, S3 for blobs, the in-process bus, and the model server of
tests/field/model_server.py as the site's provider (``AAA_LLM_*``): it calls a tool only
when it is offered one, as a real model does. A ToolLoop started over the REST API with
no ``config.tools`` is offered the site's tools (``AAA["TOOLS"]``), runs
``lookup_population`` and answers; its ``aaa.run.started`` holds the specs it was
offered. A client names a subset by name; an unknown name is a 422 that says which tools
there are.
"""

from __future__ import annotations

import json
import time

import pytest

from aaa_django.runtime.event_types import RUN_STARTED, TOOL_COMPLETED
from project.api_demo import lookup_population, publish_answer
from project.chat.model import choose_city

from .model_server import NO_TOOLS, answer
from .site import Site

pytestmark = [pytest.mark.slow]

TASK = "How many people live in Lyon and Porto?"
#: AAA["TOOLS"] of the site, by name (the chat page's question tool among them)
SITE_TOOLS = [choose_city.spec(), lookup_population.spec(), publish_answer.spec()]


def start(site: Site, **config) -> str:
    body = {"algorithm": "aaa.algos.ToolLoop", "input": {"task": TASK}}
    if config:
        body["config"] = config
    status, run = site.client.call("POST", "/runs", body)
    assert status == 201, run
    return run["id"]


def ended(site: Site, run_id: str, timeout: float = 60) -> dict:
    end = time.monotonic() + timeout
    while True:
        status, run = site.client.call("GET", f"/runs/{run_id}")
        assert status == 200, run
        if run["status"] == "completed":
            return run
        assert time.monotonic() < end, site.logs()
        time.sleep(0.1)


def events(site: Site, run_id: str) -> list[dict]:
    status, page = site.client.call("GET", f"/runs/{run_id}/events?limit=1000")
    assert status == 200 and not page["has_more"], page
    return page["items"]


def test_a_tool_loop_started_over_the_api_runs_the_sites_tool(tmp_path, s3_endpoint):
    with Site(tmp_path, s3_endpoint, model=True, model_latency=(0, 0)) as site:
        default = start(site)
        named = start(site, tools=["publish_answer"])
        none = start(site, tools=[])
        status, refused = site.client.call(
            "POST",
            "/runs",
            {
                "algorithm": "aaa.algos.ToolLoop",
                "input": {"task": TASK},
                "config": {"tools": ["lookup_population", "lookup_weather"]},
            },
        )
        runs = {name: ended(site, run_id) for name, run_id in (("default", default), ("named", named), ("none", none))}
        log = events(site, default)
        asked = site.model_requests()

    # no config.tools: the site's tools, their specs in the started event; the model used one
    assert (runs["default"]["outcome"], runs["default"]["value"]) == (
        "success",
        {"text": answer(TASK, [522_250, 231_800])},
    )
    [started] = [e for e in log if e["type"] == RUN_STARTED]
    assert started["data"]["config"]["tools"] == json.loads(json.dumps(SITE_TOOLS))
    assert sorted(e["data"]["name"] for e in log if e["type"] == TOOL_COMPLETED) == ["lookup_population"] * 2
    # what the model server was offered, request by request
    offered = sorted(tuple(r["tools"]) for r in asked)
    every = tuple(t["name"] for t in SITE_TOOLS)
    assert offered == sorted([every] * 2 + [("publish_answer",), ()])
    # a subset by name, and none
    assert runs["named"]["value"] == {"text": "None of my tools helps here (offered: publish_answer)."}
    assert runs["none"]["value"] == {"text": NO_TOOLS}
    # an unknown name: 422, naming the tools there are, and no run
    assert status == 422, refused
    [error] = refused["detail"]
    assert error["loc"] == ["body", "config", "tools", 1] and error["type"] == "unknown_tool"
    assert "'lookup_weather'" in error["msg"] and ", ".join(every) in error["msg"]
