"""Starting, reading, listing and cancelling runs through the REST API."""

from __future__ import annotations

import json
import sys

import pytest

from aaa_django.models import RunRecord
from aaa_django.runtime.event_types import (
    CANCEL_REQUESTED,
    INPUT_VALIDATED,
    RUN_COMPLETED,
    RUN_STARTED,
)
from aaa_django.store import DjangoEventStore

from .conftest import wait_for

pytestmark = pytest.mark.django_db


def locs(r) -> list[list]:
    return [e["loc"] for e in r.json()["detail"]]


# -- start, then read the run ------------------------------------------------------------


def test_start_returns_201_with_the_run_and_its_url(api, alice, host):
    r = api.post("/runs", json={"algorithm": "tests.api.echo", "input": {"text": "hello"}}, headers=alice.auth)
    assert r.status_code == 201, r.json()
    run = r.json()
    assert run["id"].startswith("run-")
    assert run["url"].endswith(f"/runs/{run['id']}")
    assert r["Location"] == run["url"]
    assert run["owner"] == "alice"
    assert run["algorithm"] == "tests.api.echo"

    done = wait_for(api, run["id"], alice.auth)
    assert done["outcome"] == "success"
    assert done["value"] == {"echo": "hello"}
    assert done["ended_at"] is not None
    assert done["links"]["stream"].endswith(f"/runs/{run['id']}/events/stream")


def test_the_started_event_records_the_owner_budget_and_deadline(api, alice, host):
    r = api.post(
        "/runs", json={"algorithm": "tests.api.idle", "budget": {"tokens": 100}, "deadline": 3600}, headers=alice.auth
    )
    assert r.status_code == 201, r.json()
    run = r.json()
    (started,) = DjangoEventStore().read_sync(run["id"], limit=1)
    assert started.data["owner"] == str(alice.pk)
    assert started.data["budget"] == {"tokens": 100}
    assert run["budget"] == {"tokens": 100}
    assert run["deadline"] is not None
    assert api.post(f"/runs/{run['id']}/cancel", headers=alice.auth).status_code == 202


def test_events_are_paged_in_order(api, alice, make_run):
    run_id = make_run(alice, types=[INPUT_VALIDATED, RUN_COMPLETED])
    r = api.get(f"/runs/{run_id}/events?limit=2", headers=alice.auth)
    page = r.json()
    assert [e["seq"] for e in page["items"]] == [1, 2]
    assert page["has_more"] is True and page["next_after"] == 2
    rest = api.get(f"/runs/{run_id}/events?after=2", headers=alice.auth).json()
    assert [e["type"] for e in rest["items"]] == [RUN_COMPLETED]
    assert rest["has_more"] is False and rest["next_after"] == 3
    assert page["items"][0]["type"] == RUN_STARTED
    assert page["items"][0]["data"]["algorithm"] == "tests.api.echo"


def test_claim_checked_events_are_hydrated_on_request(api, alice, make_run, settings, tmp_path):
    from aaa_django.data import claim
    from aaa_django.events import Event, derive_id
    from aaa_django.site.blobs import StorageBlobStore

    settings.STORAGES = {
        **settings.STORAGES,
        "blobs": {"BACKEND": "django.core.files.storage.FileSystemStorage", "OPTIONS": {"location": str(tmp_path)}},
    }
    settings.AAA = {**settings.AAA, "BLOB_STORAGE": "blobs"}
    run_id = make_run(alice, types=[INPUT_VALIDATED])
    big = {"name": "report", "text": "x" * 50_000}
    stub, ref = claim(big, store=StorageBlobStore(alias="blobs"), namespace=run_id, threshold=100)
    DjangoEventStore().append_sync(
        [Event(id=derive_id(run_id, "big"), stream=run_id, type="tests.api.big", data=stub, blobs=(ref,))]
    )
    raw = api.get(f"/runs/{run_id}/events?after=2", headers=alice.auth).json()["items"][0]
    assert raw["data"] == {"$claim": True, "name": "report"}
    full = api.get(f"/runs/{run_id}/events?after=2&hydrate=true", headers=alice.auth)
    assert full.json()["items"][0]["data"] == big


