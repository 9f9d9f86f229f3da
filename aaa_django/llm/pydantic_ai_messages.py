"""Our messages and Pydantic AI's, both ways (pure; needs ``pydantic-ai-slim``).

Used by :class:`~aaa_django.llm.pydantic_ai_client.PydanticAIClient` (our request to a
Pydantic AI ``Model``, its reply back to ours) and by the durable agent
(:mod:`aaa_django.algos.pydantic_agent`: the agent's request to ours, our recorded reply
back to the agent's ``ModelResponse``).

=====================================  =============================================
Ours                                   Pydantic AI
=====================================  =============================================
``system`` message                     ``SystemPromptPart`` in a ``ModelRequest``
``user`` message                       ``UserPromptPart``
``tool`` message (``tool_call_id``)    ``ToolReturnPart`` (``tool_call_id``); a retry
                                       prompt becomes a ``tool`` (or ``user``) message
``assistant`` message                  ``ModelResponse``: ``TextPart`` + ``ToolCallPart``
tool spec ``{"name", "description",    ``ToolDefinition``; ``"kind": "output"`` marks
"parameters"}``                        an output tool (structured output)
=====================================  =============================================

Consecutive request messages (system, user, tool) share one ``ModelRequest``, as Pydantic
AI alternates requests and responses. Parts with no equivalent here (thinking, images,
files, native tools) are left out: the text and the tool calls are what a run decides on.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from pydantic_ai import messages as pm
from pydantic_ai.models import ModelRequestParameters
from pydantic_ai.settings import ModelSettings
from pydantic_ai.tools import ToolDefinition
from pydantic_ai.usage import RequestUsage

from aaa_django.data.jsonvalue import JSONObject

from .messages import Message, ToolCall, Usage

#: Pydantic AI's finish reasons in our words (the OpenAI client's)
FINISH = {"tool_call": "tool_calls", "stop": "stop", "length": "length", "content_filter": "content_filter"}


# -- ours -> Pydantic AI ---------------------------------------------------------------------


def to_model_messages(messages: Iterable[Message]) -> list[pm.ModelMessage]:
    """Our conversation as Pydantic AI's ``ModelRequest``/``ModelResponse`` list."""
    out: list[pm.ModelMessage] = []
    parts: list[pm.ModelRequestPart] = []
    for m in messages:
        if m.role == "assistant":
            if parts:
                out.append(pm.ModelRequest(parts=parts))
                parts = []
            out.append(to_model_response(m))
        elif m.role == "system":
            parts.append(pm.SystemPromptPart(content=m.content or ""))
        elif m.role == "user":
            parts.append(pm.UserPromptPart(content=m.content or ""))
        else:
            parts.append(
                pm.ToolReturnPart(tool_name=m.name or "", content=m.content or "", tool_call_id=m.tool_call_id or "")
            )
    if parts:
        out.append(pm.ModelRequest(parts=parts))
    return out


def to_model_response(
    m: Message, *, usage: Usage | None = None, model: str | None = None, finish_reason: str | None = None
) -> pm.ModelResponse:
    """Our assistant message as a ``ModelResponse``."""
    parts: list[pm.ModelResponsePart] = []
    if m.content:
        parts.append(pm.TextPart(content=m.content))
    for c in m.tool_calls:
        parts.append(pm.ToolCallPart(tool_name=c.name, args=dict(c.arguments), tool_call_id=c.id or ""))
    reverse = {v: k for k, v in FINISH.items()}
    return pm.ModelResponse(
        parts=parts,
        usage=RequestUsage(input_tokens=usage.input_tokens, output_tokens=usage.output_tokens)
        if usage is not None
        else RequestUsage(),
        model_name=model,
        finish_reason=reverse.get(finish_reason or "") if finish_reason else None,  # type: ignore[arg-type]
    )


def to_request_parameters(
    tools: Sequence[Mapping[str, Any]],
    output: Mapping[str, Any] | None = None,
) -> ModelRequestParameters:
    """Our tool specs as ``ModelRequestParameters``: ``"kind": "output"`` specs are output
    tools; ``output`` (``{"allow_text": bool}``) says whether a text answer may end it."""
    function: list[ToolDefinition] = []
    output_tools: list[ToolDefinition] = []
    for t in tools:
        d = ToolDefinition(
            name=t["name"],
            description=t.get("description") or None,
            parameters_json_schema=dict(t.get("parameters") or {"type": "object", "properties": {}}),
        )
        (output_tools if t.get("kind") == "output" else function).append(d)
    allow_text = bool((output or {}).get("allow_text", True)) or not output_tools
    return ModelRequestParameters(
        function_tools=function,
        output_tools=output_tools,
        output_mode="tool" if output_tools else "text",
        allow_text_output=allow_text,
    )


