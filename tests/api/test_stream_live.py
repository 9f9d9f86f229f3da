"""The event stream (SSE) against a real HTTP server on loopback.

pytest-django's ``live_server`` runs the test site (with the API under /api/aaa/) in
a thread on a free port; the engine host runs the runs. A client reads part of a
run's stream, drops the connection, lets the run go on, and resumes with
``Last-Event-ID``: what it reads in the two parts is the run's log, exactly once.
"""

from __future__ import annotations

import http.client
import json
from urllib.parse import urlparse

import pytest

from aaa_django.runtime.event_types import (
    APPROVAL_REQUESTED,
    RUN_COMPLETED,
    RUN_STARTED,
    TOOL_COMPLETED,
)

from .conftest import wait_until

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]


class Http:
    def __init__(self, base: str, headers: dict) -> None:
        u = urlparse(base)
        self.host, self.port = u.hostname, u.port
        self.headers = headers

    def connect(self) -> http.client.HTTPConnection:
        return http.client.HTTPConnection(self.host, self.port, timeout=15)

    def json(self, method: str, path: str, body=None) -> tuple[int, dict | None]:
        conn = self.connect()
        headers = dict(self.headers)
        if body is not None:
            headers["Content-Type"] = "application/json"
        conn.request(method, "/api/aaa" + path, body=json.dumps(body) if body is not None else None, headers=headers)
        r = conn.getresponse()
        raw = r.read()
        conn.close()
        return r.status, json.loads(raw) if raw else None

    def stream(self, path: str, last_event_id: int | None = None) -> "Stream":
        conn = self.connect()
        headers = dict(self.headers)
        if last_event_id is not None:
            headers["Last-Event-ID"] = str(last_event_id)
        conn.request("GET", "/api/aaa" + path, headers=headers)
        return Stream(conn, conn.getresponse())


class Stream:
    """Reads SSE messages one at a time: ``(id, event)``; None when the server closes."""

    def __init__(self, conn, response) -> None:
        self.conn, self.response = conn, response
        self.status = response.status
        self.content_type = response.getheader("Content-Type", "")

    def next(self) -> tuple[int, dict] | None:
        fields: dict[str, str] = {}
        while True:
            line = self.response.readline()
            if not line:
                return None  # closed
            line = line.decode("utf-8").rstrip("\n")
            if line == "":
                if "data" in fields:
                    return int(fields["id"]), json.loads(fields["data"])
                fields = {}  # a retry: or comment-only block
                continue
            if line.startswith(":"):
                continue
            name, _, value = line.partition(":")
            fields[name] = value[1:] if value.startswith(" ") else value

    def close(self) -> None:
        self.response.close()
        self.conn.close()


def test_a_resumed_stream_loses_and_repeats_nothing(live_server, alice, host):
    client = Http(live_server.url, alice.auth)
    status, run = client.json("POST", "/runs", {"algorithm": "tests.api.gated", "config": {"calls": 2}})
    assert status == 201, run
    run_id = run["id"]

    def gates():
        return [g for g in client.json("GET", f"/runs/{run_id}/approvals")[1] if g["status"] == "pending"]

    first, second = wait_until(lambda: len(gates()) == 2 and gates())

    # Part 1: read up to the first approval request, then drop the connection.
    part1 = client.stream(f"/runs/{run_id}/events/stream")
    assert part1.status == 200 and part1.content_type.startswith("text/event-stream")
    seen: list[tuple[int, dict]] = []
    while not seen or seen[-1][1]["type"] != APPROVAL_REQUESTED:
        message = part1.next()
        assert message is not None, "the stream closed early"
        seen.append(message)
    part1.close()
    cut = seen[-1][0]

    # While nobody listens, the first call is approved and runs.
    assert client.json("POST", f"/runs/{run_id}/approvals/{first['request_id']}", {"decision": "grant"})[0] == 200
    wait_until(
        lambda: client.json("GET", f"/runs/{run_id}/events?after={cut}")[1]["items"][-1]["type"] == TOOL_COMPLETED
    )

    # Part 2: resume from the last id seen; the second call is approved while we listen.
    part2 = client.stream(f"/runs/{run_id}/events/stream", last_event_id=cut)
    assert part2.status == 200
    resumed = [part2.next()]
    assert resumed[0][0] == cut + 1
    assert client.json("POST", f"/runs/{run_id}/approvals/{second['request_id']}", {"decision": "grant"})[0] == 200
    while (message := part2.next()) is not None:
        resumed.append(message)
    part2.close()

    log = client.json("GET", f"/runs/{run_id}/events?limit=1000")[1]["items"]
    got = seen + resumed
    assert [i for i, _ in got] == [e["seq"] for e in log] == list(range(1, len(log) + 1))
    assert [e for _, e in got] == log
    assert got[-1][1]["type"] == RUN_COMPLETED and got[-1][1]["data"]["outcome"] == "success"

    # The run has ended and nothing is left: 204 tells EventSource to stop reconnecting.
    done = client.stream(f"/runs/{run_id}/events/stream", last_event_id=got[-1][0])
    assert done.status == 204
    done.close()
    # From the start, a finished run's stream is its whole log, then the end.
    replay = client.stream(f"/runs/{run_id}/events/stream")
    again = []
    while (message := replay.next()) is not None:
        again.append(message)
    replay.close()
    assert again == got


