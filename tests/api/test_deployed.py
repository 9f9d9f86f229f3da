"""The REST API of the example site started as it is deployed (``tests/field/site.py``:
PostgreSQL, gunicorn, S3 for blobs, the in-process bus, the site's scripted model and
tools), driven from outside as its users drive it:

- a client generated from the checked-in schema (openapi-python-client, in a subprocess,
  into a temporary directory) calls every operation of the schema, the import both as JSON
  and as JSON Lines, and the schema the site serves is the checked-in file;
- 50 runs watched over one change stream under the site's default limits: every run's
  changes in order, none twice, each run's end once, and not one 429;
- a change stream resumed with ``Last-Event-ID`` repeats nothing and misses nothing: what
  it sends is what changed after the id, as the database orders it;
- a user never sees another user's runs, in a stream or in a batch read.

On PostgreSQL the change stream is woken by the database's notifications and sends a
change only once every transaction before it has ended (``aaa_django.store.changes``).
"""

from __future__ import annotations

import importlib
import io
import json
import os
import subprocess
import sys
import time
from datetime import datetime, timezone
from typing import Any

import pytest

from aaa_django.api import openapi
from aaa_django.store import changes

from ..conftest import require_service
from ..field.site import Site
from .sse import Live, Message, messages

pytestmark = [pytest.mark.slow]

TASK = "How many people live in Lyon and Porto?"
#: the example site's scripted model: two lookups, then a publication that waits for an
#: approval (project/api_demo.py)
CALLS_BEFORE_THE_GATE = 3


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    endpoint = os.environ.get("AAA_TEST_S3_ENDPOINT", "")
    require_service("s3", bool(endpoint))
    with Site(tmp_path_factory.mktemp("site"), endpoint) as s:
        s.other_key = s.manage(
            "shell",
            "-c",
            (
                "from django.contrib.auth.models import Permission, User\n"
                "from aaa_django.models import ApiKey\n"
                "u = User.objects.create_user('other', password='other-pass-1')\n"
                "u.user_permissions.add(Permission.objects.get(codename='add_runrecord'))\n"
                "print(ApiKey.create_key(u, name='other')[1])\n"
            ),
        ).split()[-1]
        s.base = f"http://127.0.0.1:{s.web_port}"
        yield s


def bearer(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


def position(m: Message) -> tuple[int, str]:
    return changes.parse(m.id or "")


def read_until(stream: Live, done, got: list[Message]) -> list[Message]:
    """Messages into ``got`` until ``done(got)``."""
    while not done(got):
        m = stream.next()
        assert m is not None, "the stream closed"
        got.append(m)
    return got


def at_the_gate(data: dict) -> bool:
    """The run has asked for its publication (it waits for an approval), or has ended."""
    return data["status"] == "completed" or data["spend"]["tool_calls"] >= CALLS_BEFORE_THE_GATE


def latest(got: list[Message]) -> dict[str, dict]:
    return {m.data["id"]: m.data for m in got}


def pending_gate(site: Site, run_id: str) -> dict:
    """The run's pending approval, once it has appended it (just after its tool request)."""
    end = time.monotonic() + 60
    while True:
        gates = [g for g in site.client.call("GET", f"/runs/{run_id}/approvals")[1] if g["status"] == "pending"]
        if gates:
            return gates[0]
        assert time.monotonic() < end, f"run {run_id} asked for no approval"
        time.sleep(0.1)


# -- a generated client, every operation ---------------------------------------------------------


#: openapi-python-client 0.29.1 types an operation's body ``... | Unset`` when it takes two
#: media types (POST /imports: JSON and JSON Lines) without importing ``Unset`` there; this
#: hook (run in the generated package) adds the import where a module lacks it
IMPORT_UNSET = """
import pathlib, re
for f in pathlib.Path(".").rglob("*.py"):
    text = f.read_text()
    if re.search(r"\\bUnset\\b", text) and not re.search(r"import .*\\bUnset\\b", text):
        f.write_text(text.replace("from ...types import Response, UNSET",
                                  "from ...types import Response, UNSET, Unset", 1))
"""


@pytest.fixture(scope="module")
def generated(tmp_path_factory):
    """The client openapi-python-client generates from the checked-in schema, imported."""
    out = tmp_path_factory.mktemp("client")
    hook = out / "import_unset.py"
    hook.write_text(IMPORT_UNSET)
    config = out / "config.json"
    config.write_text(
        json.dumps(
            {
                "project_name_override": "aaa_client",
                "package_name_override": "aaa_client",
                # JSON Lines is sent as bytes (the generator knows JSON, forms and bytes)
                "content_type_overrides": {"application/jsonl": "application/octet-stream"},
                "post_hooks": [f"{sys.executable} {hook}"],
            }
        )
    )
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "openapi_python_client",
            "generate",
            "--path",
            str(openapi.FILE),
            "--meta",
            "none",
            "--output-path",
            str(out / "aaa_client"),
            "--config",
            str(config),
        ],
        cwd=out,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "Warning" not in done.stdout + done.stderr, done.stdout + done.stderr  # nothing left out
    sys.path.insert(0, str(out))
    try:
        yield importlib.import_module("aaa_client")
    finally:
        sys.path.remove(str(out))
        for name in [n for n in sys.modules if n == "aaa_client" or n.startswith("aaa_client.")]:
            del sys.modules[name]


