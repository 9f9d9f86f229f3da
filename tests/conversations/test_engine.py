"""Conversations on the engine alone (the in-memory store, the in-process bus): a run
that waits for its next message, answers it with the whole conversation sent as
deltas, closes, times out idle, refuses what it cannot take; questions to people."""

from __future__ import annotations

import time

import pytest

from aaa_django.algos import Algorithm, ReAct, ToolLoop
from aaa_django.llm.fake import text, tool_call
from aaa_django.runtime import Budget
from aaa_django.runtime.conversation import TALK, ConversationError
from aaa_django.runtime.event_types import (
    CLOSE_REQUESTED,
    INPUT_VALIDATED,
    LLM_REQUESTED,
    MESSAGE_RECEIVED,
    MESSAGE_SENT,
    QUESTION_ANSWERED,
    QUESTION_EXPIRED,
    TOOL_COMPLETED,
    TOOL_FAILED,
)
from aaa_django.tools import Ask, ToolRegistry, tool
from tests.runtime.helpers import arun, make_engine, of_type


def echo(requests: list):
    """A scripted model that says what it heard: the latest user message, and how many
    messages the whole conversation had."""

    def model(request):
        requests.append(request)
        said = [m.content for m in request.messages if m.role == "user"]
        return text(f"heard {said[-1]!r} ({len(request.messages)} messages)")

    return model


def test_three_messages_each_request_carries_only_its_delta_and_the_model_gets_them_all():
    requests: list = []

    async def main():
        async with make_engine(echo(requests)) as engine:
            run = await engine.start(ToolLoop(ToolRegistry([]), system="Be brief."), {"task": "one"}, conversation=True)
            assert (await run.waiting(timeout=5)).status == "waiting"
            await run.say("two", by="alice")
            assert (await run.waiting(timeout=5)).turns == 2
            await run.say("three", by="alice")
            meta = await run.waiting(timeout=5)
            return meta, await run.events()

    meta, log = arun(main())
    assert meta.status == "waiting" and meta.turns == 3 and meta.awaiting
    third = requests[2].messages
    assert [(m.role, m.content) for m in third] == [
        ("system", "Be brief."),
        ("user", "one"),
        ("assistant", "heard 'one' (2 messages)"),
        ("user", "two"),
        ("assistant", "heard 'two' (4 messages)"),
        ("user", "three"),
    ]
    # the log: each request carries only what is new since the previous one
    deltas = [[(m["role"], m["content"]) for m in e.data["messages"]] for e in of_type(log, LLM_REQUESTED)]
    assert deltas == [[("system", "Be brief."), ("user", "one")], [("user", "two")], [("user", "three")]]
    assert [e.data["content"] for e in of_type(log, MESSAGE_SENT)] == [
        "heard 'one' (2 messages)",
        "heard 'two' (4 messages)",
        "heard 'three' (6 messages)",
    ]
    assert [(e.data["content"], e.data["turn"], e.data["by"]) for e in of_type(log, MESSAGE_RECEIVED)] == [
        ("two", 2, "alice"),
        ("three", 3, "alice"),
    ]


def test_a_message_to_a_run_that_is_not_waiting_is_refused_and_not_appended():
    async def slow(request):
        import asyncio

        await asyncio.sleep(0.2)
        return text("done")

    async def main():
        async with make_engine(slow) as engine:
            run = await engine.start(ToolLoop(ToolRegistry([])), {"task": "one"}, conversation=True)
            with pytest.raises(ConversationError) as answering:
                await run.say("too soon")
            await run.waiting(timeout=5)
            plain = await engine.start(ToolLoop(ToolRegistry([])), {"task": "one"})
            await plain.result(timeout=5)
            with pytest.raises(ConversationError) as ended:
                await plain.say("hello?")
            return answering.value, ended.value, await run.events()

    answering, ended, log = arun(main())
    assert answering.code == "not_waiting" and "answering" in str(answering)
    assert ended.code == "ended"
    assert not of_type(log, MESSAGE_RECEIVED)


