"""The change stream under a real ASGI server (uvicorn) on PostgreSQL: an async iterator on
the server's event loop, woken by the database's notifications of any run's append. One
user's stream follows 20 runs from their start to their end (a cancel each), every change
once, in order; another user's stream on the same server sees none of them.

The server is ``tests/asgi_site.py`` (the example site's ``asgi.py`` on the test
settings, the pytest process's PostgreSQL test database: see test_stream_asgi.py).
"""

from __future__ import annotations

import pytest

from aaa_django.store import changes

from .sse import Live, Message
from .test_stream_asgi import asgi_server, user  # noqa: F401  (asgi_server: the fixture)
from .test_stream_live import Http

pytestmark = [pytest.mark.django_db(transaction=True, databases=["default", "postgres"]), pytest.mark.slow]

RUNS = 20


def test_a_change_stream_under_asgi_follows_many_runs_to_their_end(asgi_server, pg_alias):  # noqa: F811
    url, proc = asgi_server
    alice_auth, bob_auth = user(pg_alias, "alice"), user(pg_alias, "bob")
    alice = Http(url, alice_auth)
    watching = Live(url, "/api/aaa/changes", alice_auth)
    others = Live(url, "/api/aaa/changes", bob_auth)
    assert (watching.status, others.status) == (200, 200)

    runs = []
    for _ in range(RUNS):
        status, run = alice.json("POST", "/runs", {"algorithm": "tests.api.idle"})
        assert status == 201, run
        runs.append(run["id"])
    got: list[Message] = []

    def states() -> dict[str, dict]:
        return {m.data["id"]: m.data for m in got}

    while not all(r in states() and states()[r]["status"] == "running" for r in runs):
        got.append(watching.next())
    for run_id in runs:
        assert alice.json("POST", f"/runs/{run_id}/cancel")[0] == 202
    while not all(states()[r]["status"] == "completed" for r in runs):
        m = watching.next()
        assert m is not None, "the stream closed"
        got.append(m)
    watching.close()

    assert set(states()) == set(runs)
    positions = [changes.parse(m.id or "") for m in got]
    assert positions == sorted(positions) and len(set(positions)) == len(positions)
    for run_id in runs:
        mine = [m.data["status"] for m in got if m.data["id"] == run_id]
        assert mine.count("completed") == 1 and mine[-1] == "completed"
        assert states()[run_id]["outcome"] == "cancelled"
    # bob's stream heard every append and sent nothing: its first message is his own run
    status, his = Http(url, bob_auth).json("POST", "/runs", {"algorithm": "tests.api.idle"})
    assert status == 201
    first = others.next()
    assert first is not None and first.data["id"] == his["id"]
    Http(url, bob_auth).json("POST", f"/runs/{his['id']}/cancel")
    others.close()
    assert proc.poll() is None
