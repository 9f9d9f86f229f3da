"""Approval gates, projections and erasing, through the REST API and the engine host."""

from __future__ import annotations

import pytest

from aaa_django.models import RunRecord
from aaa_django.runtime.event_types import APPROVAL_DENIED, INPUT_VALIDATED, RUN_COMPLETED
from aaa_django.store import DjangoEventStore

from .conftest import wait_for, wait_until

pytestmark = pytest.mark.django_db


def start_gated(api, user, **config):
    body = {"algorithm": "tests.api.gated", "config": config} if config else {"algorithm": "tests.api.gated"}
    r = api.post("/runs", json=body, headers=user.auth)
    assert r.status_code == 201, r.json()
    return r.json()["id"]


def pending(api, user, run_id):
    def check():
        gates = api.get(f"/runs/{run_id}/approvals", headers=user.auth).json()
        return [g for g in gates if g["status"] == "pending"]

    return wait_until(check)


def test_a_granted_approval_runs_the_tool_and_records_who(api, alice, host):
    run_id = start_gated(api, alice)
    (gate,) = pending(api, alice, run_id)
    assert gate["tool"] == "guarded" and gate["args"] == {"x": 1} and gate["call_id"] == "c1"
    r = api.post(
        f"/runs/{run_id}/approvals/{gate['request_id']}",
        json={"decision": "grant", "reason": "looks fine"},
        headers=alice.auth,
    )
    assert r.status_code == 200, r.json()
    assert r.json()["decision"] == "granted"
    assert r.json()["by"].startswith("alice (user ")
    done = wait_for(api, run_id, alice.auth)
    assert done["outcome"] == "success"
    assert done["spend"]["tool_calls"] == 1
    (decided,) = api.get(f"/runs/{run_id}/approvals", headers=alice.auth).json()
    assert decided["status"] == "granted"
    assert decided["reason"] == "looks fine" and decided["decided_by"] == r.json()["by"]
    again = api.post(f"/runs/{run_id}/approvals/{gate['request_id']}", json={"decision": "deny"}, headers=alice.auth)
    assert again.status_code == 409
    assert again.json()["detail"][0]["loc"] == ["path", "request_id"]


def test_a_denied_approval_fails_the_tool_call(api, alice, bob, django_user_model, host):
    from django.contrib.auth.models import Permission

    bob.user_permissions.add(*Permission.objects.filter(codename__in=["view_all_runs", "approve_run"]))
    run_id = start_gated(api, alice)
    (gate,) = pending(api, alice, run_id)
    r = api.post(
        f"/runs/{run_id}/approvals/{gate['request_id']}",
        json={"decision": "deny", "reason": "not today"},
        headers=bob.auth,
    )
    assert r.status_code == 200, r.json()
    assert r.json()["decision"] == "denied" and r.json()["by"].startswith("bob (user ")
    done = wait_for(api, run_id, alice.auth)
    assert done["outcome"] == "no_solution"
    events = DjangoEventStore().read_sync(run_id)
    (denial,) = [e for e in events if e.type == APPROVAL_DENIED]
    assert denial.data["reason"] == "not today"


def test_bad_decisions_are_4xx(api, alice, make_run):
    run_id = make_run(alice)
    r = api.post(f"/runs/{run_id}/approvals/nope", json={"decision": "grant"}, headers=alice.auth)
    assert r.status_code == 404 and r.json()["detail"][0]["loc"] == ["path", "request_id"]
    r = api.post(f"/runs/{run_id}/approvals/nope", json={"decision": "maybe"}, headers=alice.auth)
    assert r.status_code == 422 and r.json()["detail"][0]["loc"] == ["body", "payload", "decision"]


def test_projections_now_and_as_of_an_event(api, alice, make_run):
    run_id = make_run(alice, types=[INPUT_VALIDATED, RUN_COMPLETED])
    now = api.get(f"/runs/{run_id}/projections/RUNMETA", headers=alice.auth)
    assert now.status_code == 200, now.json()
    assert now.json()["name"] == "aaa.runtime.engine.RUNMETA"
    assert now.json()["seq"] == 3 and now.json()["state"]["status"] == "completed"
    then = api.get(f"/runs/{run_id}/projections/aaa.runtime.engine.RUNMETA?at=1", headers=alice.auth)
    assert then.json()["seq"] == 1 and then.json()["state"]["status"] == "pending"
    loop = api.get(f"/runs/{run_id}/projections/LOOP", headers=alice.auth)
    assert loop.status_code == 200 and loop.json()["state"]["turns"] == 0
    unknown = api.get(f"/runs/{run_id}/projections/NOPE", headers=alice.auth)
    assert unknown.status_code == 404 and unknown.json()["detail"][0]["loc"] == ["path", "name"]
    assert "RUNMETA" in unknown.json()["detail"][0]["msg"]
    beyond = api.get(f"/runs/{run_id}/projections/RUNMETA?at=99", headers=alice.auth)
    assert beyond.status_code == 422 and beyond.json()["detail"][0]["loc"] == ["query", "at"]


def test_erase_removes_an_ended_run_and_refuses_a_running_one(api, alice, host):
    run = api.post("/runs", json={"algorithm": "tests.api.idle"}, headers=alice.auth).json()
    wait_for(api, run["id"], alice.auth, status="running")
    r = api.delete(f"/runs/{run['id']}", headers=alice.auth)
    assert r.status_code == 409 and "cancel it" in r.json()["detail"][0]["msg"]
    api.post(f"/runs/{run['id']}/cancel", headers=alice.auth)
    wait_for(api, run["id"], alice.auth)
    r = api.delete(f"/runs/{run['id']}", headers=alice.auth)
    assert r.status_code == 204
    assert DjangoEventStore().read_sync(run["id"]) == []
    assert not RunRecord.objects.filter(pk=run["id"]).exists()
    assert api.get(f"/runs/{run['id']}", headers=alice.auth).status_code == 404


def test_a_gate_of_a_run_that_ended_unanswered_is_closed_not_pending(api, alice, host):
    run_id = start_gated(api, alice)
    (gate,) = pending(api, alice, run_id)
    assert api.post(f"/runs/{run_id}/cancel", headers=alice.auth).status_code == 202
    wait_for(api, run_id, alice.auth)
    (closed,) = api.get(f"/runs/{run_id}/approvals", headers=alice.auth).json()
    assert closed["request_id"] == gate["request_id"]
    assert closed["status"] == "closed"
    assert closed["reason"] == "the run ended (cancelled) before an answer"
    assert closed["decided_by"] is None
    r = api.post(f"/runs/{run_id}/approvals/{gate['request_id']}", json={"decision": "grant"}, headers=alice.auth)
    assert r.status_code == 409
    assert r.json()["detail"][0]["msg"] == ("this approval is closed: the run ended (cancelled) before an answer")
