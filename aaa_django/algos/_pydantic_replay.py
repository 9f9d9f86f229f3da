"""One step of a :class:`~aaa_django.algos.pydantic_agent.PydanticAIAgent`: replay the
agent, answering its model requests and tool calls from the log, and ask for the first
one the log does not answer (needs ``pydantic-ai-slim``; imported by the step only).

Only public hooks of Pydantic AI are used: a capability passed to ``agent.run``
(``wrap_model_request``, ``wrap_tool_execute``, ``handle_deferred_tool_calls``) and its
deferred-tools protocol (``CallDeferred``, ``DeferredToolRequests``), the way its own
durable integrations stand between the agent and the work.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, TypeVar

from pydantic_ai import messages as pm
from pydantic_ai.capabilities import AbstractCapability
from pydantic_ai.capabilities.abstract import ValidatedToolArgs, WrapModelRequestHandler, WrapToolExecuteHandler
from pydantic_ai.exceptions import CallDeferred, ToolFailed, UsageLimitExceeded
from pydantic_ai.models import ModelRequestContext
from pydantic_ai.models.test import TestModel
from pydantic_ai.settings import ModelSettings
from pydantic_ai.tools import (
    DeferredToolRequests,
    DeferredToolResults,
    RunContext,
    ToolApproved,
    ToolDefinition,
    ToolDenied,
)
from pydantic_core import to_jsonable_python

from aaa_django.data.jsonvalue import JSONObject
from aaa_django.llm.conversation import CONVERSATION
from aaa_django.llm.messages import Message, Usage
from aaa_django.llm.pydantic_ai_messages import from_model_messages, to_model_response, tool_specs
from aaa_django.llm.routes import agent_key
from aaa_django.runtime.event_types import LLM_REQUESTED

if TYPE_CHECKING:  # pragma: no cover
    from aaa_django.runtime import Ctx

    from .agent_journal import Journal

#: the conversation thread of the agent's model requests
THREAD = "agent"

E = TypeVar("E", bound=BaseException)


class Suspend(Exception):
    """The agent asked for a model response the log does not have yet."""


@dataclass
class Replay(AbstractCapability[object]):
    """Answers the agent's durable units from the journal; see the module docstring."""

    journal: Journal
    count: int = 0
    #: ``(index, ModelRequestContext)`` of the first unanswered model request
    pending: tuple[int, ModelRequestContext] | None = None
    asked: set[str] = field(default_factory=set)

    @classmethod
    def get_serialization_name(cls) -> str | None:
        return None

    async def wrap_model_request(
        self, ctx: RunContext[object], *, request_context: ModelRequestContext, handler: WrapModelRequestHandler
    ) -> pm.ModelResponse:
        k = self.count
        self.count += 1
        if k < len(self.journal.models):
            m = self.journal.models[k]
            return to_model_response(
                Message.model_validate(m.message or {"role": "assistant"}),
                usage=Usage.model_validate(m.usage),
                model=m.model,
                finish_reason=m.finish_reason,
            )
        self.pending = (k, request_context)
        raise Suspend()

    async def wrap_tool_execute(
        self,
        ctx: RunContext[object],
        *,
        call: pm.ToolCallPart,
        tool_def: ToolDefinition,
        args: ValidatedToolArgs,
        handler: WrapToolExecuteHandler,
    ) -> object:
        answer = self.journal.tools.get(call.tool_call_id)
        if answer is None:
            raise CallDeferred()  # the ToolHandler runs it: asked for when the run pauses
        if answer.ok:
            return answer.result
        raise ToolFailed(answer.error or "the tool failed")

    async def handle_deferred_tool_calls(
        self, ctx: RunContext[object], *, requests: DeferredToolRequests
    ) -> DeferredToolResults | None:
        # A call that needs approval got it at our gate (its result is in the log):
        # approve it here, and wrap_tool_execute hands over that result.
        approved: dict[str, bool | ToolApproved | ToolDenied] = {
            c.tool_call_id: True for c in requests.approvals if c.tool_call_id in self.journal.tools
        }
        return DeferredToolResults(approvals=approved) if approved else None


