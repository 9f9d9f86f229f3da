"""Who may call the API, and what a caller may see and do: the security tests."""

from __future__ import annotations

import pytest
from django.test import Client

from aaa_django.models import ApiKey
from aaa_django.runtime.event_types import (
    APPROVAL_REQUESTED,
    INPUT_VALIDATED,
    RUN_COMPLETED,
    TOOL_REQUESTED,
)

pytestmark = pytest.mark.django_db


def detail(r) -> dict:
    (item,) = r.json()["detail"]
    return item


def test_no_key_is_401_naming_the_header(api):
    r = api.get("/runs")
    assert r.status_code == 401
    assert detail(r)["loc"] == ["header", "Authorization"]
    assert "no credentials" in detail(r)["msg"]


def test_a_key_works_as_bearer_and_as_x_api_key(api, alice):
    assert api.get("/runs", headers={"Authorization": f"Bearer {alice.key}"}).status_code == 200
    assert api.get("/runs", headers={"X-API-Key": alice.key}).status_code == 200


@pytest.mark.parametrize(
    "header,value,why",
    [
        ("Authorization", "Bearer aaa_not-a-real-key", "unknown API key"),
        ("Authorization", "Basic YWxpY2U6cHc=", "Bearer"),
        ("Authorization", "Bearer " + "x" * 500, "not an API key"),
        ("X-API-Key", "aaa_nope", "unknown API key"),
    ],
)
def test_a_bad_credential_is_401_naming_the_reason(api, alice, header, value, why):
    r = api.get("/runs", headers={header: value})
    assert r.status_code == 401
    assert detail(r)["loc"] == ["header", header]
    assert why in detail(r)["msg"]


def test_a_revoked_key_is_401(api, alice, make_run):
    run_id = make_run(alice)
    assert api.get(f"/runs/{run_id}", headers=alice.auth).status_code == 200
    ApiKey.objects.get(user=alice).revoke()
    r = api.get(f"/runs/{run_id}", headers=alice.auth)
    assert r.status_code == 401
    assert "revoked" in detail(r)["msg"]


def test_an_expired_key_and_an_inactive_user_are_401(api, alice, bob):
    from django.utils import timezone

    ApiKey.objects.filter(user=alice).update(expires_at=timezone.now())
    assert "expired" in detail(api.get("/runs", headers=alice.auth))["msg"]
    bob.is_active = False
    bob.save()
    assert "inactive" in detail(api.get("/runs", headers=bob.auth))["msg"]


def test_only_the_hash_of_a_key_is_stored(alice):
    stored = ApiKey.objects.get(user=alice)
    assert alice.key not in (stored.hashed, stored.prefix, stored.name)
    assert stored.hashed == ApiKey.hash(alice.key)
    assert alice.key.startswith(stored.prefix) and len(stored.prefix) == 12


def test_another_owners_run_is_404_like_an_unknown_one(api, alice, bob, make_run):
    run_id = make_run(alice)
    for path in ("", "/events", "/approvals", "/projections/RUNMETA"):
        mine = api.get(f"/runs/{run_id}{path}", headers=alice.auth)
        theirs = api.get(f"/runs/{run_id}{path}", headers=bob.auth)
        unknown = api.get(f"/runs/run-nope{path}", headers=bob.auth)
        assert mine.status_code == 200, (path, mine.json())
        assert theirs.status_code == unknown.status_code == 404, path
        assert theirs.json() == unknown.json()
    assert api.post(f"/runs/{run_id}/cancel", headers=bob.auth).status_code == 404
    assert api.delete(f"/runs/{run_id}", headers=bob.auth).status_code == 404
    listed = api.get("/runs", headers=bob.auth).json()
    assert listed["count"] == 0 and listed["items"] == []


def test_the_stream_of_another_owners_run_is_404(api, alice, bob, make_run):
    run_id = make_run(alice, types=[INPUT_VALIDATED, RUN_COMPLETED])
    assert api.get(f"/runs/{run_id}/events/stream", headers=bob.auth).status_code == 404
    r = api.get(f"/runs/{run_id}/events/stream", headers=alice.auth)
    assert r.status_code == 200
    assert r["Content-Type"].startswith("text/event-stream")


def _approval_events():
    """Data of a tool request and the approval gate in front of it (make_run's ``data``)."""
    return {
        TOOL_REQUESTED: {"call_id": "c1", "name": "guarded", "args": {"x": 1}},
        APPROVAL_REQUESTED: {
            "tool_request_id": "will-be-set",
            "tool_request_seq": 3,
            "call_id": "c1",
            "name": "guarded",
            "expires_at": None,
        },
    }


def test_approving_without_the_permission_is_403(api, alice, carol, make_run):
    run_id = make_run(alice, types=[INPUT_VALIDATED, TOOL_REQUESTED, APPROVAL_REQUESTED], data=_approval_events())
    (gate,) = api.get(f"/runs/{run_id}/approvals", headers=carol.auth).json()
    r = api.post(f"/runs/{run_id}/approvals/{gate['request_id']}", json={"decision": "grant"}, headers=carol.auth)
    assert r.status_code == 403
    assert detail(r)["loc"] == ["path", "run_id"]
    assert "aaa.approve_run" in detail(r)["msg"]
    # carol may see it (view_all_runs) but not cancel or erase it either
    assert api.post(f"/runs/{run_id}/cancel", headers=carol.auth).status_code == 403
    assert api.delete(f"/runs/{run_id}", headers=carol.auth).status_code == 403


