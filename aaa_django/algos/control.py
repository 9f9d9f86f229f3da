"""Control flow written in the config: ``WorkflowGraph`` (a graph of nodes with
parallel branches, joins and fallbacks) and ``FSM`` (states whose transitions are
chosen by the model's reply or a tool's result).

``WorkflowGraph`` decides from :data:`WF` (each node's status and result); ``FSM``
from :data:`FSM_STATE` (the path of states entered and the current state's result).
"""

from __future__ import annotations

import re
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from aaa_django.events import Event, Projection
from aaa_django.runtime import Ctx
from aaa_django.runtime.event_types import (
    CHILD_COMPLETED,
    CHILD_REQUESTED,
    LLM_COMPLETED,
    LLM_FAILED,
    LLM_REQUESTED,
    TOOL_COMPLETED,
    TOOL_FAILED,
    TOOL_REQUESTED,
)

from .base import Algorithm
from .common import (
    QUIET,
    AlgorithmRef,
    as_text,
    child_result,
    failure_text,
    fill,
    fill_args,
    opening,
    reply_text,
    tag_index,
)
from .loops import TaskInput

_NAME = r"^[A-Za-z0-9_]+$"


# == WorkflowGraph ==========================================================================


class NodeRun(BaseModel):
    """A node that was started: ``running``, ``done`` (with its result) or ``failed``."""

    status: Literal["running", "done", "failed"] = "running"
    result: str | None = None
    error: str | None = None


class WorkflowState(BaseModel):
    """The nodes started so far, by id (results as text: what later prompts use)."""

    nodes: dict[str, NodeRun] = Field(default_factory=dict)

    def __deepcopy__(self, memo: dict | None = None) -> WorkflowState:
        new = self.model_copy()
        new.nodes = dict(self.nodes)  # node runs are replaced, never mutated
        return new


def node_of(value: object) -> str | None:
    """The workflow node a request belongs to: ``X`` of the ``"node-X"`` it is tagged with."""
    return value[5:] if isinstance(value, str) and value.startswith("node-") else None


def apply_wf(s: WorkflowState, e: Event) -> WorkflowState:
    t, d = e.type, e.data
    if t == LLM_REQUESTED:
        node = node_of(d.get("tag"))
    elif t == TOOL_REQUESTED:
        node = node_of(d.get("call_id"))
    elif t == CHILD_REQUESTED:
        node = node_of(d.get("key"))
    else:
        node = None
    if node is not None:
        s.nodes[node] = NodeRun()
    elif t in (LLM_COMPLETED, LLM_FAILED):
        node = node_of(d.get("tag"))
        if node in s.nodes:
            s.nodes[node] = (
                NodeRun(status="done", result=reply_text(d))
                if t == LLM_COMPLETED
                else NodeRun(status="failed", error=failure_text(d))
            )
    elif t in (TOOL_COMPLETED, TOOL_FAILED):
        node = node_of(d.get("call_id"))
        if node in s.nodes:
            s.nodes[node] = (
                NodeRun(status="done", result=as_text(d.get("result")))
                if t == TOOL_COMPLETED
                else NodeRun(status="failed", error=failure_text(d))
            )
    elif t == CHILD_COMPLETED:
        node = node_of(d.get("key"))
        if node in s.nodes:
            ok, text = child_result(d)
            s.nodes[node] = NodeRun(status="done", result=text) if ok else NodeRun(status="failed", error=text)
    return s


WF: Projection[WorkflowState] = Projection(
    WorkflowState,
    apply_wf,
    name="aaa.algos.control.WF",
    version=1,
    state_type=WorkflowState,
    every=64,
)


