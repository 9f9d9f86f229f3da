"""Tool-using loops: ``ToolLoop`` (native tool calls) and ``ReAct`` (text protocol).

Both decide from the projection :data:`LOOP` (the current request, the turn count,
this turn's tool calls and their results), so a step that is delivered twice, late,
or in another process decides the same thing.
"""

from __future__ import annotations

import json
import re
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, ConfigDict, Field

from aaa_django.events import Event, Projection
from aaa_django.llm.messages import Message
from aaa_django.runtime import types as T

from .base import Algorithm
from .common import QUIET, opening

if TYPE_CHECKING:  # pragma: no cover
    from aaa_django.runtime import Ctx
    from aaa_django.tools import ToolRegistry


class LoopCall(BaseModel):
    call_id: str
    name: str


class LoopResult(BaseModel):
    ok: bool
    content: str


class LoopState(BaseModel):
    """Where a loop is: the latest model request and this turn's tool calls."""

    #: model requests made so far
    turns: int = 0
    request_id: str | None = None
    #: the latest reply ``{"content", "tool_calls"}``; None while it is awaited
    response: dict[str, Any] | None = None
    #: the latest request failed: ``{"reason", "error"}``
    error: dict[str, Any] | None = None
    #: tool calls requested in this turn, in order
    calls: list[LoopCall] = Field(default_factory=list)
    #: their results by call id
    results: dict[str, LoopResult] = Field(default_factory=dict)

    def __deepcopy__(self, memo: dict | None = None) -> "LoopState":
        # Only the call list and the result dict are mutated in place by the fold.
        new = self.model_copy()
        new.calls = list(self.calls)
        new.results = dict(self.results)
        return new

    @property
    def waiting_for_tools(self) -> bool:
        return any(c.call_id not in self.results for c in self.calls)


def apply(s: LoopState, e: Event) -> LoopState:
    t, d = e.type, e.data
    if t == T.LLM_REQUESTED:
        s.turns += 1
        s.request_id = e.id
        s.response = s.error = None
        s.calls = []
        s.results = {}
    elif t == T.LLM_COMPLETED and d.get("request_id") == s.request_id:
        m = (d.get("response") or {}).get("message") or {}
        s.response = {"content": m.get("content"), "tool_calls": m.get("tool_calls") or []}
    elif t == T.LLM_FAILED and d.get("request_id") == s.request_id:
        s.error = {"reason": d.get("reason"), "error": d.get("error")}
    elif t == T.TOOL_REQUESTED:
        s.calls.append(LoopCall(call_id=d["call_id"], name=d.get("name", "")))
    elif t in (T.TOOL_COMPLETED, T.TOOL_FAILED):
        call_id = d.get("call_id")
        if any(c.call_id == call_id for c in s.calls):
            s.results[call_id] = _result(t, d)
    return s


def _result(t: str, d: dict[str, Any]) -> LoopResult:
    if t == T.TOOL_COMPLETED:
        r = d.get("result")
        return LoopResult(ok=True, content=r if isinstance(r, str) else json.dumps(r, ensure_ascii=False))
    return LoopResult(ok=False, content=f"error ({d.get('reason')}): {d.get('error')}")


LOOP: Projection[LoopState] = Projection(
    LoopState,
    apply,
    name="aaa.algos.loops.LOOP",
    version=1,
    state_type=LoopState,
    every=64,
)


class TaskInput(BaseModel):
    """``{"task": "..."}``"""

    model_config = ConfigDict(extra="forbid")

    task: str = Field(min_length=1)


class LoopConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    #: model calls allowed; a model still asking for tools after them: ``no_solution``
    max_turns: int = Field(default=10, ge=1)
    system: str | None = None
    #: the JSON specs of the tools offered (saved in the run, so any process has them)
    tools: list[dict[str, Any]] = Field(default_factory=list)
    model: str | None = None