def test_an_action_permission_acts_on_a_run_by_id_without_seeing_it(api, alice, bob, make_run):
    """aaa_django.access: an eraser need not be able to read what it erases."""
    from django.contrib.auth.models import Permission

    bob.user_permissions.add(Permission.objects.get(codename="erase_run"))
    run_id = make_run(alice)  # still running: erasing it answers 409 once access is granted
    assert api.get(f"/runs/{run_id}", headers=bob.auth).status_code == 404
    assert api.get("/runs", headers=bob.auth).json()["count"] == 0
    assert api.post(f"/runs/{run_id}/cancel", headers=bob.auth).status_code == 404
    r = api.delete(f"/runs/{run_id}", headers=bob.auth)
    assert r.status_code == 409 and detail(r)["type"] == "run_not_ended"


def test_starting_a_run_needs_the_permission_the_admin_asks_too(api, carol, host):
    """aaa.add_runrecord: any active user with a key is not enough to spend the site's
    model budget."""
    from django.contrib.auth.models import Permission

    from aaa_django.models import RunRecord

    body = {"algorithm": "tests.api.echo", "input": {"text": "hi"}}
    r = api.post("/runs", json=body, headers={**carol.auth, "Idempotency-Key": "k1"})
    assert r.status_code == 403
    assert detail(r) == {
        "loc": ["auth"],
        "type": "permission_denied",
        "msg": "you may not start runs (permission aaa.add_runrecord)",
    }
    assert not RunRecord.objects.exists()

    carol.user_permissions.add(Permission.objects.get(codename="add_runrecord"))
    r = api.post("/runs", json=body, headers={**carol.auth, "Idempotency-Key": "k1"})
    assert r.status_code == 201, r.json()


def test_view_all_runs_lists_everyones_runs(api, alice, bob, carol, make_run):
    make_run(alice)
    make_run(bob)
    assert api.get("/runs", headers=carol.auth).json()["count"] == 2
    assert api.get("/runs", headers=alice.auth).json()["count"] == 1


def test_session_auth_works_and_unsafe_methods_need_csrf(alice, make_run):
    run_id = make_run(alice)
    client = Client(enforce_csrf_checks=True)
    client.force_login(alice)
    r = client.get(f"/api/aaa/runs/{run_id}")
    assert r.status_code == 200
    r = client.post(f"/api/aaa/runs/{run_id}/cancel", content_type="application/json")
    assert r.status_code == 403
    assert r.json()["detail"][0]["loc"] == ["header", "X-CSRFToken"]
    anonymous = Client()
    assert anonymous.get(f"/api/aaa/runs/{run_id}").status_code == 401


def test_a_sessions_csrf_check_is_djangos_own(alice):
    """The session's CSRF check is Django's ``CsrfViewMiddleware``: an unsafe request
    passes with the csrftoken cookie's value in ``X-CSRFToken`` and is refused without
    it, and a request Django itself exempts (its test client's, unless told to enforce
    the check) passes. Passing, a cancel of an unknown run is a 404; refused, a 403."""
    from django.conf import settings

    url, secret = "/api/aaa/runs/run-unknown/cancel", "a" * 32
    enforcing = Client(enforce_csrf_checks=True)
    enforcing.force_login(alice)
    enforcing.cookies[settings.CSRF_COOKIE_NAME] = secret
    refused = enforcing.post(url, content_type="application/json")
    assert refused.status_code == 403 and detail(refused)["type"] == "csrf_failed"
    assert enforcing.post(url, content_type="application/json", headers={"X-CSRFToken": secret}).status_code == 404
    assert enforcing.post(url, content_type="application/json", headers={"X-CSRFToken": "b" * 32}).status_code == 403
    exempt = Client()  # Django's test client: its requests skip the check
    exempt.force_login(alice)
    assert exempt.post(url, content_type="application/json").status_code == 404


def test_rate_limit_is_429_with_retry_after(api, alice, settings):
    settings.AAA = {**settings.AAA, "API_RATE": "3/min"}
    codes = [api.get("/runs", headers=alice.auth).status_code for _ in range(4)]
    assert codes == [200, 200, 200, 429]
    r = api.get("/runs", headers=alice.auth)
    assert int(r["Retry-After"]) >= 1
    assert detail(r)["type"] == "throttled"


def test_failed_key_attempts_are_limited_per_client_address(alice, settings):
    """AAA["API_KEY_FAILURES"]: past it, every key attempt from that address is a 429
    (a right key too: a guesser must not tell a hit by its answer); other addresses
    go on."""
    settings.AAA = {**settings.AAA, "API_KEY_FAILURES": "3/min"}
    attacker, neighbour = Client(REMOTE_ADDR="203.0.113.7"), Client(REMOTE_ADDR="203.0.113.8")

    def get(client, key):
        return client.get("/api/aaa/runs", headers={"Authorization": f"Bearer {key}"})

    guesses = [get(attacker, f"aaa_guess{i}").status_code for i in range(4)]
    assert guesses == [401, 401, 401, 429]
    r = get(attacker, alice.key)
    assert r.status_code == 429 and 1 <= int(r["Retry-After"]) <= 60
    assert detail(r)["type"] == "throttled" and "3/min" in detail(r)["msg"]
    assert get(neighbour, alice.key).status_code == 200
    assert get(neighbour, "aaa_wrong").status_code == 401
    # sessions and good keys are never counted: only failures
    settings.AAA = {**settings.AAA, "API_KEY_FAILURES": None}
    assert get(attacker, alice.key).status_code == 200
