"""``Ctx``: what an algorithm's step sees and the requests it can make.

A step reads state with :meth:`Ctx.project` and asks for work with :meth:`llm`,
:meth:`tool`, :meth:`child` and :meth:`complete`. Requests are buffered and appended
by the engine when the step returns (one batch per step). Every request id is a
deterministic function of the run and a ``key``, so deciding the same thing twice
(after a redelivery, in two processes) writes it once; in a fork, the ids its copied
decisions have (:mod:`.lineage`).
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Iterable, Mapping
from datetime import datetime
from typing import Any, Protocol, TypeVar

from aaa_django.events import Event, Projection, encode_json

from .budget import Budget
from .conversation import question_data, reply_data
from .engine_api import EngineAPI
from .event_types import (
    CHILD_REQUESTED,
    LLM_REQUESTED,
    MESSAGE_SENT,
    QUESTION_ASKED,
    TOOL_REQUESTED,
)
from .lineage import decision_id
from .meta import RunMeta
from .outcome import Outcome

#: a projection's state type
S = TypeVar("S")


class TakesSteps(Protocol):
    """A run's algorithm as the engine uses it, rebuilt from its ``aaa.run.started``
    through the registry: its step on each event of the run (an
    :class:`~aaa_django.algos.Algorithm` is one; the engine reads its ``ignores`` and
    ``Input`` where it has them)."""

    async def step(self, ctx: Ctx, event: Event) -> None: ...


class Ctx:
    """The context of one step of one run."""

    def __init__(
        self,
        engine: EngineAPI,
        started: Event,
        event: Event,
        meta: RunMeta,
        algorithm: TakesSteps,
    ) -> None:
        self.engine = engine
        #: the run's ``aaa.run.started`` (hydrated)
        self.started = started
        #: the event this step was delivered (decide from state, not from this alone)
        self.event = event
        #: the engine's view of the run when the step began
        self.meta = meta
        self.algorithm = algorithm
        self._out: list[Event] = []
        self._input: Any = None
        self._llm_count = meta.spend.model_calls
        #: what the run waits for from people, with this step's replies and questions
        self._waits = meta.waits

    # -- reading ------------------------------------------------------------------

    @property
    def run_id(self) -> str:
        return self.started.stream

    @property
    def raw_input(self) -> Any:
        """The input exactly as given to ``engine.start``."""
        return self.started.data.get("input")

    @property
    def input(self) -> Any:
        """The input validated by the algorithm's ``Input`` schema (if it has one)."""
        if self._input is None:
            schema = getattr(self.algorithm, "Input", None)
            raw = self.raw_input
            self._input = schema.model_validate(raw) if schema is not None else raw
        return self._input

    @property
    def conversation(self) -> dict[str, Any] | None:
        """The run's conversation settings (``{"idle": seconds or None}``) when it is a
        conversation (:mod:`.conversation`): reply with :meth:`reply`, not ``complete``."""
        return self.meta.conversation

    async def project(self, projection: Projection[S]) -> S:
        """The state of ``projection`` over this run's (hydrated) events."""
        return await self.engine.project(projection, self.run_id)

    @property
    def emitted(self) -> list[Event]:
        """The events this step has asked for so far."""
        return list(self._out)

    # -- requests -----------------------------------------------------------------

    def emit(self, type: str, data: Mapping[str, Any] | None = None, *, key: object) -> Event:
        """Append a custom event (e.g. ``acme.plan.made``) with a deterministic id."""
        e = Event(
            id=decision_id(self.started, type, key),
            stream=self.run_id,
            type=type,
            data=dict(data or {}),
            causation=self.event.id,
            tenant=self.started.tenant,
        )
        self._out.append(e)
        return e

    def llm(
        self,
        messages: Iterable[object],
        *,
        tools: Iterable[Any] | None = None,
        tag: str | None = None,
        key: object = None,
        thread: str = "main",
        model: str | None = None,
        params: Mapping[str, Any] | None = None,
        output: Mapping[str, Any] | None = None,
    ) -> str:
        """Ask a model; return the request id (its result is ``aaa.llm.completed``).

        ``messages`` are only the messages *added* since this thread's previous
        request (the previous reply is part of the conversation already): the
        handler rebuilds the whole conversation from the log, so the log grows
        linearly. ``key`` (default: ``tag``, else the run's request count) makes the
        id deterministic. ``output`` (``{"allow_text": bool}``) goes with tools marked
        ``"kind": "output"``: whether a text answer may end the request
        (``LLMRequest.output``).
        """
        self._llm_count += 1
        if key is None:
            key = tag if tag is not None else f"#{self._llm_count}"
        data: dict[str, Any] = {
            "messages": [_plain(m) for m in messages],
            "thread": thread,
            "tag": tag,
        }
        if tools is not None:
            data["tools"] = [_spec(t) for t in tools]
        if model is not None:
            data["model"] = model
        if output is not None:
            data["output"] = dict(output)
        if params:
            data["params"] = dict(params)
        return self.emit(LLM_REQUESTED, data, key=("llm", key)).id

    def tool(
        self,
        name: str,
        args: Mapping[str, Any] | None = None,
        *,
        call_id: str,
        key: object = None,
    ) -> str:
        """Ask for a tool call; return the request id (result: ``aaa.tool.completed``
        or ``aaa.tool.failed`` with a ``reason``). ``key`` defaults to ``call_id``."""
        data = {"call_id": call_id, "name": name, "args": dict(args or {})}
        return self.emit(TOOL_REQUESTED, data, key=("tool", key if key is not None else call_id)).id

    def child(
        self,
        algorithm: Any,
        input: object,
        *,
        key: object = None,
        budget: Budget | Mapping[str, Any] | None = None,
        deadline: float | datetime | None = None,
    ) -> str:
        """Start a child run; return its run id. When it ends, this run gets
        ``aaa.child.completed`` ``{"child", "key", "outcome", "value"}``; when this
        run ends first, the child is cancelled.

        ``key`` names the child within this run (default: a hash of the algorithm,
        config and input, so asking for the same child twice starts it once; give
        distinct keys to start identical children on purpose). The child inherits
        this run's deadline unless it is given its own.
        """
        name, config = self.engine.describe(algorithm)
        if key is None:
            digest = hashlib.sha256(encode_json([name, config, _plain(input)]).encode()).hexdigest()
            key = f"{name}:{digest[:16]}"
        child_id = "run-" + decision_id(self.started, "aaa.child", key)
        data = {
            "child": child_id,
            "key": str(key),
            "algorithm": name,
            "config": config,
            "input": _plain(input),
            "budget": _budget(budget),
            "deadline": absolute_deadline(deadline) or self.meta.deadline,
        }
        self.emit(CHILD_REQUESTED, data, key=("child", key))
        return child_id

    def reply(self, content: str, *, request_id: str | None = None) -> str:
        """In a conversation: send ``content`` as the answer to the person's latest
        message (``aaa.message.sent``); the run then waits for the next message.
        ``request_id``: the model request whose reply it is (one reply each)."""
        data = reply_data(self.meta, content, request_id, self._waits)
        self._waits += 1
        return self.emit(MESSAGE_SENT, data, key=("reply", request_id or self.meta.turns + 1)).id

    def ask(
        self, question: str, *, schema: Mapping[str, Any] | None = None, key: object, expires: float | None = None
    ) -> str:
        """Ask a person ``question``; the answer must fit ``schema`` (a JSON schema; by
        default any JSON value). The run waits; the answer (or its expiry after
        ``expires`` seconds) is in :data:`~.conversation.TALK`'s ``answers`` under the
        returned question id. ``key`` names the question within the run."""
        data = question_data(question, schema, expires, self._waits)
        self._waits += 1
        return self.emit(QUESTION_ASKED, data, key=("question", key)).id

    def complete(self, outcome: str | Outcome, value: object = None) -> None:
        """End the run (``aaa.run.completed``); the first completion of a run wins."""
        o = outcome if isinstance(outcome, Outcome) else Outcome(outcome, value)
        self._out.append(self.engine.completion(self.run_id, o, cause=self.event))


def _plain(value: object) -> object:
    if hasattr(value, "model_dump"):
        return value.model_dump(mode="json", exclude_none=True)
    if isinstance(value, Mapping):
        return dict(value)
    return value


def _spec(tool: Any) -> dict[str, Any]:
    if hasattr(tool, "spec") and callable(tool.spec):
        return tool.spec()
    return dict(tool)


def _budget(budget: Budget | Mapping[str, Any] | None) -> dict[str, Any] | None:
    if budget is None:
        return None
    b = budget if isinstance(budget, Budget) else Budget(**budget)
    return b.model_dump(exclude_none=True)


def absolute_deadline(deadline: float | int | datetime | None, *, now: float | None = None) -> float | None:
    """A deadline as seconds since the epoch: ``datetime`` is absolute, a number is
    seconds from now."""
    if deadline is None:
        return None
    if isinstance(deadline, datetime):
        if deadline.tzinfo is None:
            raise ValueError("a deadline datetime must be timezone-aware")
        return deadline.timestamp()
    if isinstance(deadline, (int, float)) and not isinstance(deadline, bool):
        return (time.time() if now is None else now) + float(deadline)
    raise TypeError(f"deadline must be seconds or a datetime, not {type(deadline).__name__}")
