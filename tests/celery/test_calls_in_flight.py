"""A worker killed with calls in flight: 200 runs with 1 s model calls in flight on one
worker (the README's command: prefork, two processes), whose loop holds the calls after
their tasks have returned; SIGKILL the whole worker while it holds them, start it again.

The calls it held are in no message any more (their tasks acknowledged them when
the calls were handed off): what brings them back is the new worker's duty, which
adopts the runs whose holder is gone (the dead worker's processes, known dead on this
machine), and the sweeper (run here every second) for any a lease did not cover.
Every run must end ``success`` with a log that lost and duplicated nothing, and the
guarded tool ``record`` ran at most once per call (exactly once for a call that
completed; one a kill left uncertain is reconciled by tests/celery/person.py as it
happened).
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter

import pytest
from django.db import connections

from aaa_django.celery.sweeper import sweep
from aaa_django.runtime.event_types import (
    LLM_COMPLETED,
    LLM_REQUESTED,
    RUN_COMPLETED,
    TOOL_REQUESTED,
)

from .conftest import CELERY_DB, make_engine
from .person import reconciling
from .site import loop, script
from .test_faults import REQUEST_TYPES, _as_it_happened, _each_request_has_one_result, _executions

pytestmark = [CELERY_DB, pytest.mark.campaign]

RUNS, TURNS, LATENCY = 200, 4, 1.0
#: model calls in flight when the worker is killed, at least (how many more depends on
#: the machine: on 2 busy cores a worker holds a few dozen of these runs' calls at once)
HELD = 10
#: seconds the test's coroutine may take before it counts as hung. What it takes is
#: the CPU it gets: 56 s alone at load 6-8 on 2 cores; with its processes (services,
#: workers, pytest) held to 0.3 of a CPU by a cgroup quota while other sessions' suites
#: ran (load 7-13), 262 s, 200 s (sweeping with stall_after=10) and 352 s (POLL 0.5,
#: load 9-13), every run ``success``, nothing lost. The 240 s it had timed out once in
#: a suite at load 20-30: the bound, not a race
HUNG = 600
#: the sweeper's stall_after (it sweeps every second): shorter than the queue waits
#: after the restart, so runs whose messages are only queued look stalled too
STALL_AFTER = 2
#: seconds the new worker's duty has to adopt the dead worker's runs before the sweeper
#: starts (a bound for a loaded machine: it adopts on its first duty pass, a second or
#: two after it is up)
ADOPTED_WITHIN = 120
#: the first wait between two polls of a run's end: 200 runs are waited on at once, and
#: the site's PostgreSQL wakes a waiter when its run moves (with the tests' 0.05 s, 200
#: waiters polled 500 to 4,000 times a second, in the process that sweeps)
POLL = 0.5


def _calls() -> tuple[int, int]:
    """Model calls asked for and answered so far. Called in a thread of the loop's
    executor (``asyncio.to_thread``): the thread's connection is closed after it, or it
    outlives the test and the test database cannot be dropped at the end ("being
    accessed by other users")."""
    try:
        with connections["postgres"].cursor() as cur:
            cur.execute(
                "SELECT count(*) FILTER (WHERE type = %s), count(*) FILTER (WHERE type = %s) FROM aaa_event",
                [LLM_REQUESTED, LLM_COMPLETED],
            )
            return cur.fetchone()
    finally:
        connections["postgres"].close()


def _adopted(ids: list[str]) -> int:
    """How many of the runs a process adopted (the run index), on a connection closed after."""
    try:
        with connections["postgres"].cursor() as cur:
            cur.execute("SELECT count(*) FROM aaa_run WHERE run_id = ANY(%s) AND adoptions > 0", [ids])
            return cur.fetchone()[0]
    finally:
        connections["postgres"].close()


def test_a_worker_killed_holding_200_calls_loses_and_duplicates_nothing(new_cluster, arun):
    from aaa_django.celery.bus import coordinator

    # The workers' STALL_AFTER is the sweeper's: a model call takes its run's lease by a
    # quarter of it after its request (aaa_django.celery.slow.lease_after), so the
    # killed worker's 1 s calls held leases
    cluster = new_cluster(1, suffix="-inflight", concurrency=2, env={"AAA_TEST_STALL_AFTER": str(STALL_AFTER)})
    (worker,) = cluster.workers
    task = script(turns=TURNS, tool="record", latency=LATENCY)
    redriven: list[str] = []
    #: run id -> the times the sweeper re-drove it
    redrives: dict[str, list[float]] = {}

    async def sweeper(engine, stop: asyncio.Event) -> None:
        while not stop.is_set():
            await asyncio.sleep(1)
            now = time.time()
            for run_id in (await sweep(engine, stall_after=STALL_AFTER, now=now)).redriven:
                redriven.append(run_id)
                redrives.setdefault(run_id, []).append(now)

    async def main():
        async with make_engine(cluster.queues, poll_interval=POLL) as engine:
            runs = await asyncio.gather(*(engine.start(loop(), {"task": task}) for _ in range(RUNS)))
            ids = [r.run_id for r in runs]
            # half the runs have asked the model, and the worker holds calls
            while True:
                asked, answered = await asyncio.to_thread(_calls)
                if asked >= RUNS // 2 and asked - answered >= HELD:
                    break
                await asyncio.sleep(0.02)
            await asyncio.to_thread(worker.kill)
            held = await asyncio.to_thread(lambda: sum(map(coordinator().is_busy, ids)))
            print(f"\nkilled the worker: {asked} calls asked, {answered} answered, {held} runs leased")
            await asyncio.to_thread(cluster.start, 1, concurrency=2)
            print("a new worker is up")
            # Its duty adopts the dead worker's runs by itself. The sweeper starts once
            # it has: a re-drive of the sweeper's, delivered first, would take those runs
            # by the delivery's claim, not by an adoption.
            end = time.monotonic() + ADOPTED_WITHIN
            while not await asyncio.to_thread(_adopted, ids) and time.monotonic() < end:
                await asyncio.sleep(0.2)
            stop = asyncio.Event()
            helpers = [
                asyncio.ensure_future(sweeper(engine, stop)),
                asyncio.ensure_future(reconciling(engine, stop, reconciled)),
            ]
            try:
                outcomes = await asyncio.gather(*(r.result() for r in runs))
            finally:
                stop.set()
                await asyncio.gather(*helpers)
            return held, outcomes, [await r.events() for r in runs], await asyncio.to_thread(_adopted, ids)

    reconciled: dict[str, str] = {}
    held, outcomes, logs, adopted = arun(main(), timeout=HUNG)
    most = max(map(len, redrives.values()), default=0)
    print(
        f"\n{held} runs held by the killed worker, {adopted} adopted, {len(redriven)} sweeper re-drives of "
        f"{len(redrives)} runs (at most {most} of one run), {len(reconciled)} uncertain calls reconciled"
    )

    assert held >= 1  # the killed worker held calls (their leases had not expired yet)
    assert {o.outcome for o in outcomes} == {"success"}, Counter(o.outcome for o in outcomes)
    assert adopted  # what the killed worker held came back: adopted by the new worker
    # A run re-driven is left STALL_AFTER at least to move before the next re-drive
    # (its messages may only be queued behind the restart's backlog): before the
    # sweeper's ledger, every sweep re-drove it again (at load 7: 594 re-drives of 174
    # runs, up to 20 of one run, 47 runs held; with the ledger 329 of 165, up to 4 of
    # one run, 35 held; 319 of 175, 55 held).
    for run_id, times in redrives.items():
        gaps = [b - a for a, b in zip(times, times[1:])]
        assert all(gap >= STALL_AFTER for gap in gaps), (run_id, gaps)
    executions = _executions()
    for events in logs:
        assert Counter(e.type for e in events)[RUN_COMPLETED] == 1
        assert [e.seq for e in events] == list(range(1, len(events) + 1))
        assert len({e.id for e in events}) == len(events)
        _each_request_has_one_result(events)
        assert [e.data["tag"] for e in events if e.type == LLM_REQUESTED] == [f"turn-{t}" for t in range(1, TURNS + 1)]
        for request in (e for e in events if e.type == TOOL_REQUESTED):
            from aaa_django.events import derive_id

            key = derive_id(request.id, "aaa.idempotency")
            (result,) = [e for e in events if e.causation == request.id and e.type in REQUEST_TYPES[TOOL_REQUESTED]]
            ran = executions.get(key, 0)
            assert ran <= 1, f"the guarded tool ran {ran} times for one call"
            _as_it_happened(result, ran)
