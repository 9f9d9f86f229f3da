"""A partition is survived honestly: the example site as a cluster, one worker in a
network namespace of the test's own, cut off (its link down) while it holds runs
with guarded side-effecting tool calls and model calls in flight, then healed.

The cut-off worker (``celery -A project worker``, in the namespace) takes every run:
eight reach their guarded tool (``slow_charge``, which the model server calls as the
task says, held in flight by the test), eight have their first model call in flight
(the model server holds it). A
second worker starts, then the link goes down. What must follow, asserted on what
the log, the run index and the model server recorded:

- the other worker takes over every run of the cut-off one when its lease lapses
  (``RUN_LEASE_TTL``, 6 s), not a stall later: each run's adoption is recorded within
  the lease plus a few seconds of the cut;
- the guarded calls cut off are found uncertain (once their Redis lease, ``LEASE_TTL``,
  has lapsed) and never run twice: each run waits for a person (a reconciliation gate),
  and no run ends ``success`` on an uncertain call;
- healed, the cut-off worker's calls return: each outcome is on the log as its own
  event (``aaa.tool.returned``: the reconciliation's evidence), not absorbed;
- every provider call is on the log as an attempt (the model server counts each
  request and knows each caller's address): the cut-off worker made none while cut
  off; healed, it is a worker like the others, and a call it made then, for a run
  whose delivery it took (and so claimed), is its own attempt, recorded after the heal;
- a person answers "it ran" (``reconcile``): the run goes on with the result the
  evidence brought, and ends ``success``; the runs whose model call was cut off end
  ``success``, their first request paid twice at most.

The namespace and its link are removed whatever happens.
"""

from __future__ import annotations

import datetime
import json
import time

import psycopg
import pytest

from aaa_django.conf import DEFAULTS
from aaa_django.runtime.event_types import (
    APPROVAL_REQUESTED,
    TOOL_FAILED,
    TOOL_RETURNED,
    TOOL_STARTED,
)

from .netns import Namespace
from .site import Site
from .test_field import check_log, events, until
from .tools import executions

pytestmark = [pytest.mark.slow]

#: runs that reach their guarded tool before the cut, runs whose model call is in flight
TOOL_RUNS, MODEL_RUNS = 8, 8
#: the Redis leases of the guarded calls (the example site's AAA_LEASE_TTL): the other
#: worker finds a cut-off call uncertain once its lease has lapsed
LEASE_TTL = 8
RUN_LEASE_TTL = DEFAULTS["RUN_LEASE_TTL"]
#: what "a few seconds" after the lease is, for the takeover: the duty's pass (every
#: second) and its statements on a loaded machine; far below the stall sweep's 60 s
TAKEOVER_SLACK = 8
TOOLS = [
    {
        "name": "slow_charge",
        "description": "Charges a city.",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    }
]


