"""A Pydantic AI agent on the Celery bus, in real worker processes: a worker SIGKILLed
in the middle of the agent's run (its model request in flight, after two tools ran)
and the run resumes in the other worker, to the same result as a run never
interrupted, without running any tool again.

The workers serve the agent as a site would: ``AAA["AGENTS"]`` gives them its tools,
``WORKER_SETUP`` its model (``tests.pydantic_ai.agents.setup``).
"""

from __future__ import annotations

import asyncio
from collections import Counter

import pytest
from asgiref.sync import async_to_sync, sync_to_async
from django.db import connections

from aaa_django.algos import PydanticAIAgent
from aaa_django.celery.sweeper import sweep
from aaa_django.runtime.event_types import LLM_ABANDONED, LLM_ATTEMPTED, LLM_REQUESTED, TOOL_FAILED
from tests.celery.conftest import CELERY_DB, make_engine

pytestmark = [CELERY_DB, pytest.mark.celery, pytest.mark.redis, pytest.mark.postgres]

AGENT = "tests.pydantic_ai.agents.planner"
TABLE = "pai_agent_exec"
TRIP = {"city": "Lyon", "hotel": "Hotel Lumière", "sky": "clear", "booking": "BK-13-2"}


@pytest.fixture
def workers(celery_env, tmp_path):
    from tests.celery.workers import Cluster

    with connections["postgres"].cursor() as cur:
        cur.execute(f"CREATE TABLE IF NOT EXISTS {TABLE} (tool text, arg text, pid int)")
    env = {
        **celery_env,
        "AAA_TEST_QUEUE_SUFFIX": "-agent",
        "AAA_TEST_AGENTS": AGENT,
        "AAA_TEST_WORKER_SETUP": "tests.pydantic_ai.agents.setup",
        "AAA_TEST_AGENT_TABLE": TABLE,
    }
    cluster = Cluster(env, tmp_path)
    try:
        cluster.start(2)
        yield cluster
    finally:
        cluster.stop()


def executions() -> Counter:
    with connections["postgres"].cursor() as cur:
        cur.execute(f"SELECT tool, arg FROM {TABLE}")
        rows = Counter(cur.fetchall())
        cur.execute(f"DELETE FROM {TABLE}")
    return rows


def test_an_agent_killed_mid_run_resumes_to_the_same_result_running_no_tool_twice(workers, celery_env):
    import redis as redis_py

    r = redis_py.Redis.from_url(celery_env["AAA_TEST_CELERY_BROKER"], decode_responses=True)
    r.delete("aaa-test:agent-held", "aaa-test:agent-hold:2")
    executions()
    killed: list[int] = []

    async def run_once(engine):
        run = await engine.start(PydanticAIAgent(AGENT), {"task": "Two nights in Lyon"})
        return await run.result(timeout=150), await run.events()

    async def kill_the_holder():
        # the model's second request: held (for good) in whichever worker took it
        while (pid := r.get("aaa-test:agent-held")) is None:
            await asyncio.sleep(0.05)
        (holder,) = [w for w in workers.live() if int(pid) in (w.pid, *w.children())]
        await asyncio.to_thread(holder.kill)
        killed.append(holder.pid)

    async def sweeper(engine):
        while True:  # as beat runs it: re-drives what the killed worker held
            await asyncio.sleep(1)
            await sweep(engine, stall_after=3)

    async def main():
        async with make_engine(workers.queues) as engine:
            clean = await run_once(engine)
            ran_clean = await sync_to_async(executions)()
            r.set("aaa-test:agent-hold:2", 1)
            helpers = [asyncio.ensure_future(kill_the_holder()), asyncio.ensure_future(sweeper(engine))]
            try:
                crashed = await run_once(engine)
            finally:
                for h in helpers:
                    h.cancel()
                await asyncio.gather(*helpers, return_exceptions=True)
            return clean, ran_clean, crashed, await sync_to_async(executions)()

    async def bounded():
        return await asyncio.wait_for(main(), 170)

    (clean, clean_log), ran_clean, (crashed, crashed_log), ran_crashed = async_to_sync(bounded)()

    assert len(killed) == 1 and len(workers.live()) == 1  # a worker died holding the run's model call
    assert (clean.outcome, clean.value) == ("success", {"output": TRIP})
    assert (crashed.outcome, crashed.value) == (clean.outcome, clean.value), (
        crashed.value,
        [(e.type, e.data) for e in crashed_log][-6:],
    )
    expected = Counter({("find_hotel", "Lyon"): 1, ("look_at_sky", "Lyon"): 1, ("reserve", "Hotel Lumière"): 1})
    assert ran_clean == ran_crashed == expected  # every tool ran once, crash or not
    # the same work on the log: three model requests, three tool calls, one result each;
    # and the model attempt the killed worker had in flight recorded abandoned, made again
    crashed_types, clean_types = Counter(e.type for e in crashed_log), Counter(e.type for e in clean_log)
    assert crashed_types[LLM_ABANDONED] == 1 and clean_types[LLM_ABANDONED] == 0
    assert crashed_types[LLM_ATTEMPTED] == clean_types[LLM_ATTEMPTED] + 1
    assert crashed_types - Counter({LLM_ABANDONED: 1, LLM_ATTEMPTED: 1}) == clean_types
    assert crashed_types[LLM_REQUESTED] == 3
    assert [e for e in crashed_log if e.type == TOOL_FAILED] == []
    assert workers.errors() == []