class Node(BaseModel):
    """One node of a workflow.

    ``kind``: ``llm`` (``prompt`` to a model), ``tool`` (``tool`` with ``args``) or
    ``child`` (a child run of ``algorithm`` with input ``{"task": prompt}``). Prompts
    and string arguments may use ``{task}`` and ``{<node id>}`` of the nodes in
    ``after``; a fallback also gets ``{error}`` (why the node it replaces failed).
    """

    model_config = ConfigDict(extra="forbid")

    id: str = Field(pattern=_NAME, max_length=64)
    kind: Literal["llm", "tool", "child"] = "llm"
    prompt: str | None = None
    system: str | None = None
    model: str | None = None
    tool: str | None = None
    args: dict[str, Any] = Field(default_factory=dict)
    algorithm: AlgorithmRef | None = None
    #: the nodes whose results this one needs (none: it starts at once)
    after: list[str] = Field(default_factory=list)
    #: the node to run instead when this one fails (it gets the same inputs)
    fallback: str | None = None

    @model_validator(mode="after")
    def _kind_fields(self) -> Node:
        if self.kind == "llm" and not self.prompt:
            raise ValueError(f"node {self.id!r}: an llm node needs a prompt")
        if self.kind == "tool" and not self.tool:
            raise ValueError(f"node {self.id!r}: a tool node needs a tool")
        if self.kind == "child" and self.algorithm is None:
            raise ValueError(f"node {self.id!r}: a child node needs an algorithm")
        return self


class WorkflowGraphConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    nodes: list[Node] = Field(min_length=1)
    #: the model of llm nodes that name none
    model: str | None = None

    @model_validator(mode="after")
    def _graph(self) -> WorkflowGraphConfig:
        ids = [n.id for n in self.nodes]
        dupes = sorted({i for i in ids if ids.count(i) > 1})
        if dupes:
            raise ValueError(f"node ids must be unique: {dupes}")
        known = set(ids)
        fallbacks = {n.fallback for n in self.nodes if n.fallback}
        shared = sorted(f for f in fallbacks if sum(n.fallback == f for n in self.nodes) > 1)
        if shared:
            raise ValueError(f"a node can be the fallback of one node only: {shared}")
        for n in self.nodes:
            repeated = sorted({a for a in n.after if n.after.count(a) > 1})
            if repeated:
                raise ValueError(f"node {n.id!r} names {repeated} more than once in `after`")
            for ref in [*n.after, *([n.fallback] if n.fallback else [])]:
                if ref not in known:
                    raise ValueError(f"node {n.id!r} names an unknown node {ref!r}")
            if n.id in fallbacks and n.after:
                raise ValueError(f"fallback node {n.id!r} takes the inputs of the node it replaces: give it no `after`")
            if fallbacks & set(n.after):
                raise ValueError(f"node {n.id!r} depends on a fallback node: depend on the node it replaces")
        by_id = {n.id: n for n in self.nodes}
        for n in self.nodes:  # fallback chains end
            seen, cur = {n.id}, n.fallback
            while cur:
                if cur in seen:
                    raise ValueError(f"fallback chain of {n.id!r} loops")
                seen.add(cur)
                cur = by_id[cur].fallback
        done: set[str] = set()  # no cycles: every node can be ordered after its inputs
        todo = [n for n in self.nodes if n.id not in fallbacks]
        while todo:
            ready = [n for n in todo if set(n.after) <= done]
            if not ready:
                raise ValueError(f"the graph has a cycle through {sorted(n.id for n in todo)}")
            done.update(n.id for n in ready)
            todo = [n for n in todo if n.id not in done]
        return self

    def primaries(self) -> list[Node]:
        """The nodes of the graph proper (fallbacks run only in place of another)."""
        fallbacks = {n.fallback for n in self.nodes if n.fallback}
        return [n for n in self.nodes if n.id not in fallbacks]

    def sinks(self) -> list[Node]:
        """The nodes no other node waits for: the workflow is done when they are."""
        needed = {a for n in self.nodes for a in n.after}
        return [n for n in self.primaries() if n.id not in needed]


