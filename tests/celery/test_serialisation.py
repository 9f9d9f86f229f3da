"""Two workers handling events of one run at the same moment never fork a decision.

``SerialProbe`` (tests/celery/site.py) fans out tool calls whose results arrive in
both workers at once; every step after a result decides "decision k" from the number
of decisions it saw (an id of its own per step), and marks itself inside the step in
Redis. Steps of one run do overlap (a step's appends are guarded by the stream head
it read, not by a lock), yet the decisions are exactly 0..n-1, each taken from a
state that held all the earlier ones: a step that lost the race ran again. The
negative control turns the guard off in the workers and sees the same probe fork.
"""

from __future__ import annotations

from collections import Counter

from aaa_django.runtime.event_types import RUN_COMPLETED

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


def overlaps(redis, runs) -> int:
    return sum(int(redis.get(f"aaa-test:overlaps:{r.run_id}") or 0) for r in runs)


def test_overlapping_steps_of_one_run_never_fork_a_decision(cluster, arun, redis):
    runs, outcomes, logs = run_probes(arun, runs=3, hold=0.05)

    for run, outcome, events in zip(runs, outcomes, logs):
        assert outcome.outcome == "success", outcome
        decided = [e.data for e in events if e.type == "test.step.decided"]
        assert [d["k"] for d in decided] == list(range(N))
        # each decision saw at least as many results as the one before it
        seen = [d["results_seen"] for d in decided]
        assert seen == sorted(seen) and all(s > d["k"] for s, d in zip(seen, decided))
        assert [e.type for e in events].count(RUN_COMPLETED) == 1
    assert overlaps(redis, runs) > 0  # the steps did run at the same moment
    assert cluster.errors() == []


def test_without_the_guard_overlapping_steps_fork(new_cluster, arun, redis):
    # The negative control: the same probe, workers without the guard (and lock).
    unguarded = new_cluster(2, suffix="-unguarded", env={"AAA_TEST_SERIALIZE": "0"})

    runs, outcomes, logs = run_probes(arun, runs=3, hold=0.05, queues=unguarded.queues)

    assert overlaps(redis, runs) > 0
    forks = [
        k
        for events in logs
        for k, n in Counter(e.data["k"] for e in events if e.type == "test.step.decided").items()
        if n > 1
    ]
    assert forks  # two steps decided "decision k" from the same log
