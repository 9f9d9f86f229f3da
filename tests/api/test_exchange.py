"""Export, import and fork through the REST API."""

from __future__ import annotations

import json

import pytest
from django.contrib.auth.models import Permission

from aaa_django.runtime.event_types import INPUT_VALIDATED

from .conftest import _user, wait_for, wait_until
from .test_approvals_erase import pending, start_gated

pytestmark = pytest.mark.django_db

JSONL = "application/jsonl"


@pytest.fixture
def dave(db, django_user_model):
    """May import runs (aaa.import_run)."""
    return _user(django_user_model, "dave", "import_run")


def post_export(api, user, body: bytes, ctype=JSONL):
    return api.post("/imports", data=body, headers={**user.auth, "Content-Type": ctype})


def echo(api, user, text="hi"):
    r = api.post("/runs", json={"algorithm": "tests.api.echo", "input": {"text": text}}, headers=user.auth)
    assert r.status_code == 201, r.json()
    return wait_for(api, r.json()["id"], user.auth)


def test_a_run_exported_erased_and_imported_comes_back_with_its_ids(api, alice, dave, host):
    run = echo(api, alice)
    events = api.get(f"/runs/{run['id']}/events", headers=alice.auth).json()["items"]
    r = api.get(f"/runs/{run['id']}/export", headers=alice.auth)
    assert r.status_code == 200 and r["Content-Type"].startswith(JSONL)
    body = r.content
    lines = [json.loads(line) for line in body.splitlines()]
    assert lines[0]["run"] == run["id"] and lines[0]["events"] == len(events)
    assert api.delete(f"/runs/{run['id']}", headers=alice.auth).status_code == 204

    refused = post_export(api, alice, body)
    assert refused.status_code == 403 and "aaa.import_run" in refused.json()["detail"][0]["msg"]
    r = post_export(api, dave, body)

    assert r.status_code == 201, r.json()
    assert r.json()["id"] == run["id"] and r.json()["owner"] == "dave"
    assert r["Location"].endswith(f"/runs/{run['id']}")
    again = api.get(f"/runs/{run['id']}/events", headers=dave.auth).json()["items"]
    assert [(e["id"], e["seq"], e["type"]) for e in again] == [(e["id"], e["seq"], e["type"]) for e in events]
    twice = post_export(api, dave, body)
    assert twice.status_code == 409 and "exists" in twice.json()["detail"][0]["msg"]


def test_a_broken_export_is_refused_with_the_reason(api, alice, dave, host):
    run = echo(api, alice)
    body = api.get(f"/runs/{run['id']}/export", headers=alice.auth).content
    lines = body.decode().splitlines()
    api.delete(f"/runs/{run['id']}", headers=alice.auth)

    def post(text, ctype=JSONL):
        return post_export(api, dave, text.encode(), ctype)

    gap = "\n".join([lines[0], lines[1], lines[3], lines[2]]) + "\n"  # seqs out of order
    short = "\n".join(lines[:-1]) + "\n"
    for text, why in [(gap, "seqs must run"), (short, "truncated"), ("{}\n", "not a run export")]:
        r = post(text)
        assert r.status_code == 422 and why in r.json()["detail"][0]["msg"], r.json()
    assert post("not json\n").status_code == 400
    assert post(body.decode(), "text/plain").status_code == 415
    assert api.get(f"/runs/{run['id']}", headers=dave.auth).status_code == 404  # nothing stored


def test_a_fork_goes_on_with_the_new_config_and_says_where_it_came_from(api, alice, carol, host):
    run_id = start_gated(api, alice)  # one tool call, waiting for an approval
    (gate,) = pending(api, alice, run_id)
    events = api.get(f"/runs/{run_id}/events", headers=alice.auth).json()["items"]
    validated = next(e["seq"] for e in events if e["type"] == INPUT_VALIDATED)

    # carol sees every run; a fork is a new run: she needs the right to start runs too
    body = {"at": validated, "config": {"calls": 2}}
    r = api.post(f"/runs/{run_id}/fork", json=body, headers=carol.auth)
    assert r.status_code == 403 and r.json()["detail"][0]["type"] == "permission_denied"
    carol.user_permissions.add(Permission.objects.get(codename="add_runrecord"))
    # then she may fork alice's; the fork is hers.
    r = api.post(f"/runs/{run_id}/fork", json=body, headers=carol.auth)

    assert r.status_code == 201, r.json()
    fork = r.json()
    assert fork["owner"] == "carol" and fork["forked_from"] == {"run": run_id, "seq": validated}
    assert fork["links"]["fork"].endswith(f"/runs/{fork['id']}/fork")

    def two_gates():
        gates = pending(api, carol, fork["id"])
        return gates if len(gates) == 2 else None

    gates = wait_until(two_gates)
    assert sorted(g["call_id"] for g in gates) == ["c1", "c2"]
    assert len(pending(api, alice, run_id)) == 1  # the new config: two calls; the original: one
    listed = api.get("/runs", params={"algorithm": "tests.api.gated"}, headers=carol.auth).json()
    assert {i["id"]: i["forked_from"] for i in listed["items"]} == {
        run_id: None,
        fork["id"]: {"run": run_id, "seq": validated},
    }
    assert gate in pending(api, alice, run_id)


def test_a_fork_that_cannot_be_made_is_a_4xx(api, alice, bob, host):
    run = echo(api, alice)
    last = run["last_seq"]
    cases = [
        ({"at": last}, 422, "at", "end"),
        ({"at": last + 5}, 422, "at", "has"),
        ({"at": 1, "config": {"calls": 99}}, 422, "config", "does not suit"),
        ({"at": 0}, 422, "at", ""),
        ({"at": 1, "budget": {"tokens": -1}}, 422, "budget", ""),
    ]
    for body, status, field, why in cases:
        r = api.post(f"/runs/{run['id']}/fork", json=body, headers=alice.auth)
        assert r.status_code == status, (body, r.json())
        assert field in r.json()["detail"][0]["loc"] and why in r.json()["detail"][0]["msg"]
    unseen = api.post(f"/runs/{run['id']}/fork", json={"at": 1}, headers=bob.auth)
    assert unseen.status_code == 404
