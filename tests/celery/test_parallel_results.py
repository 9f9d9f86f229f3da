"""200 runs whose model asks for two tool calls at once, on one worker (the README's
command: prefork, two processes), with nothing broken and no sweeper: every run ends.

The two results of a turn are answered at the same moment on the worker's loop: one
is appended with its step, the other finds the log moved on and goes alone, and its
step, on delivery, writes the next model request. Deliveries of one run overlap, each
syncing the worker's view of the run while the others append. Found by hand (the
example site, 200 runs over the REST API): in half the tries 1 to 5 runs stalled until
the sweeper re-drove them: a view older than the one the appends had extended was
installed over it, and the delivery of the event just appended found it missing.
Here the workers' sweep waits an hour, so a run that loses a step never ends and the
test fails at ``HUNG`` (a bound on a hang, never a measure of speed).

The worker's log reports no error: the hundreds of tool calls it watches at once share one subscription
to run-ended notices (one each took every connection of the loop's Redis pool: 310
"Too many connections" tracebacks here, the leases' renewals failing).
"""

from __future__ import annotations

import asyncio
from collections import Counter

import pytest
from django.db import connections

from aaa_django.runtime.event_types import RUN_COMPLETED, TOOL_COMPLETED
from aaa_django.store.connections import SIZE

from .conftest import CELERY_DB, make_engine
from .site import loop, script
from .test_faults import _each_request_has_one_result

pytestmark = [CELERY_DB, pytest.mark.campaign]

RUNS, TURNS, PARALLEL, LATENCY = 200, 3, 3, 1.0
#: each tool call's seconds: past the worker's SLOW_DELIVERY, so each call's delivery
#: holds its run's lease and watches for the run's end (a read of the run, as the
#: other calls' results are appended: where the field found the race)
TOOL_SECONDS = 0.1
#: seconds before the test counts as hung: the runs need a few dozen on a busy 2-core
#: machine; a run that lost a step waits for the sweep, an hour away
HUNG = 300
POLL = 0.5


def store_connections() -> dict[int, int]:
    """pid -> the store connections the server has open for that process (named by
    ``aaa_django.store.connections.application_name``)."""
    with connections["postgres"].cursor() as cur:
        cur.execute(
            "SELECT application_name, count(*) FROM pg_stat_activity "
            "WHERE application_name LIKE 'aaa_django store %' GROUP BY 1"
        )
        return {int(name.rsplit(" ", 1)[1]): n for name, n in cur.fetchall()}


def test_two_results_at_once_in_200_runs_never_lose_the_step_after_them(new_cluster, arun):
    cluster = new_cluster(1, suffix="-parallel", concurrency=2, env={"AAA_TEST_STALL_AFTER": "3600"})
    task = script(
        turns=TURNS, tool="slow", args={"tag": "parallel", "seconds": TOOL_SECONDS}, parallel=PARALLEL, latency=LATENCY
    )

    async def main():
        async with make_engine(cluster.queues, poll_interval=POLL) as engine:
            runs = await asyncio.gather(*(engine.start(loop(), {"task": task}) for _ in range(RUNS)))
            try:
                outcomes = await asyncio.wait_for(asyncio.gather(*(r.result() for r in runs)), HUNG)
            except asyncio.TimeoutError:
                # Which runs stopped where, and what the worker said: the next hang
                # names its race.
                stuck = []
                for r in runs:
                    events = await r.events()
                    if not any(e.type == RUN_COMPLETED for e in events):
                        stuck.append((r.run_id, [(e.seq, e.type, e.data.get("call_id") or "") for e in events[-5:]]))
                print(f"\nstuck: {len(stuck)} runs: {stuck[:5]}\nerrors: {cluster.errors()[:20]}\n{cluster.logs()}")
                raise
            return outcomes, [await r.events() for r in runs]

    outcomes, logs = arun(main(), timeout=HUNG + 60)
    # The worker's processes (one loop each) hold at most SIZE store connections: none
    # is leaked, by a call dropped midway or a connection not used again.
    held, pool = store_connections(), cluster.workers[0].children()
    assert pool and sum(held.get(pid, 0) for pid in pool) >= 1, (held, pool)
    assert all(held.get(pid, 0) <= SIZE for pid in pool), (held, pool)
    unsuccessful = [
        (o, [(e.type, e.data) for e in events][-3:]) for o, events in zip(outcomes, logs) if o.outcome != "success"
    ]
    assert not unsuccessful, (Counter(o.outcome for o in outcomes), unsuccessful[:2])
    for events in logs:
        assert Counter(e.type for e in events)[RUN_COMPLETED] == 1
        assert Counter(e.type for e in events)[TOOL_COMPLETED] == (TURNS - 1) * PARALLEL
        assert [e.seq for e in events] == list(range(1, len(events) + 1))
        _each_request_has_one_result(events)
    assert cluster.errors() == [], cluster.errors()[:5]
