"""``PydanticAIAgent``: a ``pydantic_ai.Agent`` run durably on this engine.

The way Pydantic AI's Temporal and DBOS integrations make a run durable -- the agent
loop replays from the start, and every unit of work that already completed returns its
recorded result instead of running -- with this engine's log as the record:

- the agent's **model requests** become ``aaa.llm.requested`` (our messages, its tools,
  its output tools marked ``"kind": "output"``, the agent's path); the engine's
  ``LLMHandler`` answers them with the agent's own model (a ``PydanticAIClient`` over it,
  or :class:`~aaa_django.llm.routes.AgentModels`, as the site's wiring gives it), or
  with the model the run's config names;
- its **tool calls** become ``aaa.tool.requested``; the engine's ``ToolHandler`` runs them
  (register the agent's tools with :func:`agent_tools`), with the guard, pools, timeouts
  and claim-check of any tool; a tool that needs approval (``requires_approval=True`` in
  Pydantic AI, or ``ApprovalRequired``) waits at our approval gate; a failed call reaches
  the model as Pydantic AI's ``ToolFailed``;
- every step of the run replays the agent (``agent.run``) with a capability that
  answers each model request and tool call from the log. At the first one the log does
  not answer, the step appends its request and stops: nothing is re-run, in this process
  or in another one that adopts the run after a crash (a replay is deterministic, so it
  asks for the same thing again, with the same deterministic ids).
- its usage limits map to our budget (:func:`budget_for`): the engine ends the run
  ``budget_exceeded``. A limit Pydantic AI checks itself during a replay ends it so too.
- in a conversation (a run started with ``conversation``) each message is another
  ``agent.run`` with the ones before as its ``message_history``; its output is the
  reply. A tool deferred to a person (``CallDeferred``, any ``kind``, or a tool of an
  ``ExternalToolset``) is a question (:class:`~aaa_django.runtime.conversation.Ask`)
  whose answer is the call's result: ``metadata`` may give its ``question``, its answer's
  JSON ``schema`` and ``expires`` (seconds).

The agent is found by a dotted path (``"myapp.agents:support"`` or
``"myapp.agents.support"``) so any process can rebuild the run. Its output is validated
by Pydantic AI (structured output, output validators, retries fed back to the model);
the run's value is ``{"output": <the output as JSON>}``, and the output's JSON schema is
in the run's config (``output_schema``).
"""

from __future__ import annotations

import asyncio
import json
import sys
import threading
from collections.abc import Iterable, Mapping
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, field_validator, model_validator

from aaa_django.data.jsonvalue import JSONObject
from aaa_django.events import Event
from aaa_django.runtime import Budget, dotted
from aaa_django.tools import Ask, GuardConfig, SchemaTool
from aaa_django.tools.tool import SchemaCall

from .agent_journal import JOURNAL
from .base import Algorithm
from .common import QUIET
from .loops import TaskInput

if TYPE_CHECKING:  # pragma: no cover
    from pydantic_ai import Agent, RunContext
    from pydantic_ai.toolsets import AbstractToolset, ToolsetTool
    from pydantic_ai.usage import UsageLimits

    from aaa_django.runtime import Ctx

#: the tag of the agent's model request number k
TAG = "agent-{}"


# -- the algorithm -----------------------------------------------------------------------------


class AgentConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    #: dotted path of the ``pydantic_ai.Agent`` (``"pkg.module:name"`` or ``"pkg.module.name"``)
    agent: str = Field(min_length=1)
    #: the model named in its requests, asked of the site's model client (None: the
    #: agent's own model answers them, where the handler's client has it:
    #: :class:`~aaa_django.llm.routes.AgentModels`; else the client's default)
    model: str | None = None
    #: the JSON schema of the agent's output (shown in the admin; informative)
    output_schema: dict[str, Any] | None = None

    @field_validator("agent")
    @classmethod
    def _loaded(cls, path: str) -> str:
        # A config may come from a stranger (the REST API): it may name an agent this
        # process has loaded (AAA["AGENTS"], WORKER_SETUP, or code that built the
        # algorithm), never make it import a module of the caller's choosing.
        loaded_agent(path)
        return path

    @model_validator(mode="after")
    def _schema(self) -> AgentConfig:
        if self.output_schema is None:
            self.output_schema = output_schema(loaded_agent(self.agent))
        return self