def test_close_ends_a_waiting_conversation_success_with_its_last_reply():
    async def main():
        async with make_engine(echo([])) as engine:
            run = await engine.start(ToolLoop(ToolRegistry([])), {"task": "one"}, conversation=True)
            await run.waiting(timeout=5)
            await run.say("two")
            await run.waiting(timeout=5)
            assert await run.close(by="alice")
            outcome = await run.result(timeout=5)
            with pytest.raises(ConversationError) as again:
                await run.close(by="alice")
            return outcome, again.value, await run.events()

    outcome, again, log = arun(main())
    assert outcome.outcome == "success"
    assert outcome.value == {"text": "heard 'two' (3 messages)", "turns": 2, "closed_by": "alice"}
    assert [e.type for e in log[-2:]] == [CLOSE_REQUESTED, "aaa.run.completed"]
    assert again.code == "ended"


def test_an_idle_conversation_ends_timeout_when_its_idle_time_is_due():
    async def main():
        async with make_engine(echo([])) as engine:
            run = await engine.start(ToolLoop(ToolRegistry([])), {"task": "one"}, conversation={"idle": 600})
            meta = await run.waiting(timeout=5)
            early = await engine.fire_due(run.run_id, now=meta.idle_until - 1)
            late = await engine.fire_due(run.run_id, now=meta.idle_until)
            return meta, early, late, await run.result(timeout=5)

    meta, early, late, outcome = arun(main())
    assert meta.due == meta.idle_until and meta.idle_until > time.time() + 500
    assert early == []
    assert [e.type for e in late] == ["aaa.run.completed"]
    assert outcome.outcome == "timeout" and outcome.value == {"reason": "idle", "idle": 600.0, "turns": 1}


def test_a_message_the_budget_leaves_no_call_for_is_refused_with_the_reason():
    async def main():
        async with make_engine(echo([])) as engine:
            run = await engine.start(
                ToolLoop(ToolRegistry([])), {"task": "one"}, conversation=True, budget=Budget(model_calls=2)
            )
            await run.waiting(timeout=5)
            await run.say("two")
            await run.waiting(timeout=5)
            with pytest.raises(ConversationError) as refused:
                await run.say("three")
            return refused.value, await run.meta(), await run.events()

    refused, meta, log = arun(main())
    assert refused.code == "over_budget"
    assert str(refused) == ("the conversation's budget is spent: model_calls 2 of 2; close it or start another")
    assert meta.status == "waiting" and len(of_type(log, MESSAGE_RECEIVED)) == 1


def test_an_algorithm_that_holds_no_conversation_is_refused_at_the_start():
    from tests.api.algos import Echo

    async def main():
        async with make_engine(echo([])) as engine:
            with pytest.raises(ConversationError) as refused:
                await engine.start(Echo(), {"text": "hi"}, conversation=True)
            return refused.value, await engine.store.streams()

    refused, streams = arun(main())
    assert refused.code == "not_conversational"
    assert "tests.api.echo does not hold conversations" in str(refused)
    assert "aaa.algos.ToolLoop" in str(refused) and "aaa.algos.ReAct" in str(refused)
    assert streams == []


CITY = {
    "type": "object",
    "properties": {"city": {"enum": ["Lyon", "Porto"]}},
    "required": ["city"],
    "additionalProperties": False,
}


@tool(inline=True)
def choose_city(why: str) -> str:
    """Ask the person which city they mean."""
    raise Ask(f"Which city? ({why})", schema=CITY, expires=300)


def asks_then_answers(request):
    results = [m for m in request.messages if m.role == "tool"]
    if not results:
        return tool_call("choose_city", why="two are known")
    return text(f"you chose {results[-1].content}")


