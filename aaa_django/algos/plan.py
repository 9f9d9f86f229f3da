"""``PlanAndExecute``: a planner writes the steps, an executor does them one by one,
and a failed step sends the planner back to replan what is left (a bounded number of
times).

The plan is a fact in the log (``aaa.plan.made`` with the steps, or
``aaa.plan.rejected`` with why it could not be used); each step is a model request or
a child run. The algorithm decides from the projection :data:`PLAN`: the steps with
their statuses and results, and the number of plans asked for.
"""

from __future__ import annotations

import json
import re
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from aaa_django.events import Event, Projection
from aaa_django.llm.messages import Message
from aaa_django.runtime import Ctx
from aaa_django.runtime.event_types import (
    CHILD_COMPLETED,
    CHILD_REQUESTED,
    LLM_COMPLETED,
    LLM_FAILED,
    LLM_REQUESTED,
)

from .base import Algorithm
from .common import QUIET, AlgorithmRef, child_result, failure_text, opening, reply_text, tag_index
from .loops import TaskInput

PLAN_MADE = "aaa.plan.made"
PLAN_REJECTED = "aaa.plan.rejected"

#: an executor's reply starting with this (any case) reports the step as failed
STEP_FAILED = "FAILED:"


class PlanStep(BaseModel):
    """One step of a plan."""

    text: str
    #: the plan it belongs to (1 for the first plan, 2 after the first replan...)
    revision: int
    status: Literal["pending", "running", "done", "failed", "skipped"] = "pending"
    result: str | None = None
    error: str | None = None


class PlanState(BaseModel):
    """The plans and their steps (every step ever planned: indexes never move)."""

    #: plans asked for: the first and every replan
    plans: int = 0
    plan_request: str | None = None
    #: the latest plan: ``asked`` (awaited), ``answered`` (reply to read), ``made``, ``rejected``
    planning: Literal["asked", "answered", "made", "rejected"] | None = None
    #: the planner's reply while it is read (cleared once made or rejected)
    reply: str | None = None
    #: why the latest plan could not be used
    rejection: str | None = None
    #: the planner's model call failed: ``{"reason", "error"}``
    error: dict[str, Any] | None = None
    #: the plan being carried out
    revision: int = 0
    steps: list[PlanStep] = Field(default_factory=list)

    def __deepcopy__(self, memo: dict | None = None) -> PlanState:
        # Only the step list and its steps are mutated in place by the fold.
        new = self.model_copy()
        new.steps = [st.model_copy() for st in self.steps]
        return new

    @property
    def replans(self) -> int:
        return max(0, self.plans - 1)

    def current(self) -> list[tuple[int, PlanStep]]:
        """The steps of the plan being carried out, with their indexes."""
        return [(i, st) for i, st in enumerate(self.steps) if st.revision == self.revision]


def apply(s: PlanState, e: Event) -> PlanState:
    t, d = e.type, e.data
    if t == LLM_REQUESTED:
        if tag_index(d.get("tag"), "plan") is not None:
            s.plans += 1
            s.plan_request, s.planning, s.reply, s.error = e.id, "asked", None, None
        else:
            _start(s, tag_index(d.get("tag"), "step"))
    elif t == CHILD_REQUESTED:
        _start(s, tag_index(d.get("key"), "step"))
    elif t in (LLM_COMPLETED, LLM_FAILED) and tag_index(d.get("tag"), "plan") is not None:
        if d.get("request_id") == s.plan_request and s.planning == "asked":  # else: not awaited
            if t == LLM_COMPLETED:
                s.planning, s.reply = "answered", reply_text(d)
            else:
                s.error = {"reason": d.get("reason"), "error": d.get("error")}
    elif t == LLM_COMPLETED:
        text = reply_text(d)
        if text.strip().upper().startswith(STEP_FAILED):
            _finish(s, tag_index(d.get("tag"), "step"), error=text.strip()[len(STEP_FAILED) :].strip())
        else:
            _finish(s, tag_index(d.get("tag"), "step"), result=text)
    elif t == LLM_FAILED:
        _finish(s, tag_index(d.get("tag"), "step"), error=failure_text(d))
    elif t == CHILD_COMPLETED:
        i = tag_index(d.get("key"), "step")
        ok, text = child_result(d)
        if ok:
            _finish(s, i, result=text)
        else:
            _finish(s, i, error=text)
    elif t == PLAN_MADE:
        for st in s.steps:
            if st.status == "pending":
                st.status = "skipped"
        rev = int(d.get("revision") or s.plans)
        s.steps.extend(PlanStep(text=str(x), revision=rev) for x in d.get("steps") or ())
        s.revision, s.planning, s.reply, s.rejection = rev, "made", None, None
    elif t == PLAN_REJECTED:
        s.planning, s.reply, s.rejection = "rejected", None, str(d.get("error") or "")
    return s


