"""What a response says holds together, and what a request names is checked before it is
used: a run's status and value agree; a config names an agent by the site's list before
anything is looked up; an import keeps to its own run's blobs."""

from __future__ import annotations

import base64
import json

import pytest
from django.test import RequestFactory

from aaa_django.api import runs
from aaa_django.data import BlobRef
from aaa_django.data.claims import STREAM_KEY, canonical_json
from aaa_django.events import Event
from aaa_django.models import RunRecord
from aaa_django.runtime import dotted
from aaa_django.runtime.event_types import INPUT_VALIDATED, RUN_COMPLETED, completion_id
from aaa_django.store import DjangoEventStore

from .test_exchange import dave, echo, post_export  # noqa: F401  (dave: the fixture)

pytestmark = pytest.mark.django_db

AGENT = "tests.pydantic_ai.agents.planner"


# -- a run's status and its value ------------------------------------------------------------


def test_a_row_read_before_the_run_ended_does_not_answer_running_with_its_value(alice, make_run):
    """The race of POST /runs: the row is read, the run ends, the value is read. The answer
    is the run as it ended, never "running" with the value that ended it."""
    run_id = make_run(alice)  # started, input validated: running
    row = RunRecord.objects.get(pk=run_id)
    assert row.status == "running"
    DjangoEventStore("default").append_sync(
        [
            Event(  # it ends (the store indexes it)
                id=completion_id(run_id),
                stream=run_id,
                type=RUN_COMPLETED,
                data={"outcome": "failed", "value": {"error": "the model is away"}},
            )
        ]
    )

    out = runs.run_detail(RequestFactory().get(f"/api/aaa/runs/{run_id}"), row)

    assert (out["status"], out["outcome"]) == ("completed", "failed")
    assert out["value"] == {"error": "the model is away"} and out["ended_at"] is not None


def test_every_answer_about_a_run_that_ended_at_once_agrees(api, alice, host):
    """A run that ends as soon as it starts: each answer's status and value agree."""
    for text in ("one", "two", "three"):
        r = api.post("/runs", json={"algorithm": "tests.api.echo", "input": {"text": text}}, headers=alice.auth)
        assert r.status_code == 201
        for run in (r.json(), api.get(f"/runs/{r.json()['id']}", headers=alice.auth).json()):
            assert (run["value"] is not None) == (run["status"] == "completed"), run
            assert (run["outcome"] is not None) == (run["status"] == "completed"), run


# -- config.agent --------------------------------------------------------------------------


def start(api, user, config, input=None):
    return api.post(
        "/runs",
        json={
            "algorithm": "aaa.algos.PydanticAIAgent",
            "config": config,
            "input": input if input is not None else {"task": "x"},
        },
        headers=user.auth,
    )


@pytest.fixture
def served(settings):
    settings.AAA = {**settings.AAA, "AGENTS": [AGENT]}


@pytest.fixture
def lookups(monkeypatch):
    """Every dotted path looked up in the process's modules."""
    seen: list[str] = []
    real = dotted.loaded
    monkeypatch.setattr(dotted, "loaded", lambda path: seen.append(path) or real(path))
    return seen


@pytest.mark.parametrize(
    "agent", ["os.system", "os:system", "tests.pydantic_ai.agents.weather", "no.such.module:agent", "agent", 7, None]
)
def test_an_agent_the_site_does_not_serve_is_refused_by_name_and_nothing_is_looked_up(
    api, alice, served, lookups, agent
):
    r = start(api, alice, {"agent": agent})

    assert r.status_code == 422
    [error] = r.json()["detail"]
    assert error == {
        "loc": ["body", "config", "agent"],
        "type": "unknown_agent",
        "msg": f"not an agent this site serves; it serves: {AGENT}",
    }
    assert lookups == []
    assert RunRecord.objects.count() == 0


def test_a_site_that_serves_no_agent_says_so(api, alice, lookups):
    r = start(api, alice, {"agent": "os.system"})
    assert r.status_code == 422
    assert "none (AAA['AGENTS'] is empty)" in r.json()["detail"][0]["msg"]
    assert "builtin" not in r.text and lookups == []


