"""Refinement loops: ``GenerateTestRepair`` and ``GeneratorCritic``.

Both ask a model for a candidate, check it (a test tool, or a second model acting as
critic), and ask for a repaired candidate with the check's feedback until the check
passes or the iteration limit is reached. Both decide from the projection
:data:`REFINE`: the latest request, the latest candidate, the latest check, and how
many candidates were asked for.
"""

from __future__ import annotations

import re
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from aaa_django.events import Event, Projection
from aaa_django.llm.messages import Message
from aaa_django.runtime import Ctx
from aaa_django.runtime.event_types import (
    LLM_COMPLETED,
    LLM_FAILED,
    LLM_REQUESTED,
    TOOL_COMPLETED,
    TOOL_FAILED,
    TOOL_REQUESTED,
)

from .base import Algorithm
from .common import QUIET, as_text, opening, reply_text
from .loops import TaskInput


class Check(BaseModel):
    """The result of checking a candidate: a test tool call or a critique."""

    #: the tool completed / the critic replied
    ok: bool
    #: the tool's result, or the critic's text
    result: Any = None
    #: a failed tool call's reason (``error``, ``timeout``, ``unknown_tool``...) and error
    reason: str | None = None
    error: str | None = None


class RefineState(BaseModel):
    """Where a refinement loop is (only the latest candidate and check: compact)."""

    #: candidates asked for: the first generation and every repair or revision
    iteration: int = 0
    #: the latest model request, and whether it asked for a candidate or a critique
    request_id: str | None = None
    stage: Literal["generate", "critique"] | None = None
    #: the latest model request failed: ``{"reason", "error"}``
    error: dict[str, Any] | None = None
    #: the latest candidate request and its reply (None while it is awaited)
    generate_id: str | None = None
    candidate: str | None = None
    #: the request checking the latest candidate, and its result (None while awaited)
    check_id: str | None = None
    check: Check | None = None


#: tags of the model requests: ``generate-N`` (N = iteration) and ``critique-N``
GENERATE, CRITIQUE = "generate", "critique"


def apply(s: RefineState, e: Event) -> RefineState:
    t, d = e.type, e.data
    if t == LLM_REQUESTED:
        tag = d.get("tag") or ""
        if tag.startswith(CRITIQUE + "-"):
            s.request_id, s.stage, s.error = e.id, "critique", None
            s.check_id, s.check = e.id, None
        elif tag.startswith(GENERATE + "-"):
            s.request_id, s.stage, s.error = e.id, "generate", None
            s.iteration += 1
            s.generate_id, s.candidate = e.id, None
            s.check_id = s.check = None
    elif t == LLM_COMPLETED:
        rid = d.get("request_id")
        if rid is not None and rid == s.generate_id:
            s.candidate = reply_text(d)
        elif rid is not None and rid == s.check_id:
            s.check = Check(ok=True, result=reply_text(d))
    elif t == LLM_FAILED and d.get("request_id") == s.request_id:
        s.error = {"reason": d.get("reason"), "error": d.get("error")}
    elif t == TOOL_REQUESTED and str(d.get("call_id", "")).startswith("test-"):
        s.check_id, s.check = e.id, None
    elif t in (TOOL_COMPLETED, TOOL_FAILED) and e.causation is not None and e.causation == s.check_id:
        if t == TOOL_COMPLETED:
            s.check = Check(ok=True, result=d.get("result"))
        else:
            s.check = Check(ok=False, reason=d.get("reason"), error=d.get("error"))
    return s


REFINE: Projection[RefineState] = Projection(
    RefineState,
    apply,
    name="aaa.algos.refine.REFINE",
    version=1,
    state_type=RefineState,
    every=64,
)


# -- GenerateTestRepair -------------------------------------------------------------------

GTR_SYSTEM = "Write a solution to the task. Reply with the complete solution in a single fenced code block."
REPAIR = (
    "The test failed:\n{feedback}\n\nFix the solution. Reply with the complete corrected "
    "solution in a single fenced code block."
)

_FENCED = re.compile(r"```[^\n`]*\n(.*?)```", re.S)