def test_list_filters_and_pages(api, alice, make_run):
    done = make_run(alice, types=[INPUT_VALIDATED, RUN_COMPLETED], outcome="no_solution")
    running = make_run(alice, types=[INPUT_VALIDATED])
    other = make_run(alice, types=[INPUT_VALIDATED], algorithm="tests.api.idle")

    def ids(query):
        r = api.get(f"/runs{query}", headers=alice.auth)
        assert r.status_code == 200, r.json()
        return [run["id"] for run in r.json()["items"]]

    assert ids("") == [other, running, done]  # newest first
    assert ids("?status=completed") == [done]
    assert ids("?outcome=no_solution") == [done]
    assert ids("?status=running&algorithm=tests.api.echo") == [running]
    assert ids("?limit=1&offset=1") == [running]
    started = RunRecord.objects.get(pk=running).started_at.isoformat()
    assert ids(f"?created_before={started.replace('+00:00', 'Z')}") == [done]
    assert ids(f"?created_after={started.replace('+00:00', 'Z')}") == [other, running]
    page = api.get("/runs?limit=2", headers=alice.auth).json()
    assert page["count"] == 3 and page["limit"] == 2 and page["offset"] == 0


# -- bad input: 4xx naming the field and the reason, and no run ------------------------------


@pytest.mark.parametrize(
    "body,loc,words",
    [
        ({"algorithm": "tests.api.nope", "input": {}}, ["body", "algorithm"], "no algorithm"),
        ({"algorithm": "tests.api.echo", "input": {"text": ""}}, ["body", "input", "text"], "at least 1"),
        ({"algorithm": "tests.api.echo", "input": {"txt": "x"}}, ["body", "input", "text"], "required"),
        (
            {"algorithm": "tests.api.echo", "input": {"text": "x"}, "budget": {"tokens": -1}},
            ["body", "payload", "budget", "tokens"],
            "greater than or equal",
        ),
        (
            {"algorithm": "tests.api.echo", "input": {"text": "x"}, "budget": {"token": 5}},
            ["body", "payload", "budget", "token"],
            "not permitted",
        ),
        (
            {"algorithm": "tests.api.echo", "input": {"text": "x"}, "deadline": -5},
            ["body", "payload", "deadline"],
            "greater than 0",
        ),
        (
            {"algorithm": "tests.api.echo", "input": {"text": "x"}, "deadline": "2001-01-01T00:00:00Z"},
            ["body", "payload", "deadline"],
            "in the past",
        ),
        (
            {"algorithm": "tests.api.echo", "input": {"text": "x"}, "deadline": "2031-01-01T00:00:00"},
            ["body", "payload", "deadline"],
            "timezone",
        ),
        ({"algorithm": "tests.api.gated", "config": {"calls": 9}}, ["body", "config", "calls"], "less than or equal"),
        ({"input": {"text": "x"}}, ["body", "payload", "algorithm"], "required"),
        # a config names only an agent of AAA["AGENTS"]: never a module to import
        (
            {"algorithm": "aaa.algos.PydanticAIAgent", "config": {"agent": "this:agent"}, "input": {"task": "x"}},
            ["body", "config", "agent"],
            "not an agent this site serves",
        ),
        (
            {"algorithm": "aaa.algos.ToolLoop", "config": {"output": "this:Zen"}, "input": {"task": "x"}},
            ["body", "config", "output"],
            "its module is not loaded",
        ),
    ],
)
def test_bad_input_is_422_and_creates_no_run(api, alice, body, loc, words):
    r = api.post("/runs", json=body, headers=alice.auth)
    assert r.status_code == 422, r.json()
    errors = r.json()["detail"]
    assert any(e["loc"] == loc and words in e["msg"] for e in errors), errors
    assert RunRecord.objects.count() == 0
    assert DjangoEventStore().streams_sync() == []


