"""Two workers handling events of one run at the same moment never fork a decision.

``SerialProbe`` (tests/celery/site.py) fans out tool calls whose results arrive in
both workers at once; every step after a result decides "decision k" from the number
of decisions it saw, and marks itself inside the step in Redis. With the run lock, no
two steps of a run are ever inside at once, and the decisions are exactly 0..n-1,
each taken from a state that held all the earlier ones. The negative control turns
the lock off in the workers and sees steps overlap: the probe can tell.
"""

from __future__ import annotations

from aaa_django.runtime import types as T

from .conftest import CELERY_DB, make_engine
from .site import SerialProbe

pytestmark = [CELERY_DB]

N = 8


def run_probes(arun, runs: int, hold: float, queues=None):
    async def main():
        async with make_engine(queues) as engine:
            started = [await engine.start(SerialProbe(n=N, hold=hold), {}) for _ in range(runs)]
            outcomes = [await r.result(timeout=60) for r in started]
            return started, outcomes, [await r.events() for r in started]

    return arun(main())


def test_steps_of_one_run_never_overlap_and_decide_once(cluster, arun, redis):
    runs, outcomes, logs = run_probes(arun, runs=3, hold=0.02)

    for run, outcome, events in zip(runs, outcomes, logs):
        assert outcome.outcome == "success", outcome
        assert redis.get(f"aaa-test:overlaps:{run.run_id}") is None
        decided = [e.data for e in events if e.type == "test.step.decided"]
        assert [d["k"] for d in decided] == list(range(N))
        # each decision saw at least as many results as the one before it
        seen = [d["results_seen"] for d in decided]
        assert seen == sorted(seen) and all(s > d["k"] for s, d in zip(seen, decided))
        assert [e.type for e in events].count(T.RUN_COMPLETED) == 1
    assert cluster.errors() == []


def test_without_the_run_lock_steps_do_overlap(new_cluster, arun, redis):
    # The negative control: the same probe, workers without the lock.
    unlocked = new_cluster(2, suffix="-unlocked", env={"AAA_TEST_SERIALIZE": "0"})

    runs, outcomes, _ = run_probes(arun, runs=3, hold=0.05, queues=unlocked.queues)

    overlaps = sum(int(redis.get(f"aaa-test:overlaps:{r.run_id}") or 0) for r in runs)
    assert overlaps > 0
