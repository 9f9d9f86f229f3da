"""ToolLoop runs delivered by real Celery workers, on PostgreSQL and Redis.

The pytest process only starts runs and reads logs; every step (validation, the
algorithm, the model, the tools) runs in the worker processes.
"""

from __future__ import annotations

from collections import Counter

from aaa_django.runtime.event_types import (
    INPUT_VALIDATED,
    LLM_ATTEMPTED,
    LLM_COMPLETED,
    LLM_REQUESTED,
    RUN_COMPLETED,
    RUN_STARTED,
    TOOL_COMPLETED,
    TOOL_REQUESTED,
)

from .conftest import CELERY_DB, make_engine
from .site import loop, script

pytestmark = [CELERY_DB]

TURN = [LLM_REQUESTED, LLM_ATTEMPTED, LLM_COMPLETED, TOOL_REQUESTED, TOOL_COMPLETED]


def test_a_tool_loop_runs_to_success_in_the_workers(cluster, arun):
    async def main():
        async with make_engine() as engine:
            run = await engine.start(loop(), {"task": script(turns=5)})
            outcome = await run.result(timeout=30)
            return outcome, await run.events(), engine.bus.sent

    outcome, events, sent = arun(main())

    assert outcome.outcome == "success" and outcome.value == {"text": "done after 4 tool turns"}
    assert [e.type for e in events] == [
        RUN_STARTED,
        INPUT_VALIDATED,
        *TURN * 4,
        LLM_REQUESTED,
        LLM_ATTEMPTED,
        LLM_COMPLETED,
        RUN_COMPLETED,
    ]
    assert sent == 1  # the test process enqueued the start; the workers did the rest


def test_many_runs_at_once_each_end_once(cluster, arun):
    async def main():
        async with make_engine() as engine:
            runs = [await engine.start(loop(), {"task": script(turns=3, parallel=2)}) for _ in range(10)]
            outcomes = [await r.result(timeout=60) for r in runs]
            return outcomes, [await r.events() for r in runs]

    outcomes, logs = arun(main())

    assert {o.outcome for o in outcomes} == {"success"}
    for events in logs:
        counts = Counter(e.type for e in events)
        assert counts[RUN_COMPLETED] == 1
        assert counts[LLM_REQUESTED] == counts[LLM_COMPLETED] == 3
        assert counts[TOOL_REQUESTED] == counts[TOOL_COMPLETED] == 4


def test_a_run_whose_log_is_in_redis(cluster, arun, celery_env):
    # The message names the store ("redis", url, prefix): the workers open the same log.
    import uuid

    from aaa_django.celery.bus import DistributedBus
    from aaa_django.site.engines import build_engine
    from aaa_django.store.redis import RedisEventStore

    store = RedisEventStore(celery_env["AAA_TEST_CELERY_BROKER"], prefix=f"log-{uuid.uuid4().hex[:8]}")

    async def main():
        async with build_engine(store=store, bus=DistributedBus(queues=cluster.queues), poll_interval=0.05) as engine:
            run = await engine.start(loop(), {"task": script(turns=3)})
            return await run.result(timeout=30), await run.events()

    outcome, events = arun(main())

    assert outcome.outcome == "success"
    assert [e.type for e in events].count(TOOL_COMPLETED) == 2
    assert cluster.errors() == []


def test_a_waiter_is_woken_by_the_run_ended_notice(cluster, arun):
    # A poll interval longer than the wait's timeout: only the notice a worker
    # publishes when it ends the run can end the wait in time.
    async def main():
        async with make_engine(poll_interval=600) as engine:
            run = await engine.start(loop(), {"task": script(turns=2)})
            outcome = await run.result(timeout=30)
            return outcome, engine.bus._listener is not None

    outcome, listening = arun(main())

    assert outcome.outcome == "success"
    assert listening


def _where(tag: str) -> list[dict]:
    import json

    from .site import _redis

    return [json.loads(x) for x in _redis().lrange(f"aaa-test:{tag}", 0, -1)]


def test_a_delivery_runs_on_the_worker_loop_which_delivers_its_own_events(cluster, arun):
    # Every delivery of a worker process runs on its loop's thread (the task's thread
    # hands it over); what the worker appends for the queues it takes is delivered
    # on that loop, without a message.
    import uuid

    tag = f"where-{uuid.uuid4().hex[:8]}"

    async def main():
        async with make_engine() as engine:
            run = await engine.start(loop(), {"task": script(turns=4, tool="where", args={"tag": tag})})
            return await run.result(timeout=30)

    assert arun(main()).outcome == "success"
    seen = _where(tag)
    assert len(seen) >= 3 and {s["thread"] for s in seen} == {"aaa-worker-loop"}
    # the run's first delivery came by message; the tool calls, by the worker's loop
    assert min(s["taken"] for s in seen) > 0
    assert cluster.errors() == []