@pytest.mark.parametrize(
    "body,headers,status,loc",
    [
        (b'{"algorithm": ', {"Content-Type": "application/json"}, 400, ["body"]),
        (b'{"algorithm": NaN}', {"Content-Type": "application/json"}, 400, ["body"]),
        (b'{"deadline": 1e999}', {"Content-Type": "application/json"}, 400, ["body"]),
        (b'"\\ud800"', {"Content-Type": "application/json"}, 400, ["body"]),
        (b"\xff\xfe", {"Content-Type": "application/json"}, 400, ["body"]),
        # too_deep: Python 3.11's and 3.12's json stop at their recursion limit (the body as a
        # whole); 3.13's parses it, and the iterative check names where (its first element)
        (
            b"[" * 5000 + b"]" * 5000,
            {"Content-Type": "application/json"},
            422,
            ["body"] if sys.version_info < (3, 13) else ["body", 0],
        ),
        (b"algorithm=x", {"Content-Type": "application/x-www-form-urlencoded"}, 415, ["header", "Content-Type"]),
        (b'{"algorithm": "tests.api.echo"}', {}, 415, ["header", "Content-Type"]),
        (b"[]", {"Content-Type": "application/json"}, 422, ["body", "payload"]),
    ],
)
def test_malformed_bodies_are_4xx_naming_the_field(api, alice, body, headers, status, loc):
    r = api.post("/runs", body, headers={**alice.auth, **headers})
    assert r.status_code == status, r.json()
    assert r.json()["detail"][0]["loc"] == loc
    assert r.json()["detail"][0]["msg"]


def test_a_body_over_the_limit_is_413(api, alice, settings):
    settings.AAA = {**settings.AAA, "API_MAX_BODY": 1000}
    body = json.dumps({"algorithm": "tests.api.echo", "input": {"text": "x" * 2000}})
    r = api.post("/runs", body, headers={**alice.auth, "Content-Type": "application/json"})
    assert r.status_code == 413
    assert r.json()["detail"][0]["loc"] == ["body"]
    declared = api.post(
        "/runs", "{}", headers={**alice.auth, "Content-Type": "application/json", "Content-Length": "5000"}
    )
    assert declared.status_code == 413


def test_bad_path_and_query_parameters_are_422(api, alice, make_run):
    run_id = make_run(alice)
    r = api.get(f"/runs/{run_id}/events?after=-1", headers=alice.auth)
    assert r.status_code == 422 and r.json()["detail"][0]["loc"] == ["query", "after"]
    r = api.get("/runs?status=sleeping", headers=alice.auth)
    assert r.status_code == 422 and r.json()["detail"][0]["loc"] == ["query", "status"]
    r = api.get("/runs/bad%20id", headers=alice.auth)
    assert r.status_code == 422 and r.json()["detail"][0]["loc"] == ["path", "run_id"]


# -- idempotency -------------------------------------------------------------------------


def test_the_same_idempotency_key_and_body_return_the_same_run(api, alice, bob, host):
    body = {"algorithm": "tests.api.echo", "input": {"text": "once"}}
    key = {"Idempotency-Key": "order-42"}
    first = api.post("/runs", json=body, headers={**alice.auth, **key})
    again = api.post("/runs", json=body, headers={**alice.auth, **key})
    assert first.status_code == 201 and again.status_code == 200
    assert again["Idempotent-Replayed"] == "true"
    assert first.json()["id"] == again.json()["id"]
    other = api.post("/runs", json={**body, "input": {"text": "twice"}}, headers={**alice.auth, **key})
    assert other.status_code == 409
    assert other.json()["detail"][0]["loc"] == ["header", "Idempotency-Key"]
    # keys are per caller: bob's "order-42" is another run
    bobs = api.post("/runs", json=body, headers={**bob.auth, **key})
    assert bobs.status_code == 201 and bobs.json()["id"] != first.json()["id"]
    assert RunRecord.objects.count() == 2


# -- cancel ------------------------------------------------------------------------------------