class WorkflowGraph(Algorithm):
    """Run a graph of model, tool and child-run nodes: every node whose inputs are done
    starts at once (parallel branches); a node with several inputs waits for all of
    them (a join); a failed node is replaced by its ``fallback`` if it has one.

    ``success`` when every sink is done (value ``{"results": {sink id: result}}``);
    ``failed`` as soon as a node fails with no fallback left (``{"node", "error"}``);
    other branches still running are cancelled with the run.
    """

    projections = (WF,)

    name = "aaa.algos.WorkflowGraph"
    ignores = QUIET
    Input = TaskInput
    Config = WorkflowGraphConfig
    cfg: WorkflowGraphConfig

    async def step(self, ctx: Ctx, event: Event) -> None:
        s = await ctx.project(WF)
        by_id = {n.id: n for n in self.cfg.nodes}
        primaries = self.cfg.primaries()
        where = {n.id: self.resolve(s, by_id, n) for n in primaries}
        for n in primaries:
            status, value = where[n.id]
            if status == "failed":
                ctx.complete("failed", {"node": value[0], "error": value[1]})
                return
        # primary node id -> its result (or its fallback's)
        resolved = {i: value for i, (status, value) in where.items() if status == "done"}
        sinks = self.cfg.sinks()
        if all(n.id in resolved for n in sinks):
            ctx.complete("success", {"results": {n.id: resolved[n.id] for n in sinks}})
            return
        values = {"task": ctx.input.task}
        for n in primaries:  # every node whose inputs are done starts now: parallel branches
            status, value = where[n.id]
            inputs = {a: resolved[a] for a in n.after if a in resolved}
            if status == "fallback":
                fallback, error = value
                self.start(ctx, fallback, {**values, **inputs, "error": error})
            elif n.id not in s.nodes and len(inputs) == len(n.after):
                self.start(ctx, n, {**values, **inputs})

    def resolve(self, s: WorkflowState, by_id: dict[str, Node], n: Node) -> tuple[str, Any]:
        """Where node ``n`` stands, following its fallbacks: ``("done", result)``,
        ``("failed", (node id, error))`` (no fallback left), ``("fallback", (node,
        error))`` (start that fallback now) or ``("waiting", None)`` (not started yet,
        or running)."""
        run = s.nodes.get(n.id)
        if run is None or run.status == "running":
            return "waiting", None
        if run.status == "done":
            return "done", run.result
        cur, error = n, run.error or ""
        while True:  # `cur` failed with `error`
            if cur.fallback is None:
                return "failed", (cur.id, error)
            fb = by_id[cur.fallback]
            fb_run = s.nodes.get(fb.id)
            if fb_run is None:
                return "fallback", (fb, error)
            if fb_run.status == "running":
                return "waiting", None
            if fb_run.status == "done":
                return "done", fb_run.result
            cur, error = fb, fb_run.error or ""

    def start(self, ctx: Ctx, n: Node, values: dict[str, str]) -> None:
        name = f"node-{n.id}"
        if n.kind == "llm":
            msgs = opening(n.system, fill(n.prompt or "", values))
            ctx.llm(msgs, tag=name, key=name, thread=name, model=n.model or self.cfg.model)
        elif n.kind == "tool":
            ctx.tool(n.tool or "", fill_args(n.args, values), call_id=name, key=name)
        else:
            assert n.algorithm is not None
            ctx.child(n.algorithm.build(), {"task": fill(n.prompt or "{task}", values)}, key=name)


# == FSM ======================================================================================

FSM_ENTERED = "aaa.fsm.entered"


class FsmRun(BaseModel):
    """The states entered so far and the current state's action."""

    #: the states entered, in order (the current one last)
    path: list[str] = Field(default_factory=list)
    #: the current state's request (None until it is asked for)
    request_id: str | None = None
    #: its result: done (ok or not), the text it produced and the transition label
    done: bool = False
    ok: bool = True
    output: str | None = None
    label: str | None = None
    #: the model call failed: ``{"reason", "error"}``
    error: dict[str, Any] | None = None
    #: the previous state's output (``{last}`` in prompts; the value at the end)
    last: str | None = None

    def __deepcopy__(self, memo: dict | None = None) -> FsmRun:
        new = self.model_copy()
        new.path = list(self.path)
        return new

    @property
    def transitions(self) -> int:
        return max(0, len(self.path) - 1)


_NEXT = re.compile(r"^\s*\**\s*NEXT\s*\**\s*:\s*\**\s*(.*?)\s*\**\s*$", re.I)


