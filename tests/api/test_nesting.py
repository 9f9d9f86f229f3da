"""Deeply nested JSON in any field of any request body: a 422 naming the field past
``MAX_DEPTH`` levels, never a 500 (fuzzed with hypothesis over every body field, at
depths around the limit and far past it, where parsers and validators recurse)."""

from __future__ import annotations

import json

import pytest
from django.test import Client
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from aaa_django.api.boundary import MAX_DEPTH
from aaa_django.runtime.event_types import INPUT_VALIDATED

pytestmark = pytest.mark.django_db(transaction=True)

START = {"algorithm": "tests.api.echo", "input": {"text": "hi"}}
#: (endpoint, a valid body, the path of every field a value can take in it)
BODIES = [
    (
        "/runs",
        START,
        [
            ("algorithm",),
            ("input",),
            ("input", "text"),
            ("config",),
            ("config", "calls"),
            ("budget",),
            ("budget", "tokens"),
            ("budget", "cost"),
            ("deadline",),
            ("unknown",),
        ],
    ),
    (
        "/runs",
        {"algorithm": "aaa.algos.ToolLoop", "input": {"task": "x"}},
        [("config", "tools"), ("config", "system"), ("input", "task")],
    ),
    ("/runs/{run}/cancel", {"reason": "r"}, [("reason",), ("unknown",)]),
    ("/runs/{run}/approvals/{request}", {"decision": "grant"}, [("decision",), ("reason",), ("unknown",)]),
]
FIELDS = [(url, body, path) for url, body, paths in BODIES for path in paths]
MARK = "__deep__"


def deep_json(kinds: list[str], leaf: str) -> str:
    """JSON text nesting ``len(kinds)`` arrays and objects, built as text: far deeper
    than ``json.dumps`` (or any recursive encoder) goes."""
    opening = "".join("[" if k == "list" else '{"k":' for k in kinds)
    closing = "".join("]" if k == "list" else "}" for k in reversed(kinds))
    return opening + leaf + closing


def body_with(body: dict, path: tuple[str, ...], value_text: str) -> str:
    doc = json.loads(json.dumps(body))
    node = doc
    for key in path[:-1]:
        if not isinstance(node.get(key), dict):
            node[key] = {}
        node = node[key]
    node[path[-1]] = MARK
    return json.dumps(doc).replace(json.dumps(MARK), value_text)


depths = st.one_of(st.integers(1, MAX_DEPTH + 8), st.sampled_from([255, 300, 1000, 5000]))


@pytest.fixture
def world(host, alice, make_run):
    run_id = make_run(alice, types=[INPUT_VALIDATED])
    return alice, run_id


@settings(
    max_examples=120,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    field=st.sampled_from(FIELDS), depth=depths, data=st.data(), leaf=st.sampled_from(["1", '"x"', "null", "[]", "{}"])
)
def test_a_value_nested_past_the_limit_is_422_naming_its_field_and_never_500(world, field, depth, data, leaf):
    user, run_id = world
    url, body, path = field
    kinds = data.draw(
        st.lists(st.sampled_from(["list", "dict"]), min_size=depth, max_size=depth)
        if depth <= 300
        else st.sampled_from([["list"] * depth, ["dict"] * depth])
    )
    text = body_with(body, path, deep_json(kinds, leaf))
    r = Client().post(
        "/api/aaa" + url.format(run=run_id, request="req-1"),
        data=text,
        content_type="application/json",
        headers=user.auth,
    )
    assert r.status_code < 500, r.content[:300]
    # the body is level 1, each key of the path one more; the value's own levels below
    levels = len(path) + depth + (leaf in ("[]", "{}"))
    problems = r.json().get("detail", []) if r.status_code >= 400 else []
    too_deep = [p for p in problems if p["type"] == "too_deep"]
    if levels > MAX_DEPTH:
        assert r.status_code == 422 and too_deep, r.content[:300]
        assert too_deep[0]["loc"][:2] == ["body", path[0]] or too_deep[0]["loc"] == ["body"]
    else:
        assert not too_deep, (levels, r.content[:300])


def test_a_toolloop_config_nested_300_levels_is_422_not_500(world):
    user, _ = world
    text = body_with(
        {"algorithm": "aaa.algos.ToolLoop", "input": {"task": "x"}},
        ("config", "tools"),
        "[" + deep_json(["dict"] * 300, "1") + "]",
    )
    r = Client().post("/api/aaa/runs", data=text, content_type="application/json", headers=user.auth)
    assert r.status_code == 422
    (problem,) = r.json()["detail"]
    assert problem["loc"] == ["body", "config"] and problem["type"] == "too_deep"
    assert problem["msg"].startswith(f"nested more than {MAX_DEPTH} levels deep (at config.tools[0].k.k.")