def _start(s: PlanState, i: int | None) -> None:
    if i is not None and 0 <= i < len(s.steps) and s.steps[i].status == "pending":
        s.steps[i].status = "running"


def _finish(s: PlanState, i: int | None, *, result: str | None = None, error: str | None = None) -> None:
    if i is None or not 0 <= i < len(s.steps) or s.steps[i].status != "running":
        return
    st = s.steps[i]
    if error is not None:
        st.status, st.error = "failed", error or "the step failed"
    else:
        st.status, st.result = "done", result


PLAN: Projection[PlanState] = Projection(
    PlanState,
    apply,
    name="aaa.algos.plan.PLAN",
    version=1,
    state_type=PlanState,
    every=64,
)


# -- reading a plan -----------------------------------------------------------------------

_LIST_ITEM = re.compile(r"^\s*(?:\d+[.)]|[-*•])\s+(.+?)\s*$")


def parse_plan(text: str, max_steps: int) -> tuple[list[str], str | None]:
    """``(steps, None)`` or ``([], why it is not a plan)``.

    A plan is a JSON array of strings (alone, in a fenced block or inside other text)
    or ``{"steps": [...]}``; failing that, a numbered or bulleted list.
    """
    steps = _json_steps(text)
    if steps is None:
        steps = [m.group(1) for line in text.splitlines() if (m := _LIST_ITEM.match(line))]
    steps = [s.strip() for s in steps if s.strip()]
    if not steps:
        return [], "no steps found: reply with a JSON array of strings"
    if len(steps) > max_steps:
        return [], f"{len(steps)} steps is more than the {max_steps} allowed"
    return steps, None


def _json_steps(text: str) -> list[str] | None:
    candidates = [text]
    start, end = text.find("["), text.rfind("]")
    if 0 <= start < end:
        candidates.append(text[start : end + 1])
    start, end = text.find("{"), text.rfind("}")
    if 0 <= start < end:
        candidates.append(text[start : end + 1])
    for c in candidates:
        try:
            value = json.loads(c)
        except ValueError:
            continue
        if isinstance(value, dict):
            value = value.get("steps")
        if isinstance(value, list) and all(isinstance(x, str) for x in value):
            return value
    return None


# -- the algorithm --------------------------------------------------------------------------

PLANNER_SYSTEM = (
    "Break the task into at most {max_steps} steps that can be carried out one after "
    "another. Reply with a JSON array of strings, one per step, and nothing else."
)
EXECUTOR_SYSTEM = (
    "You carry out a plan one step at a time. Reply with the result of the step you are "
    "given. If you cannot do it, reply with 'FAILED:' and the reason."
)
REPLAN = (
    'The step "{step}" failed: {error}\n\nDone so far:\n{done}\n\nWrite a new plan for '
    "what is left of the task: a JSON array of at most {max_steps} strings."
)
REJECTED = (
    "That plan cannot be used: {why}. Reply with a JSON array of at most {max_steps} "
    "strings, one per step, and nothing else."
)


class PlanAndExecuteConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    #: most steps a plan may have (a longer plan is rejected and counts as a replan)
    max_steps: int = Field(default=8, ge=1)
    #: new plans allowed after the first (after a failed step or an unusable plan)
    max_replans: int = Field(default=2, ge=0)
    #: extra instructions for the planner (before the built-in ones)
    system: str | None = None
    #: None: each step is a model request; else each step is a child run of this
    #: algorithm (its input must accept ``{"task": str}``, as ToolLoop's does)
    executor: AlgorithmRef | None = None
    model: str | None = None