def read_llm_choice(text: str) -> tuple[str, str]:
    """``(output, label)`` of a model reply: the label is the last ``NEXT: <label>``
    line (removed from the output), else the whole reply."""
    lines = text.splitlines()
    for k in range(len(lines) - 1, -1, -1):
        m = _NEXT.match(lines[k])
        if m:
            return "\n".join(lines[:k] + lines[k + 1 :]).strip(), m.group(1)
    return text.strip(), text.strip()


def read_tool_choice(result: object) -> tuple[str, str]:
    """``(output, label)`` of a tool result: ``{"next": label, ...}``, or a string that
    is the label itself."""
    if isinstance(result, dict) and "next" in result:
        out = result.get("output")
        return (as_text(out) if out is not None else as_text(result)), str(result["next"])
    text = as_text(result)
    return text, text.strip()


def apply_fsm(s: FsmRun, e: Event) -> FsmRun:
    t, d = e.type, e.data
    if t == FSM_ENTERED:
        if s.done:
            s.last = s.output
        s.path.append(str(d.get("state")))
        s.request_id, s.done, s.ok, s.output, s.label, s.error = None, False, True, None, None, None
    elif (
        t == LLM_REQUESTED
        and tag_index(d.get("tag"), "fsm") == len(s.path) - 1
        or t == TOOL_REQUESTED
        and tag_index(d.get("call_id"), "fsm") == len(s.path) - 1
    ):
        s.request_id = e.id
    elif s.request_id is None or s.done:
        return s
    elif t == LLM_COMPLETED and d.get("request_id") == s.request_id:
        s.done = True
        s.output, s.label = read_llm_choice(reply_text(d))
    elif t == LLM_FAILED and d.get("request_id") == s.request_id:
        s.error = {"reason": d.get("reason"), "error": d.get("error")}
    elif t in (TOOL_COMPLETED, TOOL_FAILED) and e.causation == s.request_id:
        s.done = True
        if t == TOOL_COMPLETED:
            s.output, s.label = read_tool_choice(d.get("result"))
        else:  # a failed tool call takes the state's `error` transition, if it has one
            s.ok, s.output, s.label = False, failure_text(d), "error"
    return s


FSM_STATE: Projection[FsmRun] = Projection(
    FsmRun,
    apply_fsm,
    name="aaa.algos.control.FSM_STATE",
    version=1,
    state_type=FsmRun,
    every=64,
)


class FsmNode(BaseModel):
    """A state that acts: asks the model (``prompt``) or runs a tool (``tool``, ``args``),
    then follows the transition its result names. Prompts and string arguments may use
    ``{task}``, ``{last}`` (the previous state's output) and ``{state}``."""

    model_config = ConfigDict(extra="forbid")

    kind: Literal["llm", "tool"] = "llm"
    prompt: str | None = None
    tool: str | None = None
    args: dict[str, Any] = Field(default_factory=dict)
    #: label -> next state (matched without regard to case)
    transitions: dict[str, str] = Field(min_length=1)
    model: str | None = None

    @model_validator(mode="after")
    def _kind_fields(self) -> FsmNode:
        if self.kind == "llm" and not self.prompt:
            raise ValueError("an llm state needs a prompt")
        if self.kind == "tool" and not self.tool:
            raise ValueError("a tool state needs a tool")
        return self


FSM_CHOOSE = "End your reply with a line `NEXT: <label>`, where <label> is one of: {labels}."


class FSMConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    #: the states that act, by name
    states: dict[str, FsmNode] = Field(min_length=1)
    initial: str
    #: the states that end the run ``success`` when entered (they do nothing)
    finals: list[str] = Field(min_length=1)
    #: transitions allowed; one more ends the run ``no_solution``
    max_transitions: int = Field(default=20, ge=1)
    system: str | None = None
    model: str | None = None

    @model_validator(mode="after")
    def _machine(self) -> FSMConfig:
        names = set(self.states)
        for name in [*self.states, *self.finals]:
            if not re.match(_NAME, name):
                raise ValueError(f"state name {name!r}: use letters, digits and _")
        if names & set(self.finals):
            raise ValueError(f"final states do not act; remove {sorted(names & set(self.finals))} from `states`")
        if self.initial not in names and self.initial not in self.finals:
            raise ValueError(f"initial state {self.initial!r} is not a state")
        for name, node in self.states.items():
            for label, target in node.transitions.items():
                if target not in names and target not in self.finals:
                    raise ValueError(f"state {name!r}: transition {label!r} goes to an unknown state {target!r}")
        return self