class PydanticAIAgent(Algorithm):
    """Run the agent at ``agent`` (a dotted path) on ``{"task": prompt}``; see the module
    docstring. Ends ``success`` with ``{"output": ...}``, ``budget_exceeded`` when a
    usage limit is hit during a replay, ``failed`` when the agent run fails (a model call
    that failed, an output the model never got right within its retries)."""

    name = "aaa.algos.PydanticAIAgent"
    Input = TaskInput
    Config = AgentConfig
    cfg: AgentConfig
    projections = (JOURNAL,)
    ignores = QUIET

    def __init__(self, agent: str, *, model: str | None = None) -> None:
        load_agent(agent)  # code that names an agent may import it
        super().__init__(agent=agent, model=model)

    def converses(self) -> bool:
        """Holds conversations (:class:`~aaa_django.runtime.conversation.Converses`)."""
        return True

    async def step(self, ctx: Ctx, event: Event) -> None:
        journal = await ctx.project(JOURNAL)
        if journal.waiting:
            return
        failed = next((m for m in journal.models if m.error is not None), None)
        if failed is not None:
            ctx.complete("failed", {"error": failed.error, "request": len(journal.models)})
            return
        from ._pydantic_replay import replay

        outcome = await replay(ctx, loaded_agent(self.cfg.agent), journal, model=self.cfg.model, path=self.cfg.agent)
        if outcome is not None:
            ctx.complete(*outcome)


def load_agent(path: str) -> Agent:
    """The ``pydantic_ai.Agent`` at a dotted path (its module imported if need be)."""
    dotted.load(path)
    return loaded_agent(path)


def loaded_agent(path: str) -> Agent:
    """The ``pydantic_ai.Agent`` at a dotted path whose module this process has
    imported already; ``ValueError`` otherwise (a run's config names only those)."""
    if dotted.split(path)[0] not in sys.modules:
        raise ValueError(f"{path!r}: no agent of that module is loaded in this process (list it in AAA['AGENTS'])")
    agent = dotted.loaded(path)
    from pydantic_ai import Agent

    if not isinstance(agent, Agent):
        raise ValueError(f"{path!r} is not a pydantic_ai.Agent but {type(agent).__name__}")
    return agent


def output_schema(agent: Agent) -> JSONObject | None:
    """The JSON schema of the agent's output type (None for plain text)."""
    # an output spec of any form (a type, ToolOutput, ...): one TypeAdapter cannot read has none
    output_type: Any = agent.output_type
    if output_type is str:
        return None
    try:
        return TypeAdapter(output_type).json_schema()
    except Exception:
        return None


def budget_for(usage_limits: UsageLimits, budget: Budget | None = None) -> Budget:
    """Pydantic AI ``UsageLimits`` as our :class:`~aaa_django.runtime.Budget` (the
    tighter of the two where ``budget`` gives a limit too): ``request_limit`` ->
    ``model_calls``, ``tool_calls_limit`` -> ``tool_calls``, ``total_tokens_limit`` ->
    ``tokens``. Input- or output-only token limits have no equivalent here: Pydantic AI
    still checks them during the replay."""
    mapped = {
        "model_calls": usage_limits.request_limit,
        "tool_calls": usage_limits.tool_calls_limit,
        "tokens": usage_limits.total_tokens_limit,
    }
    given = budget.model_dump() if budget is not None else {}
    merged = dict(given)
    for k, v in mapped.items():
        if v is not None:
            merged[k] = v if given.get(k) is None else min(v, given[k])
    return Budget(**merged)


# -- the agent's tools, for the ToolHandler ------------------------------------------------------


