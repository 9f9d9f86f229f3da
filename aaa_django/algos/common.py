"""Small pieces the built-in algorithms share (pure functions, no state).

- :data:`QUIET`: events after which an algorithm only waits (its own requests, a
  guard's intent, approval traffic): the built-ins declare them in ``ignores``, so
  the engine does not step them for these;
- :func:`reply_text`, :func:`as_text`, :func:`failure_text`, :func:`child_result`:
  what a result says;
- :func:`opening`: the first messages of a conversation (system, then the task);
- :func:`fill`: ``{name}`` placeholders in prompts, leaving other braces alone;
- :func:`tag_index`: the ``N`` of a tag such as ``sample-N``;
- :class:`AlgorithmRef`: another algorithm, saved as JSON (child runs).
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, model_validator

from aaa_django.llm.messages import Message
from aaa_django.runtime import registry
from aaa_django.runtime.event_types import (
    APPROVAL_DECISIONS,
    APPROVAL_REQUESTED,
    CANCEL_REQUESTED,
    CHILD_REQUESTED,
    CLOSE_REQUESTED,
    LLM_REQUESTED,
    MESSAGE_SENT,
    OUTPUT_PROPOSED,
    QUESTION_ASKED,
    QUESTION_DECISIONS,
    TOOL_REQUESTED,
    TOOL_STARTED,
)

from .base import Algorithm

#: Events that never change what an algorithm decides: the requests it made itself
#: (their results will; a proposed structured result too), the tool guard's intent, approval gates (the tool's result
#: follows the decision), its replies and a tool's questions (the tool's result comes
#: with the answer), and a cancel or close request (the engine ends the run). Not stepping
#: on them (``Algorithm.ignores``) halves the steps and reads of a run, as the spec's
#: fold measurement does (it reads on results only).
QUIET = frozenset(
    {
        LLM_REQUESTED,
        TOOL_REQUESTED,
        TOOL_STARTED,
        CHILD_REQUESTED,
        APPROVAL_REQUESTED,
        *APPROVAL_DECISIONS,
        CANCEL_REQUESTED,
        OUTPUT_PROPOSED,
        MESSAGE_SENT,
        QUESTION_ASKED,
        *QUESTION_DECISIONS,
        CLOSE_REQUESTED,
    }
)


def reply_text(data: Mapping[str, Any]) -> str:
    """The text of an ``aaa.llm.completed`` reply ("" when it has none)."""
    message = (data.get("response") or {}).get("message") or {}
    return message.get("content") or ""


def as_text(value: object) -> str:
    """A tool result or run value as text: strings as they are, the rest as JSON."""
    if isinstance(value, str):
        return value
    return json.dumps(value, ensure_ascii=False, sort_keys=True)


def failure_text(data: Mapping[str, object]) -> str:
    """``"reason: error"`` of a failed model or tool call."""
    return f"{data.get('reason') or 'error'}: {data.get('error') or ''}".rstrip(": ")


def child_result(data: Mapping[str, object]) -> tuple[bool, str]:
    """``(ok, text)`` of an ``aaa.child.completed``: on ``success`` the value's
    ``"text"`` (ToolLoop and most algorithms answer ``{"text": ...}``) or the value as
    text; otherwise ``"<outcome>: <value as text>"``."""
    value = data.get("value")
    if data.get("outcome") != "success":
        return False, f"{data.get('outcome')}: {as_text(value)}"
    if isinstance(value, dict) and isinstance(value.get("text"), str):
        return True, value["text"]
    return True, as_text(value)


def opening(system: str | None, task: str) -> list[Message]:
    """The system message (if any), then ``task`` as the user's message."""
    msgs = [Message(role="system", content=system)] if system else []
    return msgs + [Message(role="user", content=task)]


_PLACEHOLDER = re.compile(r"\{([A-Za-z_][A-Za-z0-9_-]*)\}")


def fill(template: str, values: Mapping[str, str]) -> str:
    """Replace ``{name}`` for every name in ``values``; other braces (JSON in a prompt,
    unknown names) are left as written."""
    return _PLACEHOLDER.sub(lambda m: values.get(m.group(1), m.group(0)), template)


def fill_args(args: Mapping[str, object], values: Mapping[str, str]) -> dict[str, object]:
    """Tool arguments with placeholders filled in their string values (nested too)."""

    def walk(v: object) -> object:
        if isinstance(v, str):
            return fill(v, values)
        if isinstance(v, Mapping):
            return {k: walk(x) for k, x in v.items()}
        if isinstance(v, list):
            return [walk(x) for x in v]
        return v

    return {k: walk(x) for k, x in args.items()}


def tag_index(tag: object, prefix: str) -> int | None:
    """``N`` of ``"<prefix>-N"`` (None for any other tag)."""
    if not isinstance(tag, str) or not tag.startswith(prefix + "-"):
        return None
    rest = tag[len(prefix) + 1 :]
    return int(rest) if rest.isdigit() else None


class AlgorithmRef(BaseModel):
    """Another algorithm as JSON: ``{"algorithm": name, "config": {...}}``.

    Accepts an algorithm instance too (``executor=ToolLoop(registry)``), so configs can
    be written in Python and still be saved in the run.
    """

    model_config = ConfigDict(extra="forbid")

    algorithm: str = Field(min_length=1)
    config: dict[str, Any] = Field(default_factory=dict)

    @model_validator(mode="before")
    @classmethod
    def _from_instance(cls, value: Any) -> Any:
        if isinstance(value, str):
            return {"algorithm": value}
        name = getattr(value, "name", None)
        if isinstance(value, type) and isinstance(name, str):  # a class: its default config
            return {"algorithm": name}
        if isinstance(name, str) and callable(getattr(value, "config", None)):
            return {"algorithm": name, "config": value.config()}
        return value

    def build(self) -> Algorithm:
        """A fresh instance (through the registry, as any process rebuilds it)."""
        return registry.build(self.algorithm, self.config)