class Calls:
    """The generated client's operations, each call recorded by its operation id."""

    def __init__(self, client: Any) -> None:
        self.client = client
        self.made: list[tuple[str, int]] = []

    def __call__(self, group: str, operation: str, **kwargs: Any) -> Any:
        module = importlib.import_module(f"aaa_client.api.{group}.{operation}")
        r = module.sync_detailed(client=self.client, **kwargs)
        self.made.append((operation, int(r.status_code)))
        return r


def test_a_generated_client_drives_every_operation(site, generated):
    from aaa_client import AuthenticatedClient
    from aaa_client import models as m
    from aaa_client.types import File

    # the schema the site serves is the checked-in file
    status, served = site.client.call("GET", "/openapi.json")
    assert status == 200
    assert openapi.served_part(served, "/api/aaa") == openapi.served_part(openapi.checked_in(), "")

    call = Calls(AuthenticatedClient(base_url=f"{site.base}/api/aaa", token=site.key, timeout=60))
    r = call(
        "runs",
        "start_run",
        idempotency_key="client-run-1",
        body=m.StartIn.from_dict(
            {"algorithm": "aaa.algos.ToolLoop", "input": {"task": TASK}, "budget": {"model_calls": 10}, "deadline": 300}
        ),
    )
    assert r.status_code == 201, r.content
    run_id = r.parsed.id

    # the run goes to its approval gate: follow it on the change stream
    stream = Live(site.base, f"/api/aaa/changes?ids={run_id}", bearer(site.key))
    read_until(stream, lambda got: got and at_the_gate(got[-1].data), [])
    stream.close()
    pending_gate(site, run_id)
    [gate] = [a for a in call("approvals", "list_approvals", run_id=run_id).parsed if a.status.value == "pending"]
    r = call(
        "approvals",
        "decide_approval",
        run_id=run_id,
        request_id=gate.request_id,
        body=m.DecisionIn.from_dict({"decision": "grant", "reason": "checked"}),
    )
    assert r.status_code == 200 and r.parsed.decision.value == "granted"

    events = messages(call("events", "stream_events", run_id=run_id).content)  # to its end
    assert events[-1].data["type"] == "aaa.run.completed"
    run = call("runs", "get_run", run_id=run_id).parsed
    assert (run.status.value, run.outcome.value) == ("completed", "success")
    assert "Lyon and Porto have 754,050 inhabitants" in run.value["text"]
    assert run_id in [i.id for i in call("runs", "list_runs", algorithm="aaa.algos.ToolLoop").parsed.items]
    batch = call("runs", "get_runs", body=m.BatchIn.from_dict({"ids": [run_id, "run-nope"]})).parsed
    assert [i.id for i in batch.items] == [run_id] and batch.missing == ["run-nope"]
    [change] = messages(call("runs", "watch_runs", ids=run_id, follow=False).content)
    assert change.data["id"] == run_id and change.data["status"] == "completed"
    page = call("events", "list_events", run_id=run_id, limit=1000).parsed
    assert [e.seq for e in page.items] == [e.data["seq"] for e in events]
    meta = call("events", "get_projection", run_id=run_id, name="RUNMETA").parsed
    assert meta.seq == run.last_seq

    r = call("exchange", "fork_run", run_id=run_id, body=m.ForkIn.from_dict({"at": 2}))
    assert r.status_code == 201 and r.parsed.forked_from.run == run_id
    r = call("runs", "cancel_run", run_id=r.parsed.id, body=m.CancelIn.from_dict({"reason": "enough"}))
    assert r.status_code == 202

    # a conversation with the chat page's agent (project/chat/model.py: scripted): a message,
    # the question its tool asks, the answer, the reply, the close
    r = call(
        "runs",
        "start_run",
        body=m.StartIn.from_dict(
            {
                "algorithm": "aaa.algos.ToolLoop",
                "input": {"task": "Hello!"},
                "conversation": True,
                "config": {"model": "chat-demo", "tools": ["choose_city", "lookup_population"]},
            }
        ),
    )
    assert r.status_code == 201, r.content
    talk = r.parsed.id
    until_status(call, talk, "waiting")
    r = call(
        "conversations",
        "send_message",
        run_id=talk,
        idempotency_key="client-message-1",
        body=m.MessageIn.from_dict({"content": "How many people live there?"}),
    )
    assert r.status_code == 201 and r.parsed.message.turn == 2, r.content
    question = until(
        lambda: next(
            (q for q in call("conversations", "list_questions", run_id=talk).parsed if q.status == "pending"), None
        )
    )
    assert question.question == "Which city do you mean (for its population)?"
    r = call(
        "conversations",
        "answer_question",
        run_id=talk,
        question_id=question.id,
        body=m.AnswerIn.from_dict({"answer": {"city": "Porto"}}),
    )
    assert r.status_code == 200, r.content
    until_status(call, talk, "waiting")
    said = call("conversations", "list_messages", run_id=talk).parsed
    assert [(i.role, i.turn) for i in said.items] == [("user", 1), ("assistant", 1), ("user", 2), ("assistant", 2)]
    assert said.items[-1].content == "It has 231,800 inhabitants, by the demo's table."
    assert call("conversations", "close_conversation", run_id=talk).status_code == 202
    assert until_status(call, talk, "completed").outcome.value == "success"

    export = call("exchange", "export_run", run_id=run_id).content
    lines = [json.loads(line) for line in export.splitlines()]
    assert call("runs", "erase_run", run_id=run_id).status_code == 204
    r = call("exchange", "import_run", body=File(payload=io.BytesIO(export)))  # JSON Lines
    assert r.status_code == 201, r.content
    assert call("runs", "erase_run", run_id=run_id).status_code == 204
    as_json = {
        "aaa_export": 1,
        "run": run_id,
        "events": [x["event"] for x in lines if "event" in x],
        "blobs": [x for x in lines if "blob" in x],
    }
    r = call("exchange", "import_run", body=m.ImportRunJsonExportIn.from_dict(as_json))
    assert r.status_code == 201, r.content
    assert r.parsed.id == run_id and r.parsed.last_seq == len(events)

    every = {op["operationId"] for item in openapi.checked_in()["paths"].values() for op in item.values()}
    assert {op for op, _ in call.made} == every
    assert [c for c in call.made if c[1] >= 400] == []