def test_a_worker_cut_off_stands_down_and_its_runs_are_taken_over_honestly(tmp_path, s3_endpoint):
    charges, charge_hold = tmp_path / "charges.jsonl", tmp_path / "charge-hold"
    env = {
        "AAA_S3_BUCKET": "",
        "AAA_EXTRA_TOOLS": "tests.field.tools.slow_charge",
        "AAA_TEST_CHARGES": str(charges),
        "AAA_TEST_CHARGE_HOLD": str(charge_hold),
        "AAA_TEST_CHARGE_SECONDS": "0.2",
        "AAA_LEASE_TTL": str(LEASE_TTL),
    }
    # what the model server's model does: call the tool the task names (the run's number
    # makes each task, and so its calls at the model server, its own)
    tasks = [
        json.dumps({"call": "slow_charge", "args": {"city": ("Lyon", "Porto")[i % 2]}, "run": i})
        for i in range(TOOL_RUNS + MODEL_RUNS)
    ]
    assert Namespace.leftovers() == []
    with (
        Namespace() as ns,
        Site(
            tmp_path, s3_endpoint, bus="celery", model=True, model_latency=(0.3, 0.3), listen=ns.host, env=env
        ) as site,
    ):
        client = site.client
        cut_off = site.start_worker(netns=ns.prefix())
        site.wait_ready(cut_off)

        def of(run_id: str, type: str) -> list[dict]:
            return [e for e in events(client, run_id) if e["type"] == type]

        charge_hold.touch()  # the guarded calls stay in flight
        config = {"tools": TOOLS, "max_turns": 4}
        tool_runs = site.start_runs(tasks[:TOOL_RUNS], config, "tool")
        until(lambda: all(len(of(r, TOOL_STARTED)) == 1 for r in tool_runs), timeout=180)
        site.hold_model()  # the model calls stay in flight
        model_runs = site.start_runs(tasks[TOOL_RUNS:], config, "model")
        b_tasks = set(tasks[TOOL_RUNS:])
        until(lambda: len({c["task"] for c in site.model_calls() if c["task"] in b_tasks}) == MODEL_RUNS, timeout=180)
        other = site.start_worker()
        site.wait_ready(other)
        held = leases(site, tool_runs + model_runs)
        assert all(h and int(h[0].split("|")[3]) in cut_off.descendants() for h in held.values()), held

        cut_off_pids = set(cut_off.descendants())
        cut_at = time.time()
        ns.cut()
        site.hold_model(False)  # the other worker's calls are answered; the cut-off one's cannot reach it
        until(lambda: all(n >= 1 for _, n, _ in leases(site, [*held]).values()), timeout=120)
        adopted = leases(site, [*held])
        other_pids = set(other.descendants())
        # the guarded calls cut off: uncertain once their Redis lease lapsed, a person asked
        until(lambda: all(len(gates(client, r)) == 1 for r in tool_runs), timeout=120)
        ended_early = [r for r in tool_runs if of(r, "aaa.run.completed")]

        heal_at = time.time()
        ns.heal()
        charge_hold.unlink()  # the cut-off calls return where they ran
        until(lambda: all(len(of(r, TOOL_RETURNED)) == 1 for r in tool_runs), timeout=120)
        late = {r: of(r, TOOL_RETURNED) for r in tool_runs}
        calls_cut_off = [c for c in site.model_calls() if c["peer"] == ns.peer]
        cut_off_log = cut_off.text()
        cut_off.stop()

        # A person reconciles: each call ran (its late outcome says what it returned).
        answers = [(r, g["id"]) for r in tool_runs for g in gates(client, r)]
        site.manage("shell", "-c", RECONCILE.format(answers=json.dumps(answers)))
        ended = site.until_ended(tool_runs + model_runs, 180)
        logs = {r: events(client, r) for r in tool_runs + model_runs}
        calls = site.model_calls()
    assert Namespace.leftovers() == []

    takeover = {r: round(at - cut_at, 1) for r, (_, _, at) in adopted.items()}
    print(
        f"\ncut off holding {len(held)} runs: taken over {min(takeover.values())}-{max(takeover.values())} s "
        f"after the cut (RUN_LEASE_TTL {RUN_LEASE_TTL} s); healed {heal_at - cut_at:.1f} s after it"
    )
    # Taken over when the lease lapsed, each run once, by the other worker.
    assert all(t <= RUN_LEASE_TTL + TAKEOVER_SLACK for t in takeover.values()), takeover
    assert {int(h.split("|")[3]) for h, _, _ in adopted.values()} <= other_pids
    assert "stands down" in cut_off_log
    # No run ended while its guarded call was uncertain, none on an uncertain result.
    assert ended_early == []
    assert not any(
        e["type"] == TOOL_FAILED and e["data"].get("reason") == "uncertain" for log in logs.values() for e in log
    )
    # Each cut-off call ran once, in the cut-off worker; its outcome is the evidence,
    # and the result the run went on with.
    runs_of = {e["data"]["idempotency_key"]: r for r in tool_runs for e in of_log(logs[r], TOOL_STARTED)}
    ran = executions(str(charges))
    keys = [x["key"] for x in ran]
    assert len(keys) == len(set(keys)), "a guarded call ran twice"
    assert {x["key"] for x in ran if x["key"] in runs_of} == set(runs_of)
    for r in tool_runs:
        evidence = {e["data"]["call_id"]: e["data"]["result"] for e in late[r]}
        completed = {e["data"]["call_id"]: e["data"] for e in of_log(logs[r], "aaa.tool.completed")}
        assert set(evidence.values()) <= {"charged Lyon", "charged Porto"}
        assert {c: d["result"] for c, d in completed.items()} == evidence
        assert all(d["reconciled"]["verdict"] == "ran" for d in completed.values())
    # Every provider call is on the log: each run's request paid no more often than its
    # attempts (``aaa.llm.attempted``) say. The cut-off worker called out after the cut
    # only once healed, for a run it held again (a delivery it took claims the run), each
    # call an attempt of its own on the log, recorded after the heal.
    run_of = dict(zip(tasks, tool_runs + model_runs))
    attempts = {r: requests(log) for r, log in logs.items()}
    paid: dict[tuple[str, int], int] = {}
    for c in calls:
        paid[(c["task"], c["turn"])] = paid.get((c["task"], c["turn"]), 0) + 1
    for (task, turn), n in paid.items():
        made = attempts[run_of[task]][turn - 1]
        assert n <= len(made), (task, turn, n, made)
    assert calls_cut_off
    for c in calls_cut_off:
        if c["at"] >= cut_at:
            made = attempts[run_of[c["task"]]][c["turn"] - 1]
            assert c["at"] >= heal_at, (c, cut_at, heal_at)
            assert any(pid in cut_off_pids and at >= heal_at for pid, at in made), (c, made, heal_at)
    assert max(paid.values()) <= 2 and all(v == 1 for (t, turn), v in paid.items() if t not in b_tasks)
    assert {r: e["outcome"] for r, e in ended.items()} == dict.fromkeys(tool_runs + model_runs, "success")
    for r, log in logs.items():
        check_log(r, log)


