"""What the log has answered a :class:`~aaa_django.algos.pydantic_agent.PydanticAIAgent`:
its model requests in order, its tool calls by call id, and in a conversation the
person's messages after the first and the replies sent (the ``JOURNAL`` projection its
steps replay the agent from)."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, Field

from aaa_django.events import Event, Projection
from aaa_django.runtime.event_types import (
    LLM_COMPLETED,
    LLM_FAILED,
    LLM_REQUESTED,
    MESSAGE_RECEIVED,
    MESSAGE_SENT,
    TOOL_COMPLETED,
    TOOL_FAILED,
    TOOL_REQUESTED,
)


class ModelAnswer(BaseModel):
    request_id: str
    #: the ``aaa.llm.completed`` data's message, usage, model, finish reason; None while awaited
    message: dict[str, Any] | None = None
    usage: dict[str, Any] = Field(default_factory=dict)
    model: str | None = None
    finish_reason: str | None = None
    #: ``{"reason", "error"}`` of an ``aaa.llm.failed``
    error: dict[str, Any] | None = None


class ToolAnswer(BaseModel):
    ok: bool
    result: Any = None
    error: str | None = None


class Journal(BaseModel):
    """The agent's durable units as the log has them: model requests in order, tool
    calls by call id."""

    models: list[ModelAnswer] = Field(default_factory=list)
    requested: list[str] = Field(default_factory=list)
    tools: dict[str, ToolAnswer] = Field(default_factory=dict)
    #: a conversation: the messages after the task, and the replies sent
    prompts: list[str] = Field(default_factory=list)
    replies: int = 0

    def __deepcopy__(self, memo: dict | None = None) -> Journal:
        new = self.model_copy()
        new.models = [m.model_copy() for m in self.models]
        new.requested = list(self.requested)
        new.tools = dict(self.tools)
        new.prompts = list(self.prompts)
        return new

    @property
    def waiting(self) -> bool:
        """A model request or a tool call is still out."""
        if self.models and self.models[-1].message is None and self.models[-1].error is None:
            return True
        return any(c not in self.tools for c in self.requested)


def _apply(j: Journal, e: Event) -> Journal:
    t, d = e.type, e.data
    if t == LLM_REQUESTED and str(d.get("tag") or "").startswith("agent-"):
        j.models.append(ModelAnswer(request_id=e.id))
    elif t in (LLM_COMPLETED, LLM_FAILED):
        for m in reversed(j.models):
            if m.request_id == d.get("request_id"):
                if t == LLM_COMPLETED:
                    m.message = (d.get("response") or {}).get("message") or {}
                    m.finish_reason = (d.get("response") or {}).get("finish_reason")
                    m.usage = dict(d.get("usage") or {})
                    m.model = d.get("model")
                else:
                    m.error = {"reason": d.get("reason"), "error": d.get("error")}
                break
    elif t == TOOL_REQUESTED:
        j.requested.append(d["call_id"])
    elif t == TOOL_COMPLETED:
        j.tools[d["call_id"]] = ToolAnswer(ok=True, result=d.get("result"))
    elif t == TOOL_FAILED:
        j.tools[d["call_id"]] = ToolAnswer(ok=False, error=f"{d.get('reason')}: {d.get('error')}")
    elif t == MESSAGE_RECEIVED:
        j.prompts.append(d.get("content") or "")
    elif t == MESSAGE_SENT:
        j.replies += 1
    return j


JOURNAL: Projection[Journal] = Projection(
    Journal,
    _apply,
    name="aaa.algos.pydantic_agent.JOURNAL",
    version=2,
    state_type=Journal,
    every=64,
)
