"""A conversation as people read it: turns of a message and its reply, with what the
run did in between (tool calls, questions to people) and what each turn cost. The
admin's transcript page and the REST API's ``GET /runs/{id}/messages`` show it.

:func:`transcript` is a pure function of a run's (hydrated) events: turn 1's message
is the run's task (its input's ``task``), each ``aaa.message.received`` opens the next
turn, and the turn's ``aaa.message.sent`` is its reply. A run that is not a
conversation reads as one turn whose reply is its result's text, if it has one.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from aaa_django.events import Event
from aaa_django.runtime.event_types import (
    CLOSE_REQUESTED,
    LLM_COMPLETED,
    LLM_FAILED,
    LLM_REQUESTED,
    MESSAGE_RECEIVED,
    MESSAGE_SENT,
    QUESTION_ANSWERED,
    QUESTION_ASKED,
    QUESTION_EXPIRED,
    RUN_COMPLETED,
    RUN_STARTED,
    TOOL_COMPLETED,
    TOOL_FAILED,
    TOOL_REQUESTED,
)
from aaa_django.runtime.meta import after
from aaa_django.store import runindex

from .hydrated import hydrated


@dataclass
class Message:
    """A message of the conversation: the person's (``user``) or the run's reply
    (``assistant``)."""

    role: str
    content: str
    turn: int
    seq: int
    time: datetime
    by: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "role": self.role,
            "content": self.content,
            "turn": self.turn,
            "seq": self.seq,
            "time": self.time,
            "by": self.by,
        }


@dataclass
class ToolCall:
    call_id: str | None
    name: str
    args: dict[str, Any]
    seq: int
    #: "running", "completed" or "failed"
    status: str = "running"
    result: str | None = None


@dataclass
class Question:
    id: str
    question: str
    schema: dict[str, Any]
    seq: int
    expires_at: float | None
    #: the tool call it belongs to, if a tool asked
    call_id: str | None = None
    #: "pending", "answered", "expired" or "closed" (the run ended first)
    status: str = "pending"
    answer: Any = None
    by: str | None = None

    @property
    def answer_text(self) -> str:
        return json.dumps(self.answer, ensure_ascii=False, sort_keys=True)


@dataclass
class Turn:
    """A message, what the run did for it, and its reply (None while it works or
    when the run ended first); its model calls' tokens and cost."""

    number: int
    message: Message | None
    reply: Message | None = None
    tools: list[ToolCall] = field(default_factory=list)
    questions: list[Question] = field(default_factory=list)
    model_calls: int = 0
    tokens_in: int = 0
    tokens_out: int = 0
    cost: float = 0.0

    @property
    def tokens(self) -> int:
        return self.tokens_in + self.tokens_out


@dataclass
class Transcript:
    conversation: bool
    turns: list[Turn]
    #: the run's outcome, once it has ended; who closed it, if someone did
    outcome: str | None = None
    closed_by: str | None = None

    def messages(self) -> list[Message]:
        """The messages in order: each turn's message, then its reply."""
        out: list[Message] = []
        for turn in self.turns:
            out += [m for m in (turn.message, turn.reply) if m is not None]
        return out

    def pending(self) -> list[Question]:
        return [q for t in self.turns for q in t.questions if q.status == "pending"]


def transcript(events: Iterable[Event]) -> Transcript:
    """The transcript of a run's hydrated events (see the module)."""
    turns: list[Turn] = []
    calls: dict[str, ToolCall] = {}
    questions: dict[str, Question] = {}
    out = Transcript(conversation=False, turns=turns)
    for e in events:
        d, seq = e.data, e.seq or 0
        turn = turns[-1] if turns else None
        if e.type == RUN_STARTED:
            out.conversation = isinstance(d.get("conversation"), dict)
            task = _task(d.get("input"))
            turns.append(Turn(1, Message("user", task, 1, seq, e.time, None) if task is not None else None))
        elif turn is None:
            continue
        elif e.type == MESSAGE_RECEIVED:
            n = len(turns) + 1
            turns.append(Turn(n, Message("user", str(d.get("content") or ""), n, seq, e.time, d.get("by"))))
        elif e.type == MESSAGE_SENT:
            turn.reply = Message("assistant", str(d.get("content") or ""), turn.number, seq, e.time)
        elif e.type == LLM_REQUESTED:
            turn.model_calls += 1
        elif e.type in (LLM_COMPLETED, LLM_FAILED):
            usage = d.get("usage") or {}
            turn.tokens_in += int(usage.get("input_tokens") or 0)
            turn.tokens_out += int(usage.get("output_tokens") or 0)
            turn.cost = round(turn.cost + float(d.get("cost") or 0.0), 12)
        elif e.type == TOOL_REQUESTED:
            call = ToolCall(d.get("call_id"), str(d.get("name") or ""), dict(d.get("args") or {}), seq)
            calls[e.id] = call
            turn.tools.append(call)
        elif e.type in (TOOL_COMPLETED, TOOL_FAILED) and e.causation in calls:
            call = calls[e.causation]
            if e.type == TOOL_COMPLETED:
                r = d.get("result")
                call.status, call.result = "completed", r if isinstance(r, str) else json.dumps(r, ensure_ascii=False)
            else:
                call.status, call.result = "failed", f"{d.get('reason')}: {d.get('error')}"
        elif e.type == QUESTION_ASKED:
            q = Question(
                e.id,
                str(d.get("question") or ""),
                dict(d.get("schema") or {}),
                seq,
                after(e, d.get("expires")),
                d.get("call_id"),
            )
            questions[e.id] = q
            turn.questions.append(q)
        elif e.type in (QUESTION_ANSWERED, QUESTION_EXPIRED) and d.get("request_id") in questions:
            q = questions[d["request_id"]]
            q.status = "answered" if e.type == QUESTION_ANSWERED else "expired"
            q.answer, q.by = d.get("answer"), d.get("by")
        elif e.type == CLOSE_REQUESTED:
            out.closed_by = d.get("by")
        elif e.type == RUN_COMPLETED:
            out.outcome = d.get("outcome")
            value = d.get("value")
            if (
                not out.conversation
                and turn.reply is None
                and isinstance(value, dict)
                and isinstance(value.get("text"), str)
            ):
                turn.reply = Message("assistant", value["text"], turn.number, seq, e.time)
            for q in questions.values():
                if q.status == "pending":
                    q.status = "closed"
    return out


def _task(value: Any) -> str | None:
    if isinstance(value, dict) and isinstance(value.get("task"), str):
        return value["task"]
    if value is None:
        return None
    return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False, sort_keys=True)


def load(run_id: str, *, using: str = "default") -> Transcript:
    """The transcript of run ``run_id``, read from the log (payloads hydrated)."""
    return transcript(hydrated(e) for e in runindex.read_all(using, run_id))
