"""The embedded default strands nothing: the example site on SQLite and the in-process
bus, behind gunicorn, killed with 20 runs in flight and started again, finishes every
run by itself (no command typed), each run adopted once, with one gunicorn process or
two at once.

The runs wait on the model server (tests/field/model_server.py), which holds every
answer until the web server has been killed: each run's first model call is in flight
in the process that dies. Started again, the web server's first request (the test's
client polling its runs) starts its engine host, which finds the runs' holder gone
(a process of this machine that has ended) and adopts them. The model server counts
the calls it is paid for: each run's first request twice (the call cut off by the
kill, then the adopter's), its second once. Two processes that each adopted a run
would have made its first request a third time.
"""

from __future__ import annotations

import sqlite3
import time

import pytest

from .model_server import answer
from .site import Site
from .test_field import POPULATIONS, TOOLS, check_log, events, task_text, until

pytestmark = [pytest.mark.slow]

RUNS = 20
#: seconds for every run to end once the web server is back: it only catches a run that
#: never ends (each needs two model calls of at most a second and its tool calls)
DEADLINE = 180


@pytest.mark.parametrize("web_workers", [1, 2], ids=["one-process", "two-processes"])
def test_a_web_server_killed_with_runs_in_flight_finishes_them_when_started_again(tmp_path, s3_endpoint, web_workers):
    tasks = [task_text(i, 200 + i) for i in range(RUNS)]
    with Site(
        tmp_path, s3_endpoint, db="sqlite", model=True, web_workers=web_workers, model_latency=(0.2, 0.6)
    ) as site:
        client = site.client
        site.hold_model()  # every run's first call stays in flight
        ids = site.start_runs(tasks, {"tools": TOOLS, "max_turns": 4}, "adopt")
        until(lambda: len([c for c in site.model_calls() if c["turn"] == 1]) >= RUNS, timeout=DEADLINE)
        dead = site.kill_web()
        site.start_web()
        up = time.monotonic()
        site.hold_model(False)
        ended = site.until_ended(ids, DEADLINE)
        took = time.monotonic() - up
        workers = set(site.web.descendants())
        logs = {run_id: events(client, run_id) for run_id in ids}
        calls = site.model_calls()
        web_log = "\n".join(p.text() for name, p in site.procs.items() if name.startswith("web"))
    with sqlite3.connect(tmp_path / "db.sqlite3") as db:
        leases = {r: (h, n) for r, h, n in db.execute("SELECT run_id, held_by, adoptions FROM aaa_run")}

    print(
        f"\n{web_workers} web process(es): {RUNS} runs killed in flight; every run ended {took:.1f} s after "
        f"the web server was back (two model calls of 0.2-0.6 s each)"
    )
    wrong = {
        run_id: (r["outcome"], str(r["value"])[:200])
        for run_id, r in ended.items()
        if (r["outcome"], r["value"]) != ("success", {"text": answer(tasks[ids.index(run_id)], POPULATIONS)})
    }
    assert wrong == {}, "runs that ended otherwise than with their right answer"
    for run_id, log in logs.items():
        check_log(run_id, log)
    # Each run was adopted once, by a process of the web server started again.
    assert {r: n for r, (_, n) in leases.items()} == dict.fromkeys(ids, 1)
    holders = {int(h.split("|")[3]) for h, _ in leases.values()}
    assert holders <= workers and not holders & set(dead), (holders, workers, dead)
    assert (
        sum(
            int(line.split(" adopts ")[1].split()[0])
            for line in web_log.splitlines()
            if " adopts " in line and "which has ended" in line
        )
        == RUNS
    )
    # A provider paid for each run's first request twice (the call the kill cut off,
    # the adopter's), its second once: never a third time.
    paid = {(c["task"], c["turn"]): 0 for c in calls}
    for c in calls:
        paid[(c["task"], c["turn"])] += 1
    assert {k: v for k, v in paid.items()} == {**{(t, 1): 2 for t in tasks}, **{(t, 2): 1 for t in tasks}}