def test_a_tool_asks_a_person_and_the_answer_is_its_result():
    registry = ToolRegistry([choose_city])

    async def main():
        async with make_engine(asks_then_answers, registry) as engine:
            run = await engine.start(ToolLoop(registry), {"task": "population?"}, run_id="run-q")
            meta = await run.waiting(timeout=5)
            (qid,) = meta.questions
            talk = await engine.project(TALK, run.run_id)
            with pytest.raises(ConversationError) as bad:
                await run.answer(qid, {"city": "Paris"}, by="alice")
            await run.answer(qid, {"city": "Porto"}, by="alice")
            return meta, talk, bad.value, await run.result(timeout=5), await run.events()

    meta, talk, bad, outcome, log = arun(main())
    assert meta.status == "waiting" and meta.waits == 1
    (asked,) = talk.questions.values()
    assert asked.question == "Which city? (two are known)" and asked.schema_ == CITY
    assert bad.code == "invalid_answer"
    assert bad.errors == [{"loc": ["city"], "msg": "'Paris' is not one of ['Lyon', 'Porto']", "type": "enum"}]
    assert outcome.value == {"text": 'you chose {"city": "Porto"}'}
    (answered,) = of_type(log, QUESTION_ANSWERED)
    assert answered.data["answer"] == {"city": "Porto"} and answered.data["by"] == "alice"
    (result,) = of_type(log, TOOL_COMPLETED)
    assert result.data["result"] == {"city": "Porto"}
    assert [e.type for e in log].index(QUESTION_ANSWERED) + 1 == [e.type for e in log].index(TOOL_COMPLETED)


def test_an_unanswered_question_expires_and_the_tool_call_fails_expired():
    registry = ToolRegistry([choose_city])

    async def main():
        async with make_engine(asks_then_answers, registry) as engine:
            run = await engine.start(ToolLoop(registry), {"task": "population?"})
            meta = await run.waiting(timeout=5)
            ((qid, pending),) = meta.questions.items()
            fired = await engine.fire_due(run.run_id, now=pending.expires_at)
            with pytest.raises(ConversationError) as late:
                await run.answer(qid, {"city": "Lyon"})
            return pending, fired, late.value, await run.result(timeout=5), await run.events()

    pending, fired, late, outcome, log = arun(main())
    assert [e.type for e in fired] == [QUESTION_EXPIRED, TOOL_FAILED]
    assert fired[1].data["reason"] == "expired"
    assert late.code == "not_open"
    assert outcome.value == {"text": "you chose error (expired): the question to a person expired unanswered"}
    assert not of_type(log, QUESTION_ANSWERED)


def test_react_holds_a_conversation():
    requests: list = []

    def model(request):
        requests.append(request)
        return text(f"Thought: easy.\nFinal Answer: {request.messages[-1].content.upper()}")

    async def main():
        async with make_engine(model) as engine:
            run = await engine.start(ReAct(ToolRegistry([])), {"task": "one"}, conversation=True)
            await run.waiting(timeout=5)
            await run.say("two")
            await run.waiting(timeout=5)
            return await run.events()

    log = arun(main())
    assert [e.data["content"] for e in of_type(log, MESSAGE_SENT)] == ["ONE", "TWO"]
    assert [m.role for m in requests[1].messages] == ["system", "user", "assistant", "user"]


class Survey(Algorithm):
    """Asks a person how many seats they want (a number from 1 to 9) and ends with it,
    or ``no_solution`` when nobody answered in time."""

    name = "tests.conversations.survey"

    async def step(self, ctx, event):
        talk = await ctx.project(TALK)
        if event.type == INPUT_VALIDATED:
            ctx.ask("How many seats?", schema={"type": "integer", "minimum": 1, "maximum": 9}, key="seats", expires=60)
        for answer in talk.answers.values():
            if answer.ok:
                ctx.complete("success", {"seats": answer.value})
            else:
                ctx.complete("no_solution", {"reason": "nobody answered"})