async def replay(
    ctx: Ctx, agent: Any, journal: Journal, *, model: str | None, path: str
) -> tuple[str, JSONObject] | None:
    """Replay the agent once: the run's outcome when it ended, else None (this step
    asked for a model response or tool calls, replied in a conversation, or waits for
    the next message). In a conversation, one ``agent.run`` per message, each with the
    messages before it as its history."""
    capability = Replay(journal)
    declared = agent.output_type
    types = list(declared) if isinstance(declared, (list, tuple)) else [declared]
    # An agent without a model of its own is answered by the site's: the replay needs a
    # model to hold (every request is answered from the log, none reaches it).
    stand_in = {"model": TestModel()} if agent.model is None else {}
    prompts = [ctx.input.task, *journal.prompts]
    history = None
    for turn, prompt in enumerate(prompts, 1):
        try:
            result = await agent.run(
                prompt,
                message_history=history,
                capabilities=[capability],
                output_type=[*types, DeferredToolRequests],
                **stand_in,
            )
        except Exception as exc:
            if _find(exc, Suspend) is not None:
                await _ask_model(ctx, capability, model, path)
                return None
            limit = _find(exc, UsageLimitExceeded)
            if limit is not None:
                return "budget_exceeded", {"error": str(limit), "limit": "pydantic-ai"}
            return "failed", {"error": f"{type(exc).__name__}: {exc}"}
        output = result.output
        if isinstance(output, DeferredToolRequests):
            asked = set(journal.requested)
            for call in [*output.calls, *output.approvals]:
                if call.tool_call_id not in asked:
                    ctx.tool(
                        call.tool_name, call.args_as_dict(), call_id=call.tool_call_id, key=("agent", call.tool_call_id)
                    )
            return None
        if ctx.conversation is None:
            return "success", {"output": to_jsonable_python(output)}
        if turn == len(prompts) and journal.replies < turn:
            ctx.reply(_as_text(output), request_id=journal.models[-1].request_id if journal.models else None)
        history = result.all_messages()
    return None


def _as_text(output: object) -> str:
    """An agent's output as a reply: text as it is, anything else as JSON."""
    return output if isinstance(output, str) else json.dumps(to_jsonable_python(output), ensure_ascii=False)


async def _ask_model(ctx: Ctx, capability: Replay, model: str | None, path: str) -> None:
    assert capability.pending is not None  # set by the request that suspended the replay
    k, request = capability.pending
    messages = _once(from_model_messages(_with_instructions(request)))
    specs, output = tool_specs(request.model_request_parameters)
    seen = (await ctx.project(CONVERSATION)).messages(THREAD)
    thread = THREAD
    if messages[: len(seen)] == seen:
        delta = messages[len(seen) :]
    else:  # the agent's history is not the conversation so far (it rewrote it): start afresh
        thread, delta = f"{THREAD}-{k + 1}", messages
    data: dict[str, object] = {
        "messages": [m.model_dump(mode="json", exclude_none=True) for m in delta],
        "thread": thread,
        "tag": f"agent-{k + 1}",
        "tools": specs,
    }
    if any(s.get("kind") == "output" for s in specs):
        data["output"] = output
    if model is not None:  # the run names a model: the site's client is asked for it
        data["model"] = model
    else:  # the agent's own model answers (llm.routes.AgentModels)
        data["agent"] = agent_key(path)
    params = _params(request.model_settings)
    if params:
        data["params"] = params
    ctx.emit(LLM_REQUESTED, data, key=("llm", ("agent", k + 1)))


def _with_instructions(request: ModelRequestContext) -> list[pm.ModelMessage]:
    """The request's messages, its instructions on its last ``ModelRequest`` (where the
    agent renders them from ``instruction_parts`` when it sends them)."""
    messages = list(request.messages)
    parts = request.model_request_parameters.instruction_parts
    if parts and messages and isinstance(messages[-1], pm.ModelRequest) and not messages[-1].instructions:
        text = "\n\n".join(p.content for p in parts if p.content)
        messages[-1] = replace(messages[-1], instructions=text or None)
    return messages


def _once(messages: list[Message]) -> list[Message]:
    """Without a system message that repeats the one before it (the agent's instructions
    go with every request it makes; the conversation needs them once)."""
    out: list[Message] = []
    last_system = None
    for m in messages:
        if m.role == "system":
            if m.content == last_system:
                continue
            last_system = m.content
        out.append(m)
    return out


def _params(settings: ModelSettings | None) -> dict[str, Any]:
    """The JSON-ready model settings (what a handler's client can pass on)."""
    out = {}
    for k, v in dict(settings or {}).items():
        try:
            json.dumps(v)
        except TypeError:
            continue
        out[k] = v
    return out


def _find(exc: BaseException, kind: type[E]) -> E | None:
    if isinstance(exc, kind):
        return exc
    if isinstance(exc, BaseExceptionGroup):
        for inner in exc.exceptions:
            found = _find(inner, kind)
            if found is not None:
                return found
    cause = exc.__cause__ or exc.__context__
    return _find(cause, kind) if cause is not None and cause is not exc else None