async def list_agent_tools(
    agent: Agent,
    *,
    deps: object = None,
    timeout: float | None = None,
    pool: str | None = None,
    side_effects: Iterable[str] = (),
    idempotent: Iterable[str] = (),
    approval_expires: float | None = None,
) -> list[SchemaTool]:
    """The agent's function tools as our tools (:class:`~aaa_django.tools.SchemaTool`),
    for the ToolHandler of every process that serves the agent's runs.

    A tool Pydantic AI marks ``requires_approval`` waits at our approval gate; ``timeout``,
    ``pool``, ``approval_expires`` apply to every tool, ``side_effects`` / ``idempotent``
    (names) put the named ones under the execution guard. A tool may say the same where
    it is defined, in Pydantic AI's ``timeout`` and ``metadata``
    (``@agent.tool_plain(timeout=30, metadata={"side_effects": True, "pool": "db"})``;
    keys ``side_effects``, ``idempotent``, ``pool``, ``approval_expires``), which wins
    over the arguments here. A tool taking ``RunContext``
    gets one with ``deps``, the agent's model, its tool name and call's retry 0 (the
    conversation is not passed: a tool that reads ``ctx.messages`` sees none).
    """
    from pydantic_ai.models import infer_model
    from pydantic_ai.models.test import TestModel
    from pydantic_ai.tools import RunContext
    from pydantic_ai.usage import RunUsage

    model = infer_model(agent.model) if agent.model is not None else TestModel()
    base = RunContext(deps=deps, model=model, usage=RunUsage())
    out = []
    for toolset in agent.toolsets:
        for name, t in (await toolset.get_tools(base)).items():
            meta = dict(t.tool_def.metadata or {})
            out.append(
                SchemaTool(
                    name,
                    dict(t.tool_def.parameters_json_schema),
                    _caller(toolset, t, base, name),
                    description=t.tool_def.description or "",
                    check=t.args_validator.validate_python,
                    timeout=t.tool_def.timeout if t.tool_def.timeout is not None else timeout,
                    pool=meta.get("pool", pool),
                    requires_approval=t.tool_def.kind == "unapproved",
                    approval_expires=meta.get("approval_expires", approval_expires),
                    guard=GuardConfig(
                        side_effects=bool(meta.get("side_effects", name in set(side_effects))),
                        idempotent=bool(meta.get("idempotent", name in set(idempotent))),
                    ),
                )
            )
    return out


def _caller(
    toolset: AbstractToolset[object], tool: ToolsetTool[object], base: RunContext[object], name: str
) -> SchemaCall:
    from pydantic_ai.exceptions import CallDeferred

    async def call(args: dict[str, Any], key: str | None) -> object:
        validated = tool.args_validator.validate_python(args)
        if tool.tool_def.kind == "external":  # its result comes from outside: a person's
            raise _ask(name, args, tool, {})
        try:
            return await toolset.call_tool(name, validated, replace(base, tool_name=name), tool)
        except CallDeferred as deferred:
            raise _ask(name, args, tool, deferred.metadata or {}) from None

    return call


def _ask(name: str, args: Mapping[str, object], tool: ToolsetTool[object], metadata: Mapping[str, object]) -> Ask:
    """A deferred call as a question to a person (see the module docstring)."""
    meta = {**dict(tool.tool_def.metadata or {}), **metadata}
    question = meta.get("question")
    if not isinstance(question, str) or not question:
        described = tool.tool_def.description or name
        question = f"{described} ({name} {json.dumps(args, ensure_ascii=False, sort_keys=True)})"
    schema = meta.get("schema")
    return Ask(
        question,
        schema=schema if isinstance(schema, dict) else None,
        expires=meta.get("expires") if isinstance(meta.get("expires"), (int, float)) else None,
    )


def agent_tools(agent: Agent, **options: Any) -> list[SchemaTool]:
    """:func:`list_agent_tools` from sync code (wiring an engine)."""
    result: list[SchemaTool] = []
    failed: list[BaseException] = []

    def main() -> None:
        try:
            result.extend(asyncio.run(list_agent_tools(agent, **options)))
        except BaseException as exc:
            failed.append(exc)

    thread = threading.Thread(target=main, name="agent-tools", daemon=True)
    thread.start()
    thread.join()
    if failed:
        raise failed[0]
    return result