def until(check, timeout: float = 60) -> Any:
    end = time.monotonic() + timeout
    while not (found := check()):
        assert time.monotonic() < end, "not in time"
        time.sleep(0.1)
    return found


def until_status(call: Calls, run_id: str, status: str) -> Any:
    """The run (``get_run``) once its status is ``status``."""
    return until(lambda: (run := call("runs", "get_run", run_id=run_id).parsed).status.value == status and run)


# -- the change stream on PostgreSQL ---------------------------------------------------------


def test_50_runs_watched_over_one_stream_every_change_once_and_no_429(site):
    client = site.client
    stream = Live(site.base, "/api/aaa/changes", bearer(site.key))
    assert stream.status == 200
    runs = []
    for i in range(50):
        status, run = client.call(
            "POST", "/runs", {"algorithm": "aaa.algos.ToolLoop", "input": {"task": f"{TASK} ({i})"}}
        )
        assert status == 201, run
        runs.append(run["id"])
    got: list[Message] = []
    read_until(stream, lambda got: all(r in latest(got) and at_the_gate(latest(got)[r]) for r in runs), got)
    for run_id in runs:  # each ends cancelled
        assert client.call("POST", f"/runs/{run_id}/cancel", {"reason": "seen enough"})[0] == 202
    read_until(stream, lambda got: all(latest(got)[r]["status"] == "completed" for r in runs), got)
    stream.close()

    mine = [m for m in got if m.data["id"] in runs]  # (the module's earlier runs come first)
    assert [position(m) for m in got] == sorted(position(m) for m in got)  # in order
    assert len({m.id for m in got}) == len(got)  # no change twice
    for run_id in runs:
        states = [m.data for m in mine if m.data["id"] == run_id]
        assert [s["last_seq"] for s in states] == sorted({s["last_seq"] for s in states})
        spend = [s["spend"]["model_calls"] + s["spend"]["tool_calls"] for s in states]
        assert spend == sorted(spend)
        assert [s["status"] for s in states].count("completed") == 1
        assert (states[-1]["status"], states[-1]["outcome"]) == ("completed", "cancelled")
    status, batch = client.call("POST", "/runs/batch", {"ids": runs})
    assert status == 200 and batch["missing"] == []
    last = latest(got)
    for item in batch["items"]:
        assert {k: item[k] for k in last[item["id"]]} == last[item["id"]]
    assert [a for a in client.answers if a[0] == 429] == []


