"""A Pydantic AI agent holds a conversation: one ``agent.run`` per message with the
ones before as its history (its requests carry only the new message), and a tool it
defers to a person (``CallDeferred``) is a question whose answer is the call's result."""

from __future__ import annotations

from aaa_django.algos.pydantic_agent import PydanticAIAgent, agent_tools
from aaa_django.events import InMemoryEventStore
from aaa_django.llm import LLMHandler
from aaa_django.llm.pydantic_ai_client import PydanticAIClient
from aaa_django.runtime import Engine
from aaa_django.runtime.conversation import ConversationError
from aaa_django.runtime.event_types import (
    LLM_REQUESTED,
    MESSAGE_SENT,
    QUESTION_ASKED,
    TOOL_COMPLETED,
)
from aaa_django.tools import ToolHandler, ToolRegistry
from tests.runtime.helpers import arun, of_type

from . import agents


def test_an_agent_converses_and_asks_a_person_through_a_deferred_tool():
    async def main():
        engine = Engine(store=InMemoryEventStore())
        LLMHandler(PydanticAIClient(agents.chat.model)).attach(engine)
        ToolHandler(ToolRegistry(agent_tools(agents.chat))).attach(engine)
        async with engine:
            run = await engine.start(
                PydanticAIAgent("tests.conversations.agents:chat"), {"task": "hello"}, conversation=True
            )
            await run.waiting(timeout=30)
            await run.say("how are you")
            await run.waiting(timeout=30)
            await run.say("book")
            (qid,) = (await run.waiting(timeout=30)).questions
            try:
                await run.answer(qid, 9)
            except ConversationError as exc:
                bad = exc
            await run.answer(qid, 2)
            meta = await run.waiting(timeout=30)
            return bad, meta, await run.events()

    bad, meta, log = arun(main())
    assert [e.data["content"] for e in of_type(log, MESSAGE_SENT)] == [
        "heard 'hello' (1 messages)",
        "heard 'how are you' (3 messages)",
        "booked 2 seats",
    ]
    assert meta.status == "waiting" and meta.turns == 3
    # each request after the first carries only what is new
    deltas = [[m["role"] for m in e.data["messages"]] for e in of_type(log, LLM_REQUESTED)]
    assert deltas == [["system", "user"], ["user"], ["user"], ["tool"]]
    (asked,) = of_type(log, QUESTION_ASKED)
    assert asked.data["question"] == "How many seats for Hamlet?" and asked.data["schema"] == agents.SEATS
    assert bad.code == "invalid_answer"
    assert of_type(log, TOOL_COMPLETED)[0].data["result"] == 2
