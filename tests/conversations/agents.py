"""A Pydantic AI agent that holds a conversation (``tests.conversations.agents:chat``):
its FunctionModel says what it heard and how long the conversation is; on "book" it
calls ``book``, a tool deferred to a person (Pydantic AI's ``CallDeferred`` with kind
``question``), and answers with the seats the person chose."""

from __future__ import annotations

from pydantic_ai import Agent
from pydantic_ai.exceptions import CallDeferred
from pydantic_ai.messages import (
    ModelRequest,
    ModelResponse,
    TextPart,
    ToolCallPart,
    ToolReturnPart,
    UserPromptPart,
)
from pydantic_ai.models.function import AgentInfo, FunctionModel

SEATS = {"type": "integer", "minimum": 1, "maximum": 4}


def talk(messages: list, info: AgentInfo) -> ModelResponse:
    prompts = [
        p.content for m in messages if isinstance(m, ModelRequest) for p in m.parts if isinstance(p, UserPromptPart)
    ]
    last = messages[-1].parts[-1]
    if isinstance(last, ToolReturnPart):
        return ModelResponse(parts=[TextPart(f"booked {last.content} seats")])
    if prompts[-1] == "book":
        return ModelResponse(parts=[ToolCallPart("book", {"show": "Hamlet"}, tool_call_id="b1")])
    return ModelResponse(parts=[TextPart(f"heard {prompts[-1]!r} ({len(messages)} messages)")])


chat = Agent(FunctionModel(talk), instructions="Chat.")


@chat.tool_plain
def book(show: str) -> int:
    """Book seats for a show: the person says how many."""
    raise CallDeferred({"question": f"How many seats for {show}?", "schema": SEATS}, kind="question")