def test_a_resumed_change_stream_repeats_nothing_and_misses_nothing(site):
    client = site.client
    # this test's runs (the clock the server stamps their start with is this machine's)
    follow = f"/api/aaa/changes?started_after={datetime.now(timezone.utc).isoformat().replace('+00:00', 'Z')}"

    def start() -> str:
        status, run = client.call("POST", "/runs", {"algorithm": "aaa.algos.ToolLoop", "input": {"task": TASK}})
        assert status == 201
        return run["id"]

    a, b, c = start(), start(), start()
    first = Live(site.base, follow, bearer(site.key))
    part1 = read_until(first, lambda got: all(r in latest(got) and at_the_gate(latest(got)[r]) for r in (a, b, c)), [])
    first.close()
    cut = part1[-1].id

    # while nobody listens: a is approved and ends, b is cancelled, d starts
    gate = pending_gate(site, a)
    assert client.call("POST", f"/runs/{a}/approvals/{gate['request_id']}", {"decision": "grant"})[0] == 200
    assert client.call("POST", f"/runs/{b}/cancel")[0] == 202
    d = start()

    second = Live(site.base, follow, {**bearer(site.key), "Last-Event-ID": cut})
    part2 = read_until(
        second,
        lambda got: (
            latest(got).get(a, {}).get("status") == "completed"
            and latest(got).get(b, {}).get("status") == "completed"
            and d in latest(got)
            and at_the_gate(latest(got)[d])
        ),
        [],
    )
    second.close()

    assert all(position(m) > changes.parse(cut) for m in part2)  # nothing repeated
    both = part1 + part2
    assert [position(m) for m in both] == sorted(position(m) for m in both)
    assert c not in latest(part2)  # c did not change after the cut
    assert set(latest(part2)) == {a, b, d}
    # nothing missed: a stream from the cut that ends when caught up finds the same runs,
    # each once, as they are now; and the runs are as it says
    caught_up = messages(_get(site, f"{follow}&follow=false", cut))
    ids = [m.data["id"] for m in caught_up]
    assert sorted(ids) == sorted({a, b, d})  # once each
    status, batch = client.call("POST", "/runs/batch", {"ids": [a, b, c, d]})
    now = {i["id"]: i for i in batch["items"]}
    assert (now[a]["outcome"], now[b]["outcome"]) == ("success", "cancelled")
    for run_id, data in latest(caught_up).items():
        assert {k: now[run_id][k] for k in data} == data
    client.call("POST", f"/runs/{c}/cancel")
    client.call("POST", f"/runs/{d}/cancel")


def test_a_user_never_sees_another_users_runs(site):
    status, run = site.client.call("POST", "/runs", {"algorithm": "aaa.algos.ToolLoop", "input": {"task": TASK}})
    assert status == 201
    everything = messages(_get(site, "/api/aaa/changes?follow=false"))
    assert run["id"] in latest(everything)
    theirs = messages(_get(site, "/api/aaa/changes?follow=false", key=site.other_key))
    named = messages(_get(site, f"/api/aaa/changes?follow=false&ids={run['id']}", key=site.other_key))
    assert theirs == [] and named == []
    ids = list(latest(everything))[:100]
    other = site.client.__class__(site.web_port, site.other_key)
    status, batch = other.call("POST", "/runs/batch", {"ids": ids})
    assert status == 200 and batch == {"items": [], "missing": ids}
    assert other.call("GET", f"/runs/{run['id']}")[0] == 404
    site.client.call("POST", f"/runs/{run['id']}/cancel")


def _get(site: Site, path: str, last_event_id: str | None = None, *, key: str | None = None) -> bytes:
    import http.client

    conn = http.client.HTTPConnection("127.0.0.1", site.web_port, timeout=60)
    headers = bearer(key or site.key)
    if last_event_id is not None:
        headers["Last-Event-ID"] = last_event_id
    conn.request("GET", path, headers=headers)
    r = conn.getresponse()
    body = r.read()
    conn.close()
    assert r.status == 200, body
    return body
