"""Event streams under a real ASGI server (uvicorn) on PostgreSQL: one user's 150
streams open at once while another user's requests keep answering, and the server's
database connections stay bounded.

The server is a process of its own (``tests/asgi_site.py``: the example site's
``asgi.py`` on the test settings, the pytest process's PostgreSQL test database as its
default database, its connections named ``aaa-asgi-test``; the user's stream cap
``API_STREAMS_PER_USER`` raised to 150, so the 151st is 429). An open stream is an
async iterator that waits on the server's event loop, holding no thread and no
database connection, and wakes when its run moves, whichever process appended
(PostgreSQL NOTIFY).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Permission
from django.db import connections

from aaa_django.api import stream as sse
from aaa_django.events import Event, new_id
from aaa_django.models import ApiKey
from aaa_django.runtime.event_types import RUN_COMPLETED, RUN_STARTED
from aaa_django.store import DjangoEventStore

from ..docs.test_readme import free_port, wait_http
from .test_stream_live import Http

pytestmark = [pytest.mark.django_db(transaction=True, databases=["default", "postgres"]), pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
STREAMS = 150  # alice's streams, all open at once (her cap, raised for the test)


def user(using: str, name: str) -> dict:
    u = get_user_model().objects.db_manager(using).create_user(name, password="pw")
    u.user_permissions.add(Permission.objects.using(using).get(codename="add_runrecord"))
    _, key = ApiKey.create_key(u, name=name, using=using)
    return {"Authorization": f"Bearer {key}"}


def types_until(stream, last: str | None) -> list[str]:
    """The types of the messages a stream sends, up to ``last`` (None: until it closes)."""
    seen: list[str] = []
    while (m := stream.next()) is not None:
        seen.append(m[1]["type"])
        if seen[-1] == last:
            break
    return seen


def server_connections(using: str) -> int:
    with connections[using].cursor() as cur:
        cur.execute("SELECT count(*) FROM pg_stat_activity WHERE application_name = 'aaa-asgi-test'")
        return cur.fetchone()[0]


@pytest.fixture
def asgi_server(pg_alias, tmp_path):
    port = free_port()
    log = open(tmp_path / "uvicorn.log", "w+")
    env = {
        **os.environ,
        "AAA_TEST_ASGI_DB": connections[pg_alias].settings_dict["NAME"],
        "AAA_TEST_STREAMS_PER_USER": str(STREAMS),
        "DJANGO_SETTINGS_MODULE": "tests.asgi_settings",
        "PYTHONUNBUFFERED": "1",
    }
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "uvicorn",
            "tests.asgi_site:application",
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--lifespan",
            "off",
            "--no-access-log",
        ],
        cwd=ROOT,
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    try:
        # the bound only catches a server that never comes up (a loaded 2-core machine
        # has taken more than 60 s to start one)
        wait_http(f"http://127.0.0.1:{port}/api/aaa/openapi.json", proc, timeout=180)
        yield f"http://127.0.0.1:{port}", proc
    finally:
        proc.terminate()
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.seek(0)
        print(log.read())  # shown when the test fails
        log.close()


def test_150_streams_of_one_user_leave_other_users_answered_and_connections_bounded(asgi_server, pg_alias):
    url, proc = asgi_server
    alice = Http(url, user(pg_alias, "alice"))
    bob = Http(url, user(pg_alias, "bob"))  # streams nothing: his requests must keep answering

    def start(client: Http) -> str:
        status, run = client.json("POST", "/runs", {"algorithm": "tests.api.idle"})
        assert status == 201, run
        return run["id"]

    runs = [start(alice) for _ in range(3)]
    streams = [alice.stream(f"/runs/{runs[i % 3]}/events/stream") for i in range(STREAMS)]
    assert [s.status for s in streams] == [200] * STREAMS
    # Each one streams already (under ASGI a sync iterator would send nothing before its end).
    for s in streams:
        assert s.next()[1]["type"] == RUN_STARTED
    over = alice.stream(f"/runs/{runs[0]}/events/stream")  # past her cap
    assert over.status == 429
    assert json.loads(over.response.read())["detail"][0]["type"] == "too_many_streams"
    over.close()

    # While they wait: bob's requests answer, and the server holds few connections.
    bob_run = start(bob)
    for _ in range(10):
        assert bob.json("GET", "/runs")[0] == 200
        assert bob.json("GET", f"/runs/{bob_run}/events")[0] == 200
        assert bob.json("GET", f"/runs/{bob_run}")[0] == 200
    held = server_connections(pg_alias)
    # the stream readers, the listening and the notifying connections, the engine's
    # thread, a request's
    assert held <= sse.READERS + 4, held

    # Another process appends to one run: its 50 streams wake and send it, no other.
    DjangoEventStore(pg_alias).append_sync([Event(id=new_id(), stream=runs[1], type="tests.poke", data={"n": 1})])
    for s in streams[1::3]:
        assert "tests.poke" in types_until(s, "tests.poke")
    # A run is cancelled: its streams send its end and close.
    assert alice.json("POST", f"/runs/{runs[0]}/cancel")[0] == 202
    for s in streams[0::3]:
        assert types_until(s, None)[-1] == RUN_COMPLETED  # and the server closed it
        s.close()
    assert alice.stream(f"/runs/{runs[0]}/events/stream", last_event_id=10**6).status == 204
    assert bob.json("GET", f"/runs/{bob_run}")[0] == 200
    assert server_connections(pg_alias) <= sse.READERS + 4
    for s in streams:
        s.close()
    assert proc.poll() is None