def test_the_stream_of_another_owners_run_is_404_on_a_real_server(live_server, alice, bob, host):
    status, run = Http(live_server.url, alice.auth).json("POST", "/runs", {"algorithm": "tests.api.idle"})
    assert status == 201
    other = Http(live_server.url, bob.auth).stream(f"/runs/{run['id']}/events/stream")
    assert other.status == 404
    assert json.loads(other.response.read())["detail"][0]["loc"] == ["path", "run_id"]
    other.close()
    anonymous = Http(live_server.url, {}).stream(f"/runs/{run['id']}/events/stream")
    assert anonymous.status == 401
    anonymous.close()
    Http(live_server.url, alice.auth).json("POST", f"/runs/{run['id']}/cancel")


def test_a_user_holds_at_most_the_cap_of_open_streams(live_server, alice, bob, host, settings, monkeypatch):
    """AAA["API_STREAMS_PER_USER"]: past it, 429 for that user (another user streams
    on); a stream that ends gives its slot back; one that died uncleaned frees it when
    its lease runs out."""
    from django.core.cache import cache

    from aaa_django.api import streamcap

    slots = [f"aaa:streams:{alice.pk}:{i}" for i in range(2)]
    settings.AAA = {**settings.AAA, "API_STREAMS_PER_USER": 2}
    a = Http(live_server.url, alice.auth)
    _, run = a.json("POST", "/runs", {"algorithm": "tests.api.idle"})
    path = f"/runs/{run['id']}/events/stream"
    first, second = a.stream(path), a.stream(path)
    assert (first.status, second.status) == (200, 200)
    assert first.next()[1]["type"] == RUN_STARTED  # both are really open
    assert second.next()[1]["type"] == RUN_STARTED
    third = a.stream(path)
    assert third.status == 429
    body = json.loads(third.response.read())
    assert body["detail"][0]["type"] == "too_many_streams" and third.response.getheader("Retry-After")
    _, bob_run = Http(live_server.url, bob.auth).json("POST", "/runs", {"algorithm": "tests.api.idle"})
    other = Http(live_server.url, bob.auth).stream(f"/runs/{bob_run['id']}/events/stream")
    assert other.status == 200
    # the run ends: the streams end and give their slots back
    assert a.json("POST", f"/runs/{run['id']}/cancel")[0] == 202
    for s in (first, second):
        while s.next() is not None:
            pass
    wait_until(lambda: all(cache.get(key) is None for key in slots))
    # two slots held by streams that died without cleanup: free once their lease ends
    monkeypatch.setattr(streamcap, "LEASE", 1)
    for key in slots:
        cache.set(key, "a dead stream's token", streamcap.LEASE)
    assert streamcap.acquire(alice.pk, 2) is None
    wait_until(lambda: streamcap.acquire(alice.pk, 2))
    Http(live_server.url, bob.auth).json("POST", f"/runs/{bob_run['id']}/cancel")
    other.conn.close()
