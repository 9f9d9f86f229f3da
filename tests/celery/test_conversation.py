"""A conversation through Celery with its worker killed between two messages: the run
waits holding nothing (no message in the broker, no lease), the worker is SIGKILLed,
the next message is sent while no worker runs, and a new worker answers it with the
whole conversation; the log holds every turn once."""

from __future__ import annotations

import asyncio

from aaa_django.algos import ToolLoop
from aaa_django.runtime.event_types import LLM_COMPLETED, LLM_REQUESTED, MESSAGE_RECEIVED, MESSAGE_SENT
from aaa_django.tools import ToolRegistry

from .conftest import CELERY_DB, make_engine

pytestmark = [CELERY_DB]

SETUP = "tests.conversations.celery_site.setup"


def test_a_conversation_goes_on_after_its_worker_is_killed_between_two_messages(new_cluster, arun):
    from aaa_django.celery.bus import coordinator

    cluster = new_cluster(1, suffix="-talk", env={"AAA_TEST_WORKER_SETUP": SETUP})
    (worker,) = cluster.workers

    async def main():
        async with make_engine(cluster.queues) as engine:
            run = await engine.start(ToolLoop(ToolRegistry([])), {"task": "one"}, conversation=True)
            first = await run.waiting(timeout=60)
            busy = await asyncio.to_thread(coordinator().is_busy, run.run_id)
            await asyncio.to_thread(worker.kill)
            sent = await run.say("two", by="alice")  # no worker runs: the broker keeps it
            await asyncio.to_thread(cluster.start, 1)
            second = await run.waiting(timeout=120)
            await run.say("three", by="alice")
            third = await run.waiting(timeout=60)
            await run.close(by="alice")
            outcome = await run.result(timeout=60)
            return first, busy, sent, second, third, outcome, await run.events()

    first, busy, sent, second, third, outcome, log = arun(main())
    assert first.status == "waiting" and first.turns == 1
    assert not busy  # waiting, the run holds no lease
    assert sent.data["turn"] == 2
    assert second.status == "waiting" and second.turns == 2 and third.turns == 3
    assert [e.data["content"] for e in log if e.type == MESSAGE_SENT] == [
        "heard 'one' (1 messages)", "heard 'two' (3 messages)", "heard 'three' (5 messages)"]
    assert [e.data["content"] for e in log if e.type == MESSAGE_RECEIVED] == ["two", "three"]
    # each turn once: one request and one reply per message, each request only its delta
    requests = [e for e in log if e.type == LLM_REQUESTED]
    assert [[m["content"] for m in e.data["messages"]] for e in requests] == [["one"], ["two"], ["three"]]
    assert len([e for e in log if e.type == LLM_COMPLETED]) == 3
    assert len({e.id for e in log}) == len(log)
    assert outcome.outcome == "success"
    assert outcome.value == {"text": "heard 'three' (5 messages)", "turns": 3, "closed_by": "alice"}
