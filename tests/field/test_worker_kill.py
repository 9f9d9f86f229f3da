"""A worker's death costs seconds: the example site as a cluster (PostgreSQL, Redis, two
``celery -A project worker`` at the default settings), 50 runs waiting on a model that
takes a second; one worker is SIGKILLed whole with its runs' model calls in flight and
started again at once, as its supervisor would.

Each worker process holds a lease on the runs it drives (``aaa_run.held_by``), and the
killed one's leases are adopted by the next duty pass: at once where the dead process
is known gone (a process of the same machine), else once its lease lapses
(``RUN_LEASE_TTL``, 6 s). What the test asserts is what the log and the run index
decided: every run ``success`` with its right answer and a whole log, each run the
killed worker held adopted once by a live worker (the others never), and each of
those runs' first model request paid for twice (the call the kill cut off, the
adopter's), every other request once. The time from the kill until every run has
ended is printed (the bound asserted is far from it: it only catches a run left to the
stall sweep, ``STALL_AFTER``, 60 s). The workers' logs (``-l info``) show the duty only
when it did something.
"""

from __future__ import annotations

import time

import psycopg
import pytest

from .model_server import answer
from .site import Site
from .test_field import POPULATIONS, TOOLS, check_log, events, task_text, until

pytestmark = [pytest.mark.slow]

RUNS = 50
#: a model call's seconds
LATENCY = 1.0
#: seconds from the kill by which every run must have ended: far above what it takes
#: (adoption at the next duty pass, two model calls of a second) and below the stall
#: sweep's 60 s, which is what a run whose lease was not adopted would wait for
BOUND = 50


def test_a_worker_sigkilled_with_50_runs_in_flight_costs_seconds(tmp_path, s3_endpoint):
    tasks = [task_text(i, 300 + i) for i in range(RUNS)]
    with Site(
        tmp_path, s3_endpoint, bus="celery", workers=2, model=True, model_latency=(LATENCY, LATENCY), model_pids=True
    ) as site:
        client = site.client
        site.hold_model()
        ids = site.start_runs(tasks, {"tools": TOOLS, "max_turns": 4}, "kill")
        # every run's first model call in flight, in one worker or the other
        until(lambda: len([c for c in site.model_calls() if c["turn"] == 1]) >= RUNS, timeout=180)
        victim = site.workers[0]
        dead = set(victim.descendants())
        held = {r: h for r, h in leases(site, ids).items() if h and int(h.split("|")[3]) in dead}
        victim.kill()
        killed, killed_at = time.monotonic(), time.time()
        site.start_worker()  # its supervisor starts it again
        site.hold_model(False)

        ended = site.until_ended(ids, 180)
        took = time.monotonic() - killed
        logs = {run_id: events(client, run_id) for run_id in ids}
        calls = site.model_calls()
        final = leases(site, ids, adoptions=True)
        live = {p for w in site.workers if w.proc.poll() is None for p in w.descendants()}
        worker_logs = "\n".join(w.text() for w in site.workers)

    print(
        f"\nkilled a worker holding {len(held)} of {RUNS} runs (model calls of {LATENCY} s in flight): every "
        f"run ended {took:.1f} s after the kill (each run's two model calls: {2 * LATENCY:.0f} s)"
    )
    assert held, "the killed worker held no run"
    wrong = {
        run_id: (r["outcome"], str(r["value"])[:200])
        for run_id, r in ended.items()
        if (r["outcome"], r["value"]) != ("success", {"text": answer(tasks[ids.index(run_id)], POPULATIONS)})
    }
    assert wrong == {}, "runs that ended otherwise than with their right answer"
    for run_id, log in logs.items():
        check_log(run_id, log)
    # The killed worker's runs adopted once each, by a live worker; the others never.
    adopted = [at - killed_at for r, (_, _, at) in final.items() if r in held]
    print(f"the killed worker's runs adopted {min(adopted):.1f}-{max(adopted):.1f} s after the kill")
    assert {r: n for r, (_, n, _) in final.items()} == {r: int(r in held) for r in ids}
    assert {int(final[r][0].split("|")[3]) for r in held} <= live
    # Paid for: the first request of the killed worker's runs twice, the rest once.
    paid: dict[tuple[str, int], int] = {}
    for c in calls:
        paid[(c["task"], c["turn"])] = paid.get((c["task"], c["turn"]), 0) + 1
    expected = {**{(t, 1): 1 + (r in held) for t, r in zip(tasks, ids)}, **{(t, 2): 1 for t in tasks}}
    odd = {ids[[t for t in tasks].index(k[0])]: (k[1], v) for k, v in paid.items() if expected[k] != v}
    assert paid == expected, (
        str(
            {
                r: (
                    turn,
                    n,
                    final[r],
                    [
                        (round(c["at"] - killed_at, 2), c["turn"], c["pid"])
                        for c in calls
                        if c["task"] == tasks[ids.index(r)]
                    ],
                )
                for r, (turn, n) in odd.items()
            }
        )
        + f"victim {sorted(dead)}"
    )
    assert took < BOUND
    # The duty logs at DEBUG unless it did something: Celery's lines about aaa.tick
    # are not in a -l info log, the adoption is.
    assert "aaa.tick[" not in worker_logs
    assert " adopts " in worker_logs


def leases(site: Site, ids: list[str], *, adoptions: bool = False) -> dict:
    """Run id -> its holder (and, ``adoptions``: (holder, adoptions, when last adopted)),
    from the run index."""
    with psycopg.connect(host="127.0.0.1", port=site.pg.port, dbname="aaa", user="postgres") as conn:
        rows = conn.execute(
            "SELECT run_id, held_by, adoptions, adopted_at FROM aaa_run WHERE run_id = ANY(%s)", [ids]
        ).fetchall()
    return {r: (h, n, at) if adoptions else h for r, h, n, at in rows}