#: test tool failures that say the candidate is wrong (anything else: the test could
#: not be run at all, which no repair can fix)
CANDIDATE_FAILURES = ("error", "timeout")


def extract_fenced(text: str) -> str:
    """The first fenced code block of ``text``, or the whole text if it has none."""
    m = _FENCED.search(text)
    return m.group(1) if m else text.strip()


def verdict_of(check: Check) -> tuple[bool, str]:
    """``(passed, feedback)`` of a test tool call.

    The test tool passes a candidate by returning ``True`` or ``{"passed": true, ...}``;
    any other result, or raising (reason ``error``) or timing out, fails it, and what it
    returned or raised is the feedback the model gets.
    """
    if not check.ok:
        return False, f"{check.reason}: {check.error}"
    r = check.result
    if r is True:
        return True, ""
    if isinstance(r, dict):
        passed = r.get("passed") is True
        feedback = r.get("feedback", r.get("output"))
        return passed, as_text(feedback if feedback is not None else r)
    return False, as_text(r)


class GenerateTestRepairConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    #: the tool that tests a candidate (a name, or a ``Tool``)
    test_tool: str = Field(min_length=1)
    #: the test tool's parameter that receives the candidate
    argument: str = "candidate"
    #: repairs asked for after the first candidate; then ``no_solution``
    max_repairs: int = Field(default=3, ge=0)
    #: what is tested: the reply's first fenced code block (``fenced``) or all of it
    extract: Literal["fenced", "text"] = "fenced"
    system: str | None = GTR_SYSTEM
    model: str | None = None

    @field_validator("test_tool", mode="before")
    @classmethod
    def _tool_name(cls, value: object) -> object:
        name = getattr(value, "name", None)  # a Tool: keep its name
        return name if isinstance(name, str) and not isinstance(value, str) else value


class GenerateTestRepair(Algorithm):
    """Generate a candidate with the model, run the test tool on it, and on failure ask
    the model to repair it, showing what the test said.

    ``success`` when the test passes (value ``{"candidate", "iterations", "result"}``);
    ``no_solution`` when the candidate after ``max_repairs`` repairs still fails
    (``{"reason": "max_repairs", "iterations", "candidate", "feedback"}``); ``failed``
    when a model call fails or the test tool cannot run at all (unknown tool, invalid
    arguments, denied...).
    """

    projections = (REFINE,)

    name = "aaa.algos.GenerateTestRepair"
    ignores = QUIET
    Input = TaskInput
    Config = GenerateTestRepairConfig
    cfg: GenerateTestRepairConfig

    def tested(self, s: RefineState) -> str:
        text = s.candidate or ""
        return extract_fenced(text) if self.cfg.extract == "fenced" else text

    async def step(self, ctx: Ctx, event: Event) -> None:
        s = await ctx.project(REFINE)
        if s.iteration == 0:
            self.generate(ctx, 1, opening(self.cfg.system, ctx.input.task))
        elif s.error is not None:
            ctx.complete("failed", {"error": s.error, "iteration": s.iteration})
        elif s.candidate is None:
            return  # the model is writing
        elif s.check_id is None:
            ctx.tool(
                self.cfg.test_tool,
                {self.cfg.argument: self.tested(s)},
                call_id=f"test-{s.iteration}",
                key=("test", s.iteration),
            )
        elif s.check is None:
            return  # the test is running
        elif not s.check.ok and s.check.reason not in CANDIDATE_FAILURES:
            ctx.complete(
                "failed",
                {"error": f"the test tool could not run: {s.check.reason}: {s.check.error}", "iteration": s.iteration},
            )
        else:
            passed, feedback = verdict_of(s.check)
            if passed:
                ctx.complete(
                    "success", {"candidate": self.tested(s), "iterations": s.iteration, "result": s.check.result}
                )
            elif s.iteration > self.cfg.max_repairs:
                ctx.complete(
                    "no_solution",
                    {
                        "reason": "max_repairs",
                        "iterations": s.iteration,
                        "candidate": self.tested(s),
                        "feedback": feedback,
                    },
                )
            else:
                self.generate(ctx, s.iteration + 1, [Message(role="user", content=REPAIR.format(feedback=feedback))])

    def generate(self, ctx: Ctx, n: int, messages: list[Message]) -> None:
        ctx.llm(messages, tag=f"{GENERATE}-{n}", key=(GENERATE, n), model=self.cfg.model)