class FSM(Algorithm):
    """A finite-state machine: each state asks the model or runs a tool; the reply's
    ``NEXT: <label>`` line (or the tool's ``{"next": label}``; a failed tool call:
    ``error``) picks the transition. Each state entered is recorded as
    ``aaa.fsm.entered``.

    ``success`` on entering a final state (value ``{"state", "path", "output"}``);
    ``no_solution`` when the label names no transition of the state
    (``{"reason": "unknown_transition", "state", "label", "path"}``) or after
    ``max_transitions`` (``{"reason": "max_transitions", ...}``); ``failed`` when a
    model call fails.
    """

    projections = (FSM_STATE,)

    name = "aaa.algos.FSM"
    #: (a state is entered in the same step as its action is asked for)
    ignores = QUIET | {FSM_ENTERED}
    Input = TaskInput
    Config = FSMConfig
    cfg: FSMConfig

    async def step(self, ctx: Ctx, event: Event) -> None:
        self.decide(ctx, await ctx.project(FSM_STATE))

    def decide(self, ctx: Ctx, s: FsmRun) -> None:
        cfg = self.cfg
        if not s.path:
            self.decide(ctx, self.enter(ctx, s, cfg.initial, via=None))
            return
        current = s.path[-1]
        if current in cfg.finals:
            ctx.complete("success", {"state": current, "path": s.path, "output": s.last})
        elif s.error is not None:
            ctx.complete("failed", {"error": s.error, "state": current, "path": s.path})
        elif s.request_id is None:
            self.act(ctx, s, current)
        elif not s.done:
            return  # the state's action is running
        else:
            transitions = {k.casefold(): v for k, v in cfg.states[current].transitions.items()}
            target = transitions.get((s.label or "").strip().casefold())
            if target is None:
                ctx.complete(
                    "no_solution", {"reason": "unknown_transition", "state": current, "label": s.label, "path": s.path}
                )
            elif s.transitions >= cfg.max_transitions:
                ctx.complete(
                    "no_solution", {"reason": "max_transitions", "state": current, "label": s.label, "path": s.path}
                )
            else:
                self.decide(ctx, self.enter(ctx, s, target, via=s.label))

    def enter(self, ctx: Ctx, s: FsmRun, state: str, *, via: str | None) -> FsmRun:
        """Record entering ``state``; return the run's state once that is folded.

        The caller goes on deciding from the returned state (the projection's own fold
        applied to a copy), so a state's action is asked for in the same step as it is
        entered: still a function of the log, one step and one read fewer per state.
        """
        n = len(s.path)
        entered = ctx.emit(FSM_ENTERED, {"state": state, "step": n, "via": via}, key=("fsm", n))
        return apply_fsm(FSM_STATE.copy(s), entered)

    def act(self, ctx: Ctx, s: FsmRun, current: str) -> None:
        node = self.cfg.states[current]
        n = len(s.path) - 1
        values = {"task": ctx.input.task, "last": s.last or "", "state": current}
        if node.kind == "tool":
            ctx.tool(node.tool or "", fill_args(node.args, values), call_id=f"fsm-{n}", key=("fsm", n))
            return
        content = fill(node.prompt or "", values) + "\n\n" + FSM_CHOOSE.format(labels=", ".join(node.transitions))
        # The system prompt opens the `fsm` thread: on the run's first model request
        # (earlier states, if any, ran tools).
        first = not any(self.cfg.states[p].kind == "llm" for p in s.path[:-1])
        msgs = opening(self.cfg.system if first else None, content)
        ctx.llm(msgs, tag=f"fsm-{n}", key=("fsm", n), thread="fsm", model=node.model or self.cfg.model)
