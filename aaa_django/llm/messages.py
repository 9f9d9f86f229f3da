"""Messages, requests and responses exchanged with a model (pydantic, immutable).

Messages are frozen so a conversation can be shared between readers without copies.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from aaa_django.data.jsonvalue import JSONObject


class ToolCall(BaseModel):
    """A tool call asked for by the model. ``id`` is assigned by the handler when the
    client gives none (deterministic: derived from the request id)."""

    model_config = ConfigDict(frozen=True)

    id: str | None = None
    name: str
    arguments: dict[str, Any] = Field(default_factory=dict)


class Message(BaseModel):
    """One chat message: ``system``, ``user``, ``assistant`` or ``tool``."""

    model_config = ConfigDict(frozen=True)

    role: Literal["system", "user", "assistant", "tool"]
    content: str | None = None
    tool_calls: tuple[ToolCall, ...] = ()
    #: for ``role="tool"``: the call this message answers
    tool_call_id: str | None = None
    name: str | None = None

    def to_dict(self) -> JSONObject:
        """The JSON form stored in events (empty fields left out)."""
        return self.model_dump(mode="json", exclude_none=True, exclude_defaults=True) | {"role": self.role}


def system(content: str) -> Message:
    return Message(role="system", content=content)


def user(content: str) -> Message:
    return Message(role="user", content=content)


def assistant(content: str | None = None, tool_calls: tuple[ToolCall, ...] = ()) -> Message:
    return Message(role="assistant", content=content, tool_calls=tool_calls)


def tool_result(call_id: str, name: str | None, content: str) -> Message:
    return Message(role="tool", content=content, tool_call_id=call_id, name=name)


class Usage(BaseModel):
    """Tokens a call used."""

    input_tokens: int = 0
    output_tokens: int = 0


@dataclass(frozen=True, slots=True)
class LLMRequest:
    """What a client is asked: the *whole* conversation, rebuilt from the log.

    A plain dataclass: the messages are validated once, when folded from the log,
    not again on every request (a long conversation would make that quadratic).
    """

    messages: list[Message]
    tools: list[JSONObject] = field(default_factory=list)
    model: str | None = None
    tag: str | None = None
    params: JSONObject = field(default_factory=dict)
    #: structured output: ``{"allow_text": bool}`` when some ``tools`` are output tools
    #: (``"kind": "output"``; a client without the notion offers them as plain tools)
    output: JSONObject | None = None
    #: the ``aaa.llm.requested`` event id and its run
    request_id: str | None = None
    run_id: str | None = None
    #: the Pydantic AI agent asking (its dotted path), to be answered by its own model
    #: (:class:`~aaa_django.llm.routes.AgentModels`)
    agent: str | None = None


class LLMResponse(BaseModel):
    """A client's answer: the assistant message and what it cost."""

    message: Message
    usage: Usage = Field(default_factory=Usage)
    cost: float = 0.0
    model: str | None = None
    finish_reason: str | None = None
    #: False: the model has no price, so ``cost`` is 0 (recorded as ``"priced": false``)
    priced: bool = True