# -- GeneratorCritic ----------------------------------------------------------------------

CRITIC_SYSTEM = (
    "You review answers to a task. If the answer fully and correctly solves the task, "
    "reply with APPROVED on the first line. Otherwise say precisely what must change."
)
FIRST_REVIEW = "Task:\n{task}\n\nAnswer to review:\n{candidate}"
NEXT_REVIEW = "Revised answer to review:\n{candidate}"
REVISE = "A reviewer asked for changes:\n{feedback}\n\nRevise your answer. Reply with the complete revised answer."


class GeneratorCriticConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    #: candidates asked for (the first and each revision); then ``no_solution``
    max_iterations: int = Field(default=3, ge=1)
    #: the generator's system prompt
    system: str | None = None
    critic_system: str = CRITIC_SYSTEM
    #: the critic approves when its reply's first line starts with this (any case)
    approve: str = Field(default="APPROVED", min_length=1)
    model: str | None = None
    #: the critic's model (default: ``model``)
    critic_model: str | None = None


def approved(review: str, token: str) -> bool:
    """Does the critic's reply approve? Its first non-empty line starts with ``token``."""
    first = next((line.strip() for line in review.splitlines() if line.strip()), "")
    return first.upper().lstrip("*#> ").startswith(token.upper())


class GeneratorCritic(Algorithm):
    """A generator writes an answer; a critic (the same or another model, on its own
    conversation thread) reviews it; the generator revises with the critic's feedback.

    ``success`` when the critic approves (value ``{"candidate", "iterations",
    "review"}``); ``no_solution`` when the ``max_iterations``-th candidate is not
    approved (``{"reason": "max_iterations", "iterations", "candidate",
    "feedback"}``); ``failed`` when a model call fails.
    """

    projections = (REFINE,)

    name = "aaa.algos.GeneratorCritic"
    ignores = QUIET
    Input = TaskInput
    Config = GeneratorCriticConfig
    cfg: GeneratorCriticConfig

    async def step(self, ctx: Ctx, event: Event) -> None:
        s = await ctx.project(REFINE)
        cfg = self.cfg
        if s.iteration == 0:
            self.generate(ctx, 1, opening(cfg.system, ctx.input.task))
        elif s.error is not None:
            ctx.complete("failed", {"error": s.error, "iteration": s.iteration, "stage": s.stage})
        elif s.candidate is None:
            return  # the generator is writing
        elif s.check_id is None:
            self.critique(ctx, s)
        elif s.check is None:
            return  # the critic is reading
        else:
            review = as_text(s.check.result)
            if approved(review, cfg.approve):
                ctx.complete("success", {"candidate": s.candidate, "iterations": s.iteration, "review": review})
            elif s.iteration >= cfg.max_iterations:
                ctx.complete(
                    "no_solution",
                    {
                        "reason": "max_iterations",
                        "iterations": s.iteration,
                        "candidate": s.candidate,
                        "feedback": review,
                    },
                )
            else:
                self.generate(ctx, s.iteration + 1, [Message(role="user", content=REVISE.format(feedback=review))])

    def generate(self, ctx: Ctx, n: int, messages: list[Message]) -> None:
        ctx.llm(messages, tag=f"{GENERATE}-{n}", key=(GENERATE, n), model=self.cfg.model)

    def critique(self, ctx: Ctx, s: RefineState) -> None:
        # One critic thread: it sees its earlier reviews, so it can check they were heeded.
        if s.iteration == 1:
            messages = [
                Message(role="system", content=self.cfg.critic_system),
                Message(role="user", content=FIRST_REVIEW.format(task=ctx.input.task, candidate=s.candidate)),
            ]
        else:
            messages = [Message(role="user", content=NEXT_REVIEW.format(candidate=s.candidate))]
        ctx.llm(
            messages,
            tag=f"{CRITIQUE}-{s.iteration}",
            key=(CRITIQUE, s.iteration),
            thread="critic",
            model=self.cfg.critic_model or self.cfg.model,
        )
