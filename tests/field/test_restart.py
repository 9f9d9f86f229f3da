"""The web process outlives a PostgreSQL restart (and an outage).

The example site on its embedded bus (the web process's engine host drives the runs),
over PostgreSQL, behind gunicorn. The site's scripted model looks up two populations,
then asks to publish the sum: a tool call that waits for a person's approval. With a
run waiting there, PostgreSQL restarts. Approving then, and starting another run,
works: the engine host connects again by itself (no 500, no 409 "lost a race"), and
both runs end ``success``. While PostgreSQL is down, the API answers 503 with
``Retry-After``, a run's next steps are delivered again until it is back, and then
everything works again.
"""

from __future__ import annotations

import time

import pytest

from .site import Site

pytestmark = [pytest.mark.slow]


def pending_approval(site: Site, run_id: str, timeout: float = 30) -> str:
    end = time.monotonic() + timeout
    while True:
        status, gates = site.client.call("GET", f"/runs/{run_id}/approvals")
        assert status == 200, gates
        pending = [g["request_id"] for g in gates if g["status"] == "pending"]
        if pending:
            return pending[0]
        assert time.monotonic() < end, site.logs()
        time.sleep(0.1)


def result(site: Site, run_id: str, timeout: float = 30) -> dict:
    end = time.monotonic() + timeout
    while True:
        status, run = site.client.call("GET", f"/runs/{run_id}")
        assert status == 200, run
        if run["status"] == "completed":
            return run
        assert time.monotonic() < end, site.logs()
        time.sleep(0.1)


START = {"algorithm": "aaa.algos.ToolLoop", "input": {"task": "How many live in Lyon and Porto?"}}


def test_approve_and_start_work_after_a_postgres_restart(tmp_path, s3_endpoint):
    with Site(tmp_path, s3_endpoint) as site:
        client = site.client
        status, first = client.call("POST", "/runs", START)
        assert status == 201, first
        gate = pending_approval(site, first["id"])

        site.pg.restart()  # every connection of the web process is cut

        status, decided = client.call(
            "POST", f"/runs/{first['id']}/approvals/{gate}", {"decision": "grant", "reason": "after the restart"}
        )
        assert status == 200, decided
        status, second = client.call("POST", "/runs", START, headers={"Idempotency-Key": "second"})
        assert status == 201, second
        assert result(site, first["id"])["outcome"] == "success"
        gate = pending_approval(site, second["id"])  # the second run reached its gate too
        status, _ = client.call("POST", f"/runs/{second['id']}/approvals/{gate}", {"decision": "grant"})
        assert status == 200

        site.pg.stop()  # the second run's next steps fail while it is down, and are retried
        down = [
            client.call("POST", "/runs", START, retry=False),
            client.call("GET", f"/runs/{first['id']}", retry=False),
        ]
        site.pg.start()
        status, third = client.call("POST", "/runs", START, headers={"Idempotency-Key": "third"})
        second_outcome = result(site, second["id"])["outcome"]

    assert [status for status, _ in down] == [503, 503]
    assert {d["detail"][0]["loc"][-1] for _, d in down} == {"database"}  # no host, no port
    assert status == 201, third
    assert second_outcome == "success"
    assert client.bad_answers() == [], client.answers
    assert all(a[1] for a in client.answers if a[0] == 503)  # each with Retry-After