def test_an_algorithm_asks_a_person_and_decides_from_the_answer():
    async def main():
        async with make_engine() as engine:
            run = await engine.start(Survey(), None)
            meta = await run.waiting(timeout=5)
            (qid,) = meta.questions
            with pytest.raises(ConversationError) as bad:
                await run.answer(qid, 12)
            await run.answer(qid, 3, by="bob")
            answered = await run.result(timeout=5)
            late = await engine.start(Survey(), None)
            (pending,) = (await late.waiting(timeout=5)).questions.values()
            await engine.fire_due(late.run_id, now=pending.expires_at)
            return bad.value, answered, await late.result(timeout=5), await late.events()

    bad, answered, expired, log = arun(main())
    assert bad.errors == [{"loc": [], "msg": "12 is greater than the maximum of 9", "type": "maximum"}]
    assert answered.value == {"seats": 3}
    assert expired.outcome == "no_solution"
    assert [e.type for e in of_type(log, QUESTION_EXPIRED)] == [QUESTION_EXPIRED]


def test_a_question_with_a_schema_that_is_not_one_fails_the_step():
    class Broken(Algorithm):
        name = "tests.conversations.broken"

        async def step(self, ctx, event):
            if event.type == INPUT_VALIDATED:
                ctx.ask("?", schema={"type": "nonsense"}, key="q")

    async def main():
        async with make_engine() as engine:
            run = await engine.start(Broken(), None)
            return await run.result(timeout=5)

    outcome = arun(main())
    assert outcome.outcome == "failed" and "not a valid JSON schema" in outcome.value["error"]


def test_a_conversation_replays_as_recorded_and_forks_from_a_reply():
    from aaa_django.runtime.fork import fork
    from aaa_django.runtime.replay import replay

    requests: list = []
    registry = ToolRegistry([choose_city])

    def model(request):
        requests.append(request)
        said = [m.content for m in request.messages if m.role == "user"]
        if said[-1] == "which city?" and request.messages[-1].role == "user":
            return tool_call("choose_city", why="you asked")
        return echo([])(request)

    async def main():
        async with make_engine(model, registry) as engine:
            run = await engine.start(ToolLoop(registry), {"task": "one"}, conversation={"idle": 60})
            await run.waiting(timeout=5)
            await run.say("which city?")
            (qid,) = (await run.waiting(timeout=5)).questions
            await run.answer(qid, {"city": "Lyon"})
            await run.waiting(timeout=5)
            await run.close(by="alice")
            await run.result(timeout=5)
            log = await run.events()
            replayed = await replay(log)
            first_reply = of_type(log, MESSAGE_SENT)[0]
            forked = await fork(engine, run.run_id, first_reply.seq, owner="bob")
            await forked.waiting(timeout=5)
            await forked.say("and now?")
            meta = await forked.waiting(timeout=5)
            return log, replayed, meta, await forked.events()

    log, replayed, meta, forked_log = arun(main())
    assert replayed.same, replayed.explain()
    assert meta.turns == 2 and meta.status == "waiting"
    # the fork's second request has the first exchange, copied, and its own message
    assert [(m.role, m.content) for m in requests[-1].messages] == [
        ("user", "one"),
        ("assistant", "heard 'one' (1 messages)"),
        ("user", "and now?"),
    ]
    assert [e.data["content"] for e in of_type(forked_log, MESSAGE_RECEIVED)] == ["and now?"]


class Echo(Algorithm):
    """docs/conversations.md's algorithm of your own that holds conversations."""

    name = "tests.conversations.echo"

    def converses(self) -> bool:
        return True

    async def step(self, ctx, event):
        talk = await ctx.project(TALK)
        if talk.turn <= talk.received:
            said = talk.message if talk.received else ctx.input["task"]
            ctx.reply(f"you said {said}")


def test_an_algorithm_of_your_own_holds_a_conversation_from_talk():
    async def main():
        async with make_engine(duplicate=True) as engine:  # every event delivered twice
            run = await engine.start(Echo(), {"task": "one"}, conversation=True)
            await run.waiting(timeout=5)
            await run.say("two")
            meta = await run.waiting(timeout=5)
            return meta, await run.events()

    meta, log = arun(main())
    assert meta.turns == 2
    assert [e.data["content"] for e in of_type(log, MESSAGE_SENT)] == ["you said one", "you said two"]