RECONCILE = """
import asyncio, json
from aaa_django.site.engines import build_engine
from aaa_django.tools.reconcile import reconcile

async def main():
    async with build_engine() as engine:
        for run_id, gate in json.loads('{answers}'):
            assert await reconcile(engine, run_id, gate, "ran", by="the field test")

asyncio.run(main())
"""


def of_log(log: list[dict], type: str) -> list[dict]:
    return [e for e in log if e["type"] == type]


def requests(log: list[dict]) -> list[list[tuple[int, float]]]:
    """The run's model requests in order (its turns at the model server), each as its
    attempts: who made each (the process id in its maker's holder id) and when."""
    made: dict[str, list[tuple[int, float]]] = {}
    for e in of_log(log, "aaa.llm.attempted"):
        at = datetime.datetime.fromisoformat(e["time"]).timestamp()
        made.setdefault(e["data"]["request_id"], []).append((int(e["data"]["by"].split("|")[3]), at))
    return list(made.values())


def gates(client, run_id: str) -> list[dict]:
    """The run's reconciliation gates (uncertain calls a person is asked about)."""
    return [e for e in events(client, run_id) if e["type"] == APPROVAL_REQUESTED and e["data"].get("reconcile")]


def leases(site: Site, ids: list[str]) -> dict[str, tuple[str | None, int, float | None]]:
    """Run id -> (its holder, its adoptions, when it was last adopted), from the run index."""
    with psycopg.connect(host="127.0.0.1", port=site.pg.port, dbname="aaa", user="postgres") as conn:
        rows = conn.execute(
            "SELECT run_id, held_by, adoptions, adopted_at FROM aaa_run WHERE run_id = ANY(%s)", [ids]
        ).fetchall()
    return {r: (h, n, at) for r, h, n, at in rows}