class ToolLoop(Algorithm):
    """Ask the model; run the tools it calls; give it the results; repeat until it
    answers in text (``success``, value ``{"text": ...}``) or ``max_turns`` model
    calls are used up (``no_solution``). A failed model call ends the run ``failed``;
    a failed tool call is shown to the model, which decides."""

    projections = (LOOP,)

    name = "aaa.algos.ToolLoop"
    Input = TaskInput
    Config = LoopConfig
    ignores = QUIET

    def __init__(
        self,
        registry: "ToolRegistry | None" = None,
        *,
        max_turns: int = 10,
        system: str | None = None,
        model: str | None = None,
    ) -> None:
        tools = registry.specs() if registry is not None else []
        super().__init__(max_turns=max_turns, system=system, tools=tools, model=model)

    def first_messages(self, ctx: "Ctx") -> list[Message]:
        return opening(self.cfg.system, ctx.input.task)

    def ask(self, ctx: "Ctx", s: LoopState, messages: list[Message]) -> None:
        turn = s.turns + 1
        ctx.llm(messages, tools=self.cfg.tools or None, tag=f"turn-{turn}", key=turn,
                model=self.cfg.model)

    async def step(self, ctx: "Ctx", event: Event) -> None:
        s = await ctx.project(LOOP)
        if s.turns == 0:
            self.ask(ctx, s, self.first_messages(ctx))
        elif s.error is not None:
            ctx.complete("failed", {"error": s.error, "turn": s.turns})
        elif s.response is None:
            return  # the model is thinking
        elif not s.calls:
            self.decide(ctx, s)
        elif not s.waiting_for_tools:
            self.ask(ctx, s, [
                Message(role="tool", content=s.results[c.call_id].content,
                        tool_call_id=c.call_id, name=c.name)
                for c in s.calls
            ])

    def decide(self, ctx: "Ctx", s: LoopState) -> None:
        """The model replied: finish, or run the tools it asked for."""
        assert s.response is not None
        calls = s.response["tool_calls"]
        if not calls:
            ctx.complete("success", {"text": s.response.get("content") or ""})
        elif s.turns >= self.cfg.max_turns:
            ctx.complete("no_solution", {"reason": "max_turns", "turns": s.turns})
        else:
            for c in calls:
                ctx.tool(c["name"], c.get("arguments") or {}, call_id=c["id"], key=(s.turns, c["id"]))


REACT_SYSTEM = """Solve the task step by step. You can use these tools:
{tools}

Answer in this format:
Thought: what you think
Action: the tool name
Action Input: the arguments as a JSON object

You will get "Observation: ..." with the result. When you know the answer, write:
Final Answer: the answer"""

_FINAL = re.compile(r"Final Answer:\s*(.*)\Z", re.S)
_ACTION = re.compile(r"Action:\s*(\S+)\s*(?:\n\s*Action Input:\s*(.*))?\Z", re.S)


def parse_react(content: str) -> tuple[str, Any]:
    """``("final", text)``, ``("action", (name, args))`` or ``("invalid", why)``."""
    final = _FINAL.search(content)
    if final:
        return "final", final.group(1).strip()
    action = _ACTION.search(content)
    if not action:
        return "invalid", "no 'Action:' or 'Final Answer:' line"
    raw = (action.group(2) or "").strip() or "{}"
    try:
        args = json.loads(raw)
    except json.JSONDecodeError as exc:
        return "invalid", f"Action Input is not JSON: {exc}"
    if not isinstance(args, dict):
        return "invalid", "Action Input must be a JSON object"
    return "action", (action.group(1), args)


class ReAct(ToolLoop):
    """Reason and act in text (``Thought`` / ``Action`` / ``Observation`` /
    ``Final Answer``), for models without native tool calls. Same input, value and
    limits as :class:`ToolLoop`."""

    name = "aaa.algos.ReAct"

    def first_messages(self, ctx: "Ctx") -> list[Message]:
        tools = "\n".join(f"- {t['name']}: {t.get('description', '')} "
                          f"(arguments: {json.dumps(t.get('parameters', {}).get('properties', {}))})"
                          for t in self.cfg.tools) or "(none)"
        system = REACT_SYSTEM.format(tools=tools)
        if self.cfg.system:
            system = self.cfg.system + "\n\n" + system
        return opening(system, ctx.input.task)

    def ask(self, ctx: "Ctx", s: LoopState, messages: list[Message]) -> None:
        turn = s.turns + 1
        ctx.llm(messages, tag=f"turn-{turn}", key=turn, model=self.cfg.model)

    async def step(self, ctx: "Ctx", event: Event) -> None:
        s = await ctx.project(LOOP)
        if s.turns == 0:
            self.ask(ctx, s, self.first_messages(ctx))
        elif s.error is not None:
            ctx.complete("failed", {"error": s.error, "turn": s.turns})
        elif s.response is None:
            return
        elif not s.calls:
            self.decide(ctx, s)
        elif not s.waiting_for_tools:
            result = s.results[s.calls[0].call_id]
            self.ask(ctx, s, [Message(role="user", content=f"Observation: {result.content}")])

    def decide(self, ctx: "Ctx", s: LoopState) -> None:
        assert s.response is not None
        kind, value = parse_react(s.response.get("content") or "")
        if kind == "final":
            ctx.complete("success", {"text": value})
        elif s.turns >= self.cfg.max_turns:
            ctx.complete("no_solution", {"reason": "max_turns", "turns": s.turns})
        elif kind == "action":
            name, args = value
            ctx.tool(name, args, call_id=f"react-{s.turns}", key=(s.turns, "react"))
        else:
            self.ask(ctx, s, [Message(role="user", content=f"Observation: could not parse your "
                                      f"reply ({value}). Use the format.")])
