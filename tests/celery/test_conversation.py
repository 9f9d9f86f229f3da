"""A conversation through Celery with its worker killed between two messages: the run
waits holding nothing (no message in the broker, no lease), the worker is SIGKILLed,
the next message is sent while no worker runs, and a new worker answers it with the
whole conversation; a tool the worker runs asks a question, answered from here; the
log holds every turn once."""

from __future__ import annotations

import asyncio

from aaa_django.algos import ToolLoop
from aaa_django.runtime.event_types import (
    LLM_COMPLETED,
    LLM_REQUESTED,
    MESSAGE_RECEIVED,
    MESSAGE_SENT,
    QUESTION_ANSWERED,
    QUESTION_ASKED,
)
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
            await run.say("which city?", by="alice")
            asked = await run.waiting(timeout=60)
            (qid,) = asked.questions
            await run.answer(qid, {"city": "Lyon"}, by="alice")
            fourth = await run.waiting(timeout=60)
            await run.close(by="alice")
            outcome = await run.result(timeout=60)
            return first, busy, sent, second, third, fourth, outcome, await run.events()

    first, busy, sent, second, third, fourth, outcome, log = arun(main())
    assert first.status == "waiting" and first.turns == 1
    assert not busy  # waiting, the run holds no lease
    assert sent.data["turn"] == 2
    assert second.status == "waiting" and second.turns == 2 and third.turns == 3 and fourth.turns == 4
    assert [e.data["content"] for e in log if e.type == MESSAGE_SENT] == [
        "heard 'one' (1 messages)",
        "heard 'two' (3 messages)",
        "heard 'three' (5 messages)",
        'you chose {"city": "Lyon"}',
    ]
    assert [e.data["content"] for e in log if e.type == MESSAGE_RECEIVED] == ["two", "three", "which city?"]
    # each turn once: one request and one reply per message, each request only its delta
    requests = [e for e in log if e.type == LLM_REQUESTED]
    assert [[m["content"] for m in e.data["messages"]] for e in requests] == [
        ["one"],
        ["two"],
        ["three"],
        ["which city?"],
        ['{"city": "Lyon"}'],
    ]
    assert len([e for e in log if e.type == LLM_COMPLETED]) == 5
    assert [e.type for e in log if e.type.startswith("aaa.question.")] == [QUESTION_ASKED, QUESTION_ANSWERED]
    assert len({e.id for e in log}) == len(log)
    assert outcome.outcome == "success"
    assert outcome.value == {"text": 'you chose {"city": "Lyon"}', "turns": 4, "closed_by": "alice"}
