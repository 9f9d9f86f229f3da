"""Runs that wait for a person: conversations, and questions to people.

**A conversation** is a run started with ``conversation`` (``Engine.start(...,
conversation=True)``, or ``{"idle": seconds}``) of an algorithm that holds them
(:class:`Converses`). After each answer its step replies (:meth:`Ctx.reply`:
``aaa.message.sent``) instead of ending the run, and the run's status is ``waiting``:
it holds nothing but its rows. :func:`say` appends the person's next message
(``aaa.message.received``), and the run goes on with the whole conversation (its
model requests carry only the new message: the model handler rebuilds the rest from
the log). :func:`close` asks for its end (``aaa.close.requested``; the engine ends it
``success`` with the last reply); a wait for the next message longer than the run's
``idle`` seconds ends it ``timeout`` (``{"reason": "idle"}``: a due time, fired by
whatever fires the run's deadline). The run's budget and deadline hold for the whole
conversation: a message the budget leaves no model call for is refused, not appended.

**A question** (LangGraph's ``interrupt()`` with a value): a step asks with
:meth:`Ctx.ask`, a tool by raising :class:`Ask`: ``aaa.question.asked`` with the
question, a JSON schema for the answer and an expiry; the run waits. :func:`answer`
checks the answer against the schema (:class:`ConversationError` with the errors
otherwise, and nothing is appended) and records ``aaa.question.answered``; a tool's
question is answered by the tool call's result too (``aaa.tool.completed`` with the
answer). An expiry records ``aaa.question.expired`` (and fails a tool's call with
reason ``expired``).

**What a run waits for** (its ``waits``: the next message, open questions) is carried
by every event that changes it, counted from the log the event is appended after:
each is appended by a step (guarded by the log the step read) or here, against the
head the decision was made from (:meth:`Engine.append_at`), so two people acting at
once cannot both decide from one log. ``RUNMETA``'s status follows it, and so does a
fold that starts from the run index's row (which keeps no questions).

:data:`TALK` is the conversation as an algorithm needs it: the turn, the message to
answer, the open questions and the answers given.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, replace
from typing import Any, Protocol, runtime_checkable

from jsonschema import Draft202012Validator
from jsonschema.exceptions import SchemaError
from pydantic import BaseModel, ConfigDict, Field

from aaa_django.events import ClosedStreamError, ConcurrencyError, Event, Projection, derive_id

from . import registry
from .engine_api import EngineAPI
from .event_types import (
    CLOSE_REQUESTED,
    LLM_REQUESTED,
    MESSAGE_RECEIVED,
    MESSAGE_SENT,
    QUESTION_ANSWERED,
    QUESTION_ASKED,
    QUESTION_EXPIRED,
    TOOL_COMPLETED,
    TOOL_FAILED,
    decision_id,
    result_id,
)
from .lineage import decision_id as run_decision_id
from .meta import RUNMETA, RunMeta, after
from .outcome import SUCCESS, TIMEOUT, Outcome
from .wakeups import RELIABLE_POLL, poll_intervals

#: the longest message accepted (characters)
MAX_MESSAGE = 100_000
#: tries of a decision whose append finds the log moved on
TRIES = 8


# -- what may hold a conversation --------------------------------------------------------


@runtime_checkable
class Converses(Protocol):
    """An algorithm that holds conversations: in a run started with ``conversation``,
    its step replies (:meth:`~aaa_django.runtime.Ctx.reply`) where it would end the
    run, and answers each message that follows (:data:`TALK`'s ``message``). Detected
    once, when such a run starts."""

    def converses(self) -> bool:
        """Whether this instance (its config) holds conversations."""
        ...


def conversational() -> list[str]:
    """The registered algorithms that hold conversations (their class does)."""
    return [name for name in registry.names() if issubclass(registry.get(name), Converses)]


def settings(conversation: object) -> dict[str, Any] | None:
    """A run's ``conversation`` as stored in its ``aaa.run.started``: None (not one), or
    ``{"idle": seconds or None}`` from ``True`` or ``{"idle": seconds}``."""
    if conversation is None or conversation is False:
        return None
    if conversation is True:
        return {"idle": None}
    if isinstance(conversation, Mapping):
        extra = set(conversation) - {"idle"}
        if extra:
            raise ValueError(f"a conversation takes only 'idle', not {sorted(extra)}")
        idle = conversation.get("idle")
        if idle is not None and (isinstance(idle, bool) or not isinstance(idle, (int, float)) or idle <= 0):
            raise ValueError("a conversation's idle timeout is a number of seconds above 0")
        return {"idle": float(idle) if idle is not None else None}
    raise TypeError(f"conversation is True, False or {{'idle': seconds}}, not {conversation!r}")


def check_algorithm(name: str, config: Mapping[str, Any]) -> None:
    """Raise :class:`ConversationError` (``not_conversational``) unless the algorithm
    ``name`` with ``config`` holds conversations."""
    algorithm = registry.build(name, dict(config))
    if isinstance(algorithm, Converses) and algorithm.converses():
        return
    these = ", ".join(conversational()) or "none is registered"
    why = "with this config" if isinstance(algorithm, Converses) else "at all"
    raise ConversationError("not_conversational", f"{name} does not hold conversations {why}; these do: {these}")


# -- errors ------------------------------------------------------------------------------


class ConversationError(ValueError):
    """A person's action a run cannot take now; ``code`` says why:

    ``not_conversational`` (the run or its algorithm holds no conversation),
    ``not_waiting`` (the run is not waiting for a message), ``ended``, ``over_budget``,
    ``idempotency_conflict`` (a message's key was used with another content),
    ``not_open`` (no such question is waiting), ``invalid_answer`` (``errors``: where
    the answer does not fit the schema), ``expired`` (the question had expired: it is
    recorded so)."""

    def __init__(self, code: str, message: str, *, errors: list[dict[str, Any]] | None = None) -> None:
        super().__init__(message)
        self.code = code
        self.errors = errors or []


class Ask(Exception):
    """Raised by a tool to ask a person: the run waits; the answer (checked against
    ``schema``, a JSON schema; by default any JSON value) is the call's result. After
    ``expires`` seconds unanswered the call fails with reason ``expired``."""

    def __init__(self, question: str, *, schema: Mapping[str, Any] | None = None, expires: float | None = None) -> None:
        super().__init__(question)
        self.question = question
        self.schema = dict(schema) if schema is not None else {}
        self.expires = expires
        check_schema(self.schema)


def check_schema(schema: Mapping[str, Any]) -> None:
    """``ValueError`` unless ``schema`` is a valid JSON schema (draft 2020-12)."""
    try:
        Draft202012Validator.check_schema(dict(schema))
    except SchemaError as exc:
        raise ValueError(f"not a valid JSON schema: {exc.message}") from None


def answer_errors(schema: Mapping[str, Any], value: object) -> list[dict[str, Any]]:
    """Where ``value`` does not fit ``schema``: pydantic's error shape (``loc``, ``msg``,
    ``type``: the failed keyword), in the order of their place in the answer."""
    validator = Draft202012Validator(dict(schema))
    errors = sorted(validator.iter_errors(value), key=lambda e: [str(p) for p in e.absolute_path])
    return [{"loc": list(e.absolute_path), "msg": e.message, "type": str(e.validator)} for e in errors]


# -- TALK: the conversation as an algorithm needs it --------------------------------------


class Question(BaseModel):
    """An open question."""

    question: str = ""
    schema_: dict[str, Any] = Field(default_factory=dict, alias="schema")
    #: the tool call it belongs to (a tool asked), if any
    tool_request_id: str | None = None

    model_config = ConfigDict(populate_by_name=True)


class Answer(BaseModel):
    """A question's end: ``ok`` with the ``value`` given, or expired."""

    ok: bool
    value: Any = None


class Talk(BaseModel):
    """Where a conversation is: replies sent (``turn``), the message to answer, the
    open questions and the answers given."""

    #: replies sent, and messages received after the first (the run's task)
    turn: int = 0
    received: int = 0
    #: the request id the latest reply answered (None: a reply not from a model request)
    replied: str | None = None
    #: the latest message received and not yet taken up by a model request: its
    #: content (None: none waits)
    message: str | None = None
    #: model requests made so far, and how many there were when ``message`` came
    requests: int = 0
    base: int = 0
    #: open questions, by id
    questions: dict[str, Question] = Field(default_factory=dict)
    #: answered or expired questions asked by the algorithm (not a tool's), by id
    answers: dict[str, Answer] = Field(default_factory=dict)

    def __deepcopy__(self, memo: dict | None = None) -> Talk:
        new = self.__copy__()
        fields = new.__dict__
        fields["questions"] = dict(self.questions)
        fields["answers"] = dict(self.answers)
        new.model_fields_set.update(("questions", "answers"))
        return new


def _talk(s: Talk, e: Event) -> Talk:
    t, d = e.type, e.data
    if t == LLM_REQUESTED:
        s.requests += 1
        s.message = None
    elif t == MESSAGE_RECEIVED:
        s.received += 1
        s.message = d.get("content") or ""
        s.base = s.requests
    elif t == MESSAGE_SENT:
        s.turn += 1
        s.replied = d.get("request_id")
    elif t == QUESTION_ASKED:
        s.questions[e.id] = Question(
            question=d.get("question") or "", schema=d.get("schema") or {}, tool_request_id=d.get("tool_request_id")
        )
    elif t in (QUESTION_ANSWERED, QUESTION_EXPIRED):
        asked = s.questions.pop(d.get("request_id") or "", None)
        if asked is not None and asked.tool_request_id is None:
            s.answers[d["request_id"]] = Answer(ok=t == QUESTION_ANSWERED, value=d.get("answer"))
    return s


TALK: Projection[Talk] = Projection(
    Talk,
    _talk,
    name="aaa.runtime.conversation.TALK",
    version=1,
    state_type=Talk,
    every=64,
)


# -- what a step writes (Ctx.reply, Ctx.ask) ----------------------------------------------


def reply_data(meta: RunMeta, content: str, request_id: str | None, waits: int) -> dict[str, Any]:
    """``aaa.message.sent``'s data for a step's reply (``waits``: the run's before it)."""
    if meta.conversation is None:
        raise ValueError("reply() is for conversations: this run ends with complete()")
    if not isinstance(content, str):
        raise TypeError(f"a reply is text, not {type(content).__name__}")
    return {
        "content": content,
        "turn": meta.turns + 1,
        "request_id": request_id,
        "idle": meta.conversation.get("idle"),
        "waits": waits + 1,
    }


def question_data(question: str, schema: Mapping[str, Any] | None, expires: float | None, waits: int) -> dict[str, Any]:
    """``aaa.question.asked``'s data (``waits``: the run's before it)."""
    if not isinstance(question, str) or not question:
        raise ValueError("a question is a non-empty string")
    schema = dict(schema) if schema is not None else {}
    check_schema(schema)
    if expires is not None and (isinstance(expires, bool) or not isinstance(expires, (int, float)) or expires <= 0):
        raise ValueError("a question's expiry is a number of seconds above 0")
    return {
        "question": question,
        "schema": schema,
        "expires": float(expires) if expires is not None else None,
        "waits": waits + 1,
    }


# -- what people do ----------------------------------------------------------------------


Decide = Callable[[RunMeta, int], Awaitable[list[Event]]]


async def decided(engine: EngineAPI, run_id: str, decide: Decide) -> list[Event]:
    """``decide(meta, head)``'s events appended against the log it decided from (the
    run's RUNMETA at seq ``head``); decided again from the log as it is when something
    was appended meanwhile. Returns the events appended."""
    for _ in range(TRIES):
        engine.tail.stale(run_id)  # (within a delivery, a tool's question: read what is new)
        loaded = await RUNMETA.load_info(engine.store, run_id, cache=engine.cache)
        events = await decide(loaded.state, loaded.seq)
        if not events:
            return []
        try:
            return await engine.append_at(events, loaded.seq)
        except (ConcurrencyError, ClosedStreamError):
            continue  # the log moved on (or the run ended): decide again
    raise ConcurrencyError(f"run {run_id} kept changing while a person's action was decided")


def _open(meta: RunMeta, run_id: str) -> None:
    if not meta.started:
        raise ConversationError("not_found", f"no run {run_id}")
    if meta.completed:
        raise ConversationError("ended", f"the run has ended ({meta.outcome})")


@dataclass(frozen=True)
class Said:
    """A message :func:`say` appended, or found: sent before with the same key."""

    message: Event
    replayed: bool = False


async def say(engine: EngineAPI, run_id: str, content: str, *, by: str | None = None, key: str | None = None) -> Said:
    """Append a person's message to a conversation waiting for it. With ``key`` (an
    Idempotency-Key), the message already sent with that key is returned instead of
    appending another (``replayed``; one with other content: ``idempotency_conflict``).
    Raises :class:`ConversationError` when the run cannot take a message now."""
    if not isinstance(content, str) or not content.strip():
        raise ConversationError("invalid", "a message is a non-empty string")
    if len(content) > MAX_MESSAGE:
        raise ConversationError("invalid", f"a message is at most {MAX_MESSAGE} characters")
    started = await engine.started(run_id)
    if started is None:
        raise ConversationError("not_found", f"no run {run_id}")
    keyed = run_decision_id(started, MESSAGE_RECEIVED, "key", key) if key is not None else None
    mine: list[Event] = []

    async def decide(meta: RunMeta, head: int) -> list[Event]:
        mine.clear()
        if keyed is not None:
            known = await engine.find_after(started, [keyed])
            if keyed in known:
                mine.append(known[keyed])
                return []
        _open(meta, run_id)
        if meta.conversation is None:
            raise ConversationError("not_conversational", "this run is not a conversation")
        if not meta.awaiting or meta.close is not None:
            why = (
                "a close was asked"
                if meta.close is not None
                else ("it is answering" if not meta.waits else "it waits for an answer to a question")
            )
            raise ConversationError("not_waiting", f"the conversation is not waiting for a message: {why}")
        limit = engine.limit_breach(meta)
        if limit is not None:
            raise ConversationError("ended", f"the run is ending ({limit.outcome}): {limit.value}")
        over = no_room(meta)
        if over is not None:
            raise ConversationError("over_budget", over)
        data = {"content": content, "turn": meta.turns + 1, "by": by, "waits": max(0, meta.waits - 1)}
        if key is not None:
            data["key"] = key
        mid = keyed if keyed is not None else run_decision_id(started, MESSAGE_RECEIVED, meta.turns + 1)
        return [Event(id=mid, stream=run_id, type=MESSAGE_RECEIVED, data=data, tenant=started.tenant)]

    added = await decided(engine, run_id, decide)
    message = added[0] if added else (mine[0] if mine else None)
    if message is None:  # absorbed: a message for this turn came first
        raise ConversationError(
            "not_waiting", "the conversation is not waiting for a message: another message came first"
        )
    if key is not None and message.data.get("content") != content:
        raise ConversationError("idempotency_conflict", "this key was used with another message")
    return Said(message, replayed=not added)


def no_room(meta: RunMeta) -> str | None:
    """Why the run's budget leaves no model call for one more message, or None."""
    b, s = meta.budget, meta.spend
    if b is None:
        return None
    refused = b.refuses(s, model_calls=1)
    if refused is not None:
        return (
            f"the conversation's budget is spent: {refused['dimension']} {refused['spent']} "
            f"of {refused['limit']}; close it or start another"
        )
    for dimension, limit, spent in (("tokens", b.tokens, s.tokens), ("cost", b.cost, s.cost)):
        if limit is not None and spent >= limit:
            return f"the conversation's budget is spent: {dimension} {spent} of {limit}; close it or start another"
    return None


async def close(engine: EngineAPI, run_id: str, *, by: str | None = None) -> bool:
    """Ask for a waiting conversation's end (``aaa.close.requested``): the engine ends
    it ``success`` with its last reply. True if this asked; ``ConversationError`` when
    it cannot be closed (not a conversation, ended, not waiting)."""

    async def decide(meta: RunMeta, head: int) -> list[Event]:
        _open(meta, run_id)
        if meta.conversation is None:
            raise ConversationError("not_conversational", "this run is not a conversation")
        if meta.close is not None:
            return []
        if not meta.waits:
            raise ConversationError(
                "not_waiting", "the conversation is answering: close it when it waits, or cancel it"
            )
        return [Event(id=derive_id(run_id, CLOSE_REQUESTED), stream=run_id, type=CLOSE_REQUESTED, data={"by": by})]

    return bool(await decided(engine, run_id, decide))


async def closing(engine: EngineAPI, meta: RunMeta) -> Outcome:
    """The outcome of a conversation whose close was asked: ``success`` with its last
    reply's text, the replies sent and who closed it."""
    text = None
    if meta.reply_seq is not None and meta.run_id is not None:
        found = await engine.store.read(meta.run_id, after=meta.reply_seq - 1, limit=1)
        if found:
            text = (await engine.hydrate(found[0])).data.get("content")
    return Outcome(SUCCESS, {"text": text, "turns": meta.turns, "closed_by": (meta.close or {}).get("by")})


async def answer(engine: EngineAPI, run_id: str, question_id: str, value: object, *, by: str | None = None) -> Event:
    """Record the answer to an open question; return ``aaa.question.answered``. Raises
    :class:`ConversationError`: ``not_open`` (no such question waits), ``invalid_answer``
    (it does not fit the question's schema; nothing is recorded), ``expired`` (it
    expired: recorded so), ``ended``."""
    try:
        json.dumps(value, allow_nan=False)
    except (TypeError, ValueError):
        raise ConversationError("invalid_answer", "an answer is a JSON value") from None
    expired = False

    async def decide(meta: RunMeta, head: int) -> list[Event]:
        nonlocal expired
        _open(meta, run_id)
        pending = meta.questions.get(question_id)
        if pending is None:
            raise ConversationError("not_open", "no such question waits for an answer in this run")
        asked = await _asked(engine, run_id, pending.seq, question_id)
        if pending.expires_at is not None and time.time() >= pending.expires_at:
            expired = True
            return _ending(meta, asked, QUESTION_EXPIRED, {})
        errors = answer_errors(asked.data.get("schema") or {}, value)
        if errors:
            raise ConversationError("invalid_answer", "the answer does not fit the question's schema", errors=errors)
        return _ending(meta, asked, QUESTION_ANSWERED, {"answer": value, "by": by})

    added = await decided(engine, run_id, decide)
    if expired:
        raise ConversationError("expired", "this question had expired; it is recorded as expired")
    if not added:
        raise ConversationError("not_open", "no such question waits for an answer in this run")
    return added[0]


async def _asked(engine: EngineAPI, run_id: str, seq: int, question_id: str) -> Event:
    found = await engine.store.read(run_id, after=seq - 1, limit=1)
    if not found or found[0].id != question_id:
        raise ConversationError("not_open", "the question is not in the run's log")
    return await engine.hydrate(found[0])


def _ending(meta: RunMeta, asked: Event, type: str, extra: Mapping[str, object]) -> list[Event]:
    """A question's answer or expiry, and for a tool's question the call's result."""
    d = asked.data
    data = {"request_id": asked.id, **extra, "waits": max(0, meta.waits - 1)}
    tool = d.get("tool_request_id")
    if tool is not None:
        data["tool_request_id"] = tool
    out = [
        Event(
            id=decision_id(asked.id), stream=asked.stream, type=type, data=data, causation=asked.id, tenant=asked.tenant
        )
    ]
    if tool is not None:
        base = {"call_id": d.get("call_id"), "name": d.get("name")}
        result = (
            {**base, "result": extra["answer"]}
            if type == QUESTION_ANSWERED
            else {**base, "reason": "expired", "error": "the question to a person expired unanswered"}
        )
        out.append(
            Event(
                id=result_id(tool),
                stream=asked.stream,
                type=TOOL_COMPLETED if type == QUESTION_ANSWERED else TOOL_FAILED,
                data=result,
                causation=tool,
                tenant=asked.tenant,
            )
        )
    return out


async def ask_for_tool(engine: EngineAPI, request: Event, ask: Ask) -> None:
    """A tool call raised :class:`Ask`: its question, derived from the call's request
    (asked once however often the request is delivered)."""

    async def decide(meta: RunMeta, head: int) -> list[Event]:
        if meta.completed:
            return []
        data = question_data(ask.question, ask.schema, ask.expires, meta.waits)
        data.update(
            tool_request_id=request.id,
            tool_request_seq=request.seq,
            call_id=request.data.get("call_id"),
            name=request.data.get("name"),
        )
        return [request.derive(QUESTION_ASKED, data)]

    await decided(engine, request.stream, decide)


def asked_id(request: Event) -> str:
    """The id of the question a tool call's request asks, if its tool asks one."""
    return request.derive(QUESTION_ASKED).id


async def waiting(engine: EngineAPI, run_id: str, *, timeout: float | None = None) -> RunMeta:
    """Wait until the run waits for a person (status ``waiting``) or has ended; return
    its RUNMETA then. Woken by what may settle it (the engine wakes a run's waiters
    when it appends a reply, a question or the end; on PostgreSQL so do such appends of
    any process), polling at the engine's pace for what no one announces.
    ``TimeoutError`` after ``timeout`` seconds."""
    sub = engine.wakeups.subscribe(run_id, asyncio.get_running_loop(), ends_only=True)

    async def look() -> RunMeta:
        for interval in poll_intervals(engine.poll_interval):
            sub.clear()
            # read past the engine's tail and fold holder: a look at a run that waits
            # must not make the engine hold it again
            meta = await RUNMETA.load(engine.base_store, run_id)
            if meta.status in ("waiting", "completed"):
                return meta
            await sub.until(max(interval, RELIABLE_POLL) if engine.wakeups.reliable() else interval)
        raise AssertionError("unreachable")  # (poll_intervals never ends)

    try:
        return await asyncio.wait_for(look(), timeout)
    finally:
        sub.close()


# -- timers ------------------------------------------------------------------------------


async def fire_due(engine: EngineAPI, run_id: str, now: float) -> list[Event]:
    """What a conversation's and questions' due times call for at ``now``: the run ends
    ``timeout`` when its wait for the next message has outlasted its idle timeout;
    each open question past its expiry is recorded expired. Returns the events
    appended."""

    async def decide(meta: RunMeta, head: int) -> list[Event]:
        if not meta.started or meta.completed:
            return []
        if meta.awaiting and meta.idle_until is not None and now >= meta.idle_until:
            idle = (meta.conversation or {}).get("idle")
            started = await engine.started(run_id)
            outcome = Outcome(TIMEOUT, {"reason": "idle", "idle": idle, "turns": meta.turns})
            return [engine.completion(run_id, outcome, cause=started)]
        due = sorted(
            (q.seq, qid) for qid, q in meta.questions.items() if q.expires_at is not None and now >= q.expires_at
        )
        out: list[Event] = []
        waits = meta.waits
        for seq, qid in due:
            asked = await _asked(engine, run_id, seq, qid)
            ending = _ending(meta, asked, QUESTION_EXPIRED, {})
            waits = max(0, waits - 1)
            ending[0] = _with_waits(ending[0], waits)
            out.extend(ending)
        return out

    return await decided(engine, run_id, decide)


def _with_waits(e: Event, waits: int) -> Event:
    return replace(e, data={**e.data, "waits": waits})


__all__ = [
    "TALK",
    "Answer",
    "Ask",
    "ConversationError",
    "Converses",
    "Question",
    "Said",
    "Talk",
    "after",
    "answer",
    "answer_errors",
    "ask_for_tool",
    "waiting",
    "asked_id",
    "check_algorithm",
    "check_schema",
    "close",
    "closing",
    "conversational",
    "fire_due",
    "no_room",
    "say",
    "settings",
]