class PlanAndExecute(Algorithm):
    """Plan, execute the steps in order, replan after a failure.

    A step fails when its model reply starts with ``FAILED:`` or the model call fails
    (model steps), or when its child run ends other than ``success`` (child steps).

    ``success`` when every step of the current plan is done (value ``{"answer": the
    last step's result, "steps": [{"step", "result"}...], "replans"}``);
    ``no_solution`` when a step fails (or a plan is unusable) and ``max_replans`` new
    plans were made already (``{"reason": "max_replans", "replans", "step", "error"}``);
    ``failed`` when the planner's model call fails.
    """

    projections = (PLAN,)

    name = "aaa.algos.PlanAndExecute"
    #: (a plan is recorded in the same step that acts on it)
    ignores = QUIET | {PLAN_MADE, PLAN_REJECTED}
    Input = TaskInput
    Config = PlanAndExecuteConfig
    cfg: PlanAndExecuteConfig

    async def step(self, ctx: Ctx, event: Event) -> None:
        self.decide(ctx, await ctx.project(PLAN))

    def decide(self, ctx: Ctx, s: PlanState) -> None:
        if s.plans == 0:
            system = PLANNER_SYSTEM.format(max_steps=self.cfg.max_steps)
            if self.cfg.system:
                system = self.cfg.system + "\n\n" + system
            self.ask_planner(ctx, 1, opening(system, ctx.input.task))
        elif s.error is not None:
            ctx.complete("failed", {"error": s.error, "plan": s.plans})
        elif s.planning == "asked":
            return  # the planner is thinking
        elif s.planning == "answered":
            # Record the plan (or why it is unusable), then act on it in the same step:
            # from the state the record folds into (the projection's own fold on a copy).
            steps, why = parse_plan(s.reply or "", self.cfg.max_steps)
            if why is None:
                record = ctx.emit(PLAN_MADE, {"revision": s.plans, "steps": steps}, key=("plan", s.plans))
            else:
                record = ctx.emit(PLAN_REJECTED, {"revision": s.plans, "error": why}, key=("plan", s.plans))
            self.decide(ctx, apply(PLAN.copy(s), record))
        elif s.planning == "rejected":
            self.replan(
                ctx,
                s,
                None,
                s.rejection or "unusable plan",
                REJECTED.format(why=s.rejection, max_steps=self.cfg.max_steps),
            )
        else:
            self.carry_on(ctx, s)

    def carry_on(self, ctx: Ctx, s: PlanState) -> None:
        current = s.current()
        if any(st.status == "running" for _, st in current):
            return  # a step is being done
        failed = next((st for _, st in current if st.status == "failed"), None)
        if failed is not None:
            self.replan(
                ctx,
                s,
                failed.text,
                failed.error or "",
                REPLAN.format(
                    step=failed.text,
                    error=failed.error,
                    done=_done_list(s) or "(nothing yet)",
                    max_steps=self.cfg.max_steps,
                ),
            )
            return
        pending = next(((i, st) for i, st in current if st.status == "pending"), None)
        if pending is not None:
            self.execute(ctx, s, *pending)
            return
        done = [{"step": st.text, "result": st.result} for st in s.steps if st.status == "done"]
        ctx.complete("success", {"answer": done[-1]["result"] if done else "", "steps": done, "replans": s.replans})

    def replan(self, ctx: Ctx, s: PlanState, step: str | None, error: str, message: str) -> None:
        if s.replans >= self.cfg.max_replans:
            ctx.complete("no_solution", {"reason": "max_replans", "replans": s.replans, "step": step, "error": error})
        else:
            self.ask_planner(ctx, s.plans + 1, [Message(role="user", content=message)])

    def ask_planner(self, ctx: Ctx, n: int, messages: list[Message]) -> None:
        ctx.llm(messages, tag=f"plan-{n}", key=("plan", n), thread="planner", model=self.cfg.model)

    def execute(self, ctx: Ctx, s: PlanState, i: int, st: PlanStep) -> None:
        task = ctx.input.task
        if self.cfg.executor is not None:
            done = _done_list(s)
            brief = (
                f"{task}\n\nDone so far:\n{done}\n\nYour part: {st.text}" if done else f"{task}\n\nYour part: {st.text}"
            )
            ctx.child(self.cfg.executor.build(), {"task": brief}, key=f"step-{i}")
            return
        # One executor thread per plan: it sees its own earlier results of that plan.
        first = s.current()[0][0] == i
        if first:
            plan = "\n".join(f"{k}. {x.text}" for k, (_, x) in enumerate(s.current(), 1))
            done = _done_list(s)
            content = f"Task: {task}\n\nPlan:\n{plan}\n\n"
            if done:
                content += f"Done before this plan:\n{done}\n\n"
            content += f"Step 1: {st.text}"
            messages = opening(EXECUTOR_SYSTEM, content)
        else:
            k = [j for j, _ in s.current()].index(i) + 1
            messages = [Message(role="user", content=f"Step {k}: {st.text}")]
        ctx.llm(messages, tag=f"step-{i}", key=("step", i), thread=f"exec-{s.revision}", model=self.cfg.model)


def _done_list(s: PlanState) -> str:
    return "\n".join(f"- {st.text}: {st.result}" for st in s.steps if st.status == "done")
