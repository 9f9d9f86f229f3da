"""Tool-using loops: ``ToolLoop`` (native tool calls) and ``ReAct`` (text protocol).

Both decide from the projection :data:`LOOP` (the current request, the turn count,
this turn's tool calls and their results), so a step that is delivered twice, late,
or in another process decides the same thing. Both hold conversations
(:mod:`aaa_django.runtime.conversation`): in a run started with ``conversation``, an
answer is a reply, and the next message is asked of the model with the whole
conversation before it (``max_turns`` then counts per message).
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from aaa_django.events import Event, Projection
from aaa_django.llm.messages import Message
from aaa_django.runtime import Ctx, dotted
from aaa_django.runtime.event_types import (
    LLM_COMPLETED,
    LLM_FAILED,
    LLM_REQUESTED,
    MESSAGE_RECEIVED,
    MESSAGE_SENT,
    OUTPUT_PROPOSED,
    OUTPUT_REJECTED,
    OUTPUT_VALIDATED,
    TOOL_COMPLETED,
    TOOL_FAILED,
    TOOL_REQUESTED,
)
from aaa_django.runtime.output import describe, output_model
from aaa_django.tools import ToolRegistry

from .base import Algorithm
from .common import QUIET, opening


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
    #: this turn's answer proposed as the run's structured result: its event id
    proposal: str | None = None
    #: its verdict: ``{"ok": True, "value"}`` or ``{"ok": False, "errors", "fatal"?}``
    verdict: dict[str, Any] | None = None
    #: answers rejected so far (every turn)
    rejected: int = 0
    #: a conversation: the model requests made before the latest message (``max_turns``
    #: counts from it), the request whose reply was sent, the message not yet asked
    base: int = 0
    replied: str | None = None
    message: str | None = None

    def __deepcopy__(self, memo: dict | None = None) -> LoopState:
        # Only the call list and the result dict are mutated in place by the fold.
        # (As ``RunMeta.__deepcopy__``: ``__copy__`` and its ``__dict__``, in half the
        # time of ``model_copy`` and pydantic's assignments.)
        new = self.__copy__()
        fields = new.__dict__
        fields["calls"] = list(self.calls)
        fields["results"] = dict(self.results)
        new.model_fields_set.update(("calls", "results"))
        return new

    @property
    def waiting_for_tools(self) -> bool:
        return any(c.call_id not in self.results for c in self.calls)


def apply(s: LoopState, e: Event) -> LoopState:
    t, d = e.type, e.data
    if t == LLM_REQUESTED:
        s.turns += 1
        s.request_id = e.id
        s.response = s.error = None
        s.calls = []
        s.results = {}
        s.proposal = s.verdict = None
        s.message = None
    elif t == LLM_COMPLETED and d.get("request_id") == s.request_id:
        m = (d.get("response") or {}).get("message") or {}
        s.response = {"content": m.get("content"), "tool_calls": m.get("tool_calls") or []}
    elif t == LLM_FAILED and d.get("request_id") == s.request_id:
        s.error = {"reason": d.get("reason"), "error": d.get("error")}
    elif t == TOOL_REQUESTED:
        s.calls.append(LoopCall(call_id=d["call_id"], name=d.get("name", "")))
    elif t in (TOOL_COMPLETED, TOOL_FAILED):
        call_id = d.get("call_id")
        if call_id is not None and any(c.call_id == call_id for c in s.calls):
            s.results[call_id] = _result(t, d)
    elif t == OUTPUT_PROPOSED:
        s.proposal, s.verdict = e.id, None
    elif t == OUTPUT_VALIDATED and e.causation == s.proposal:
        s.verdict = {"ok": True, "value": d.get("value")}
    elif t == OUTPUT_REJECTED and e.causation == s.proposal:
        s.verdict = {"ok": False, "errors": d.get("errors") or [], "fatal": bool(d.get("fatal"))}
        s.rejected += 1
    elif t == MESSAGE_SENT:
        s.replied = d.get("request_id")
    elif t == MESSAGE_RECEIVED:
        s.message = d.get("content") or ""
        s.base = s.turns
    return s


def _result(t: str, d: Mapping[str, object]) -> LoopResult:
    if t == TOOL_COMPLETED:
        r = d.get("result")
        return LoopResult(ok=True, content=r if isinstance(r, str) else json.dumps(r, ensure_ascii=False))
    return LoopResult(ok=False, content=f"error ({d.get('reason')}): {d.get('error')}")


LOOP: Projection[LoopState] = Projection(
    LoopState,
    apply,
    name="aaa.algos.loops.LOOP",
    version=3,  # 2: structured results (proposal, verdict, rejected); 3: conversations
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
    #: the tools offered: None (the default) every tool the engine runs; else tool
    #: names (``"lookup"``) and JSON specs (tools served elsewhere). Names become specs
    #: when the run starts, so its ``aaa.run.started`` holds exactly what the model is
    #: offered, for any process and the audit (:mod:`aaa_django.runtime.offered`).
    tools: list[dict[str, Any] | Annotated[str, Field(min_length=1)]] | None = None
    model: str | None = None
    #: a structured result: the dotted path of the pydantic model the answer must fit
    #: (``"myapp.schemas:Forecast"``; a model this process has loaded)
    output: str | None = None
    #: its JSON schema (filled in from ``output``): offered to the model, shown in the admin
    output_schema: dict[str, Any] | None = None
    #: answers that do not fit, each sent back to the model with the errors, before
    #: the run ends ``no_solution``
    output_retries: int = Field(default=2, ge=0)

    @field_validator("output")
    @classmethod
    def _loaded(cls, path: str | None) -> str | None:
        if path is not None:
            output_model(path)  # a config names a model of this process, never a module to import
        return path

    @model_validator(mode="after")
    def _schema(self) -> LoopConfig:
        if self.output is not None and self.output_schema is None:
            self.output_schema = output_model(self.output).model_json_schema()
        return self


#: the tool a ToolLoop with a structured result offers for the final answer
FINAL = "final_result"
RETRY = "That answer does not fit the required schema:\n{errors}\nAnswer again, {how}."


class ToolLoop(Algorithm):
    """Ask the model; run the tools it calls; give it the results; repeat until it
    answers in text (``success``, value ``{"text": ...}``) or ``max_turns`` model
    calls are used up (``no_solution``). A failed model call ends the run ``failed``;
    a failed tool call is shown to the model, which decides.

    With ``output`` (a pydantic model), the answer is a structured result: the model
    is offered a ``final_result`` tool with the model's JSON schema (a text answer is
    read as JSON), the ValidationHandler checks it, and the run ends ``success`` with
    ``{"output": <the validated value>}``; an answer that does not fit goes back to the
    model with the errors, ``output_retries`` times, then ends the run ``no_solution``
    (``"reason": "invalid_output"``)."""

    projections = (LOOP,)

    name = "aaa.algos.ToolLoop"
    Input = TaskInput
    Config = LoopConfig
    cfg: LoopConfig
    ignores = QUIET

    def __init__(
        self,
        registry: ToolRegistry | None = None,
        *,
        tools: Sequence[str | dict[str, Any]] | None = None,
        max_turns: int = 10,
        system: str | None = None,
        model: str | None = None,
        output: type[BaseModel] | str | None = None,
        output_retries: int = 2,
    ) -> None:
        """``registry``: offer its tools; ``tools``: offer these (names of tools the
        engine runs, or JSON specs); neither: every tool the engine runs."""
        if registry is not None and tools is not None:
            raise ValueError("give a registry or tools, not both")
        chosen = registry.specs() if registry is not None else (list(tools) if tools is not None else None)
        if isinstance(output, str):
            output_model(output, trusted=True)  # code that names a model may import it
        elif output is not None:
            output = dotted.path_of(output)
        super().__init__(
            max_turns=max_turns, system=system, tools=chosen, model=model, output=output, output_retries=output_retries
        )

    def converses(self) -> bool:
        """Holds conversations (:class:`~aaa_django.runtime.conversation.Converses`),
        unless its answer is a structured result."""
        return self.cfg.output is None

    @classmethod
    def chosen_tools(cls, config: Mapping[str, object]) -> object:
        """The tools ``config`` chooses (:class:`~aaa_django.runtime.offered.ChoosesTools`)."""
        return config.get("tools")

    @classmethod
    def with_tools(cls, config: Mapping[str, object], tools: list[object]) -> dict[str, object]:
        return {**config, "tools": tools}

    @property
    def offered(self) -> list[dict[str, Any]]:
        """The specs the model is offered (a run started before the engine settled
        its tools, or offering none: none)."""
        return [t for t in self.cfg.tools or () if isinstance(t, dict)]

    def first_messages(self, ctx: Ctx) -> list[Message]:
        return opening(self.cfg.system, ctx.input.task)

    def ask(self, ctx: Ctx, s: LoopState, messages: list[Message]) -> None:
        turn = s.turns + 1
        tools = self.offered
        if self.cfg.output_schema is not None:
            tools.append(
                {
                    "name": FINAL,
                    "description": "Give the final answer, in this schema.",
                    "parameters": self.cfg.output_schema,
                    "kind": "output",
                }
            )
        ctx.llm(
            messages,
            tools=tools or None,
            tag=f"turn-{turn}",
            key=turn,
            model=self.cfg.model,
            output={"allow_text": False} if self.cfg.output is not None else None,
        )

    async def step(self, ctx: Ctx, event: Event) -> None:
        s = await ctx.project(LOOP)
        if s.turns == 0:
            self.ask(ctx, s, self.first_messages(ctx))
        elif s.error is not None:
            ctx.complete("failed", {"error": s.error, "turn": s.turns})
        elif s.response is None:
            return  # the model is thinking
        elif ctx.conversation is not None and s.replied is not None and s.replied == s.request_id:
            if s.message is not None:  # the reply was sent; the person's next message came
                self.ask(ctx, s, [Message(role="user", content=s.message)])
        elif s.proposal is not None:
            if s.verdict is not None:
                self.judged(ctx, s)  # else the answer is being checked
        elif not s.calls:
            self.decide(ctx, s)
        elif not s.waiting_for_tools:
            self.ask(ctx, s, self.tool_results(s))

    def tool_results(self, s: LoopState) -> list[Message]:
        """What the model is told once this turn's tools have answered."""
        return [
            Message(role="tool", content=s.results[c.call_id].content, tool_call_id=c.call_id, name=c.name)
            for c in s.calls
        ]

    def decide(self, ctx: Ctx, s: LoopState) -> None:
        """The model replied: finish (or propose a structured result), or run the
        tools it asked for."""
        assert s.response is not None
        calls = s.response["tool_calls"]
        final = next((c for c in calls if c["name"] == FINAL), None) if self.cfg.output else None
        if final is not None:
            self.propose(ctx, s, final.get("arguments") or {})
        elif not calls:
            text = s.response.get("content") or ""
            if self.cfg.output is not None:
                self.propose(ctx, s, text)  # an answer in text: read as JSON
            else:
                self.answer(ctx, s, text)
        elif s.turns - s.base >= self.cfg.max_turns:
            ctx.complete("no_solution", {"reason": "max_turns", "turns": s.turns})
        else:
            for c in calls:
                ctx.tool(c["name"], c.get("arguments") or {}, call_id=c["id"], key=(s.turns, c["id"]))

    def answer(self, ctx: Ctx, s: LoopState, text: str) -> None:
        """The answer: the run's result (``success`` with ``{"text": ...}``), or in a
        conversation the reply to the person's latest message."""
        if ctx.conversation is not None:
            ctx.reply(text, request_id=s.request_id)
        else:
            ctx.complete("success", {"text": text})

    def propose(self, ctx: Ctx, s: LoopState, value: object) -> None:
        """Ask the ValidationHandler whether ``value`` fits ``output`` (the verdict
        steps the run on)."""
        ctx.emit(OUTPUT_PROPOSED, {"value": value, "schema": self.cfg.output}, key=("output", s.turns))

    def judged(self, ctx: Ctx, s: LoopState) -> None:
        """The answer was checked: the run's result, or the errors back to the model."""
        assert s.verdict is not None
        if s.verdict["ok"]:
            ctx.complete("success", {"output": s.verdict["value"]})
        elif s.verdict.get("fatal"):
            ctx.complete("failed", {"error": s.verdict["errors"]})
        elif s.rejected > self.cfg.output_retries:
            ctx.complete(
                "no_solution", {"reason": "invalid_output", "errors": s.verdict["errors"], "answers": s.rejected}
            )
        elif s.turns - s.base >= self.cfg.max_turns:
            ctx.complete("no_solution", {"reason": "max_turns", "turns": s.turns})
        else:
            self.ask(ctx, s, self.retry(s, describe(s.verdict["errors"])))

    def retry(self, s: LoopState, errors: str) -> list[Message]:
        """The errors, as the answer to the model's ``final_result`` call (and every
        other call of that reply, not run), or as the user's reply to a text answer."""
        assert s.response is not None
        calls = s.response["tool_calls"]
        if not calls:
            return [Message(role="user", content=RETRY.format(errors=errors, how="as JSON that fits it"))]
        return [
            Message(
                role="tool",
                tool_call_id=c["id"],
                name=c["name"],
                content=RETRY.format(errors=errors, how=f"with {FINAL}")
                if c["name"] == FINAL
                else f"not run: {FINAL} was called",
            )
            for c in calls
        ]


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

    def first_messages(self, ctx: Ctx) -> list[Message]:
        tools = (
            "\n".join(
                f"- {t['name']}: {t.get('description', '')} "
                f"(arguments: {json.dumps(t.get('parameters', {}).get('properties', {}))})"
                for t in self.offered
            )
            or "(none)"
        )
        system = REACT_SYSTEM.format(tools=tools)
        if self.cfg.output_schema is not None:
            system += "\n\nThe Final Answer must be JSON that fits this schema: " + json.dumps(self.cfg.output_schema)
        if self.cfg.system:
            system = self.cfg.system + "\n\n" + system
        return opening(system, ctx.input.task)

    def ask(self, ctx: Ctx, s: LoopState, messages: list[Message]) -> None:
        turn = s.turns + 1
        ctx.llm(messages, tag=f"turn-{turn}", key=turn, model=self.cfg.model)

    def tool_results(self, s: LoopState) -> list[Message]:
        return [Message(role="user", content=f"Observation: {s.results[s.calls[0].call_id].content}")]

    def retry(self, s: LoopState, errors: str) -> list[Message]:
        how = "with a Final Answer in JSON that fits it"
        return [Message(role="user", content="Observation: " + RETRY.format(errors=errors, how=how))]

    def decide(self, ctx: Ctx, s: LoopState) -> None:
        assert s.response is not None
        kind, value = parse_react(s.response.get("content") or "")
        if kind == "final" and self.cfg.output is not None:
            self.propose(ctx, s, value)
        elif kind == "final":
            self.answer(ctx, s, value)
        elif s.turns - s.base >= self.cfg.max_turns:
            ctx.complete("no_solution", {"reason": "max_turns", "turns": s.turns})
        elif kind == "action":
            name, args = value
            ctx.tool(name, args, call_id=f"react-{s.turns}", key=(s.turns, "react"))
        else:
            self.ask(
                ctx,
                s,
                [Message(role="user", content=f"Observation: could not parse your reply ({value}). Use the format.")],
            )