def test_an_agent_named_in_a_workflows_child_node_is_checked_too(api, alice, served, lookups):
    node = {
        "id": "a",
        "kind": "child",
        "prompt": "{task}",
        "algorithm": {"algorithm": "aaa.algos.PydanticAIAgent", "config": {"agent": "os.system"}},
    }
    r = api.post(
        "/runs",
        json={"algorithm": "aaa.algos.WorkflowGraph", "input": {"task": "x"}, "config": {"nodes": [node]}},
        headers=alice.auth,
    )
    assert r.status_code == 422
    [error] = r.json()["detail"]
    assert error["loc"] == ["body", "config", "nodes", 0, "algorithm", "config", "agent"]
    assert error["type"] == "unknown_agent" and lookups == []


def test_a_served_agent_passes_by_either_spelling_of_its_path(api, alice, served, lookups):
    import tests.pydantic_ai.agents  # noqa: F401  (the site loads its AGENTS at start-up)

    for spelling in (AGENT, "tests.pydantic_ai.agents:planner"):
        r = start(api, alice, {"agent": spelling}, input={})  # a bad input: nothing starts
        assert r.status_code == 422
        assert [e["loc"] for e in r.json()["detail"]] == [["body", "input", "task"]], r.json()
    assert lookups  # past the check, the algorithm's own found the agent


# -- an import's blobs -----------------------------------------------------------------------


def export_with_blob(run_id: str, ref: BlobRef, data: bytes) -> bytes:
    """A two-event export whose input event refers to a blob with ``ref``."""
    lines = [
        {"aaa_export": 1, "run": run_id, "events": 3, "blobs": "inline"},
        {
            "event": {
                "id": f"{run_id}-1",
                "stream": run_id,
                "seq": 1,
                "type": "aaa.run.started",
                "data": {"algorithm": "tests.api.echo", "config": {}, "input": {"text": "hi"}},
                "causation": None,
                "time": "2030-01-01T00:00:00+00:00",
                "blobs": [],
            }
        },
        {
            "event": {
                "id": f"{run_id}-2",
                "stream": run_id,
                "seq": 2,
                "type": INPUT_VALIDATED,
                "data": {"$claim": True},
                "causation": None,
                "time": "2030-01-01T00:00:01+00:00",
                "blobs": [ref.to_dict()],
            }
        },
        {"blob": ref.to_dict(), "base64": base64.b64encode(data).decode()},
        {
            "event": {
                "id": completion_id(run_id),
                "stream": run_id,
                "seq": 3,
                "type": RUN_COMPLETED,
                "data": {"outcome": "success", "value": None},
                "causation": None,
                "time": "2030-01-01T00:00:02+00:00",
                "blobs": [],
            }
        },
    ]
    return "".join(json.dumps(line) + "\n" for line in lines).encode()


@pytest.fixture
def blob_store(settings, tmp_path):
    """Blobs in files under the test's directory (a store with namespaces)."""
    settings.STORAGES = {
        **settings.STORAGES,
        "blobs": {"BACKEND": "django.core.files.storage.FileSystemStorage", "OPTIONS": {"location": str(tmp_path)}},
    }
    settings.AAA = {**settings.AAA, "BLOB_STORAGE": "blobs"}


def test_an_import_refuses_a_blob_of_another_runs_namespace(api, dave, blob_store):  # noqa: F811
    payload = canonical_json({"text": "another run's payload"})
    theirs = BlobRef.for_bytes(payload, "application/json", namespace="run-theirs")
    r = post_export(api, dave, export_with_blob("run-mine", theirs, payload))

    assert r.status_code == 422
    [error] = r.json()["detail"]
    assert error["loc"] == ["body"] and error["type"] == "invalid_export"
    assert f"run-theirs/{theirs.sha256}" in error["msg"] and "run-mine" in error["msg"]
    assert not RunRecord.objects.filter(pk="run-mine").exists()


def test_an_import_refuses_a_blob_without_namespace_that_is_not_its_runs(api, dave, blob_store):  # noqa: F811
    payload = canonical_json({STREAM_KEY: "run-theirs", "data": {"text": "theirs"}})
    ref = BlobRef.for_bytes(payload, "application/json")
    r = post_export(api, dave, export_with_blob("run-mine", ref, payload))
    assert r.status_code == 422
    assert ref.sha256 in r.json()["detail"][0]["msg"]
    assert not RunRecord.objects.filter(pk="run-mine").exists()


def test_an_import_takes_the_blobs_of_its_own_run(api, dave, blob_store):  # noqa: F811
    payload = canonical_json({"text": "the run's own payload"})
    ref = BlobRef.for_bytes(payload, "application/json", namespace="run-mine")
    r = post_export(api, dave, export_with_blob("run-mine", ref, payload))
    assert r.status_code == 201, r.json()
    assert r.json()["id"] == "run-mine"