def test_cancel_ends_the_run_cancelled_and_records_who(api, alice, host):
    run = api.post("/runs", json={"algorithm": "tests.api.idle"}, headers=alice.auth).json()
    wait_for(api, run["id"], alice.auth, status="running")
    r = api.post(f"/runs/{run['id']}/cancel", json={"reason": "changed my mind"}, headers=alice.auth)
    assert r.status_code == 202, r.json()
    assert r.json()["cancel_requested"] is True
    done = wait_for(api, run["id"], alice.auth)
    assert done["outcome"] == "cancelled"
    (cancel,) = [e for e in DjangoEventStore().read_sync(run["id"]) if e.type == CANCEL_REQUESTED]
    assert cancel.data["reason"] == "changed my mind"
    assert cancel.data["by"].startswith("alice (user ")
    again = api.post(f"/runs/{run['id']}/cancel", headers=alice.auth)
    assert again.status_code == 409
    assert "ended" in again.json()["detail"][0]["msg"]


def test_cancel_without_a_body_and_with_a_bad_one(api, alice, make_run):
    run_id = make_run(alice, types=[INPUT_VALIDATED, RUN_COMPLETED])
    assert api.post(f"/runs/{run_id}/cancel", headers=alice.auth).status_code == 409
    r = api.post(f"/runs/{run_id}/cancel", json={"reason": 5}, headers=alice.auth)
    assert r.status_code == 422


# -- the host's model client -----------------------------------------------------------------


def test_without_a_model_client_a_model_run_fails_with_a_clear_reason(api, alice, host):
    run = api.post(
        "/runs", json={"algorithm": "aaa.algos.ToolLoop", "input": {"task": "hi"}}, headers=alice.auth
    ).json()
    done = wait_for(api, run["id"], alice.auth)
    assert done["outcome"] == "failed"
    assert "AAA['LLM_CLIENT']" in json.dumps(done["value"])


@pytest.mark.django_db(transaction=True)
def test_the_configured_model_client_answers(api, alice, settings):
    from aaa_django.site.host import EngineHost

    settings.AAA = {**settings.AAA, "LLM_CLIENT": "tests.api.algos.fake_model"}
    EngineHost.reset()
    try:
        run = api.post(
            "/runs", json={"algorithm": "aaa.algos.ToolLoop", "input": {"task": "hi"}}, headers=alice.auth
        ).json()
        done = wait_for(api, run["id"], alice.auth)
    finally:
        EngineHost.reset()
    assert done["outcome"] == "success" and done["value"] == {"text": "scripted answer"}
    assert done["spend"]["model_calls"] == 1 and done["spend"]["tokens"] > 0


def test_a_cost_budget_over_an_unpriced_model_is_422_before_any_run(api, alice, settings, transactional_db):
    from aaa_django.site.host import EngineHost

    llm = {
        "PROVIDER": "openai",
        "BASE_URL": "http://127.0.0.1:9/v1",
        "API_KEY": "sk-none",
        "MODEL": "my-proxy-alias",
        "PRICING": {"gpt-4o-mini": {"input": 0.15, "output": 0.6}},
    }
    settings.AAA = {**settings.AAA, "LLM": llm}
    EngineHost.reset()
    try:
        body = {"algorithm": "aaa.algos.ToolLoop", "input": {"task": "hi"}, "budget": {"cost": 1.0}}
        r = api.post("/runs", json=body, headers=alice.auth)
        assert r.status_code == 422, r.json()
        (problem,) = r.json()["detail"]
        assert problem["loc"] == ["body", "budget", "cost"] and problem["type"] == "unpriced_model"
        assert "'my-proxy-alias' has no price" in problem["msg"]
        assert RunRecord.objects.count() == 0
        # priced (the run's config names the model), or no cost budget: it starts
        priced = {**body, "config": {"model": "gpt-4o-mini"}}
        for ok in (priced, {**body, "budget": {"model_calls": 1}}):
            r = api.post("/runs", json=ok, headers=alice.auth)
            assert r.status_code == 201, r.json()
            api.post(f"/runs/{r.json()['id']}/cancel", headers=alice.auth)
    finally:
        EngineHost.reset()