def to_model_settings(params: Mapping[str, Any]) -> ModelSettings:
    """A request's ``params`` as ``ModelSettings``: the keys it knows (``temperature``,
    ``max_tokens``, ``top_p``...) as they are, the others in ``extra_body``."""
    known = ModelSettings.__annotations__
    settings: dict[str, Any] = {k: v for k, v in params.items() if k in known}
    extra = {k: v for k, v in params.items() if k not in known}
    if extra:
        settings["extra_body"] = {**dict(settings.get("extra_body") or {}), **extra}
    return settings  # type: ignore[return-value]


# -- Pydantic AI -> ours ---------------------------------------------------------------------


class BadToolArguments(ValueError):
    """A tool call's arguments are not a JSON object."""


def from_model_response(response: pm.ModelResponse) -> tuple[Message, Usage, str | None, str | None]:
    """A ``ModelResponse`` as (assistant message, usage, model name, finish reason).
    Raises :class:`BadToolArguments` for arguments that are not a JSON object."""
    texts, calls = [], []
    for part in response.parts:
        if isinstance(part, pm.TextPart):
            texts.append(part.content)
        elif isinstance(part, pm.ToolCallPart):
            calls.append(
                ToolCall(id=part.tool_call_id or None, name=part.tool_name, arguments=tool_call_arguments(part))
            )
    usage = Usage(input_tokens=response.usage.input_tokens or 0, output_tokens=response.usage.output_tokens or 0)
    message = Message(role="assistant", content="".join(texts) if texts else None, tool_calls=tuple(calls))
    finish = FINISH.get(response.finish_reason or "", response.finish_reason) if response.finish_reason else None
    return message, usage, response.model_name, finish


def tool_call_arguments(part: pm.ToolCallPart) -> JSONObject:
    try:
        return part.args_as_dict(raise_if_invalid=True)
    except (ValueError, AssertionError):
        raise BadToolArguments(
            f"the model's arguments for tool {part.tool_name!r} are not a JSON object: {part.args!r}"
        ) from None


def from_model_messages(messages: Sequence[pm.ModelMessage]) -> list[Message]:
    """Pydantic AI's history as our messages (what the durable agent asks our handler).

    A request's ``instructions`` become a system message in front of it; a retry prompt
    (a tool's ``ModelRetry``, an output that failed validation) becomes the ``tool``
    message of its call, or a ``user`` message when it answers no call.
    """
    out: list[Message] = []
    for msg in messages:
        if isinstance(msg, pm.ModelResponse):
            out.append(from_model_response(msg)[0])
            continue
        if msg.instructions:
            out.append(Message(role="system", content=msg.instructions))
        for part in msg.parts:
            if isinstance(part, pm.SystemPromptPart):
                out.append(Message(role="system", content=part.content))
            elif isinstance(part, pm.UserPromptPart):
                out.append(Message(role="user", content=_text(part.content)))
            elif isinstance(part, pm.ToolReturnPart):
                out.append(
                    Message(
                        role="tool",
                        content=_text(part.model_response_str()),
                        tool_call_id=part.tool_call_id,
                        name=part.tool_name,
                    )
                )
            elif isinstance(part, pm.RetryFeedbackPart):  # an unusable reply: the agent's own words
                out.append(Message(role="user", content=part.model_response()))
            elif isinstance(part, pm.RetryPromptPart):  # deprecated, still in old histories
                text = part.model_response()
                if part.tool_name and part.tool_call_id:
                    out.append(Message(role="tool", content=text, tool_call_id=part.tool_call_id, name=part.tool_name))
                else:
                    out.append(Message(role="user", content=text))
    return out


def tool_specs(params: ModelRequestParameters) -> tuple[list[JSONObject], JSONObject]:
    """The agent's request parameters as our tool specs (output tools marked
    ``"kind": "output"``) and the ``output`` note (``{"allow_text": bool}``)."""
    specs: list[JSONObject] = []
    for kind, defs in (("function", params.function_tools), ("output", params.output_tools)):
        for d in defs:
            spec: JSONObject = {
                "name": d.name,
                "description": d.description or "",
                "parameters": d.parameters_json_schema,
            }
            if kind == "output":
                spec["kind"] = "output"
            specs.append(spec)
    return specs, {"allow_text": bool(params.allow_text_output)}


def _text(content: object) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, Sequence):
        return "".join(c if isinstance(c, str) else "" for c in content)
    return json.dumps(content, default=str)
