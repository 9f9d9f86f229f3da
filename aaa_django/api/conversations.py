"""The REST API of runs that wait for a person (on the same router as the rest).

- ``POST /runs/{id}/messages`` ``{"content"}``: the run's owner sends a conversation
  waiting for it its next message (201; with ``Idempotency-Key`` the same key and
  content give the same message, 200). 409 when the run is not waiting for a message
  (answering, ended, or its budget leaves no model call: the reason says which).
- ``GET /runs/{id}/messages``: the conversation so far, message and reply by turn.
- ``POST /runs/{id}/close``: end a waiting conversation ``success`` (202).
- ``GET /runs/{id}/questions``: the run's questions to people, open and answered, each
  with the JSON schema its answer must fit.
- ``POST /runs/{id}/questions/{question_id}`` ``{"answer": <any JSON>}``: answer one
  (its owner, or whoever holds ``aaa.answer_run``); 422 with where the answer does not
  fit, 409 when it was answered, expired or the run ended.

The actions go through the process's engine (:mod:`aaa_django.runtime.conversation`:
each is appended against the log it was decided from); the reads come from the log.
"""

from __future__ import annotations

import logging
from datetime import UTC, datetime
from typing import Any

from django.http import HttpRequest, HttpResponse
from ninja import Header, Path, Schema
from ninja.responses import Status
from pydantic import ConfigDict, Field, StrictStr

from aaa_django import access
from aaa_django.events import Event
from aaa_django.reading import transcript
from aaa_django.runtime import conversation
from aaa_django.runtime.conversation import MAX_MESSAGE, ConversationError
from aaa_django.store import runindex

from . import auth, runs
from .contract import CONVERSATIONS
from .errors import ApiError, not_found
from .router import _READ, _WRITE, RunId, host, router
from .schemas import ID_PATTERN, KEY_PATTERN
from .schemas import Status as RunStatus
from .talk import refusal

log = logging.getLogger("aaa_django.api")

#: the tag of these operations in the OpenAPI schema
TAG = CONVERSATIONS


class MessageIn(Schema):
    model_config = ConfigDict(extra="forbid", json_schema_extra={"examples": [{"content": "And Porto?"}]})

    content: StrictStr = Field(min_length=1, max_length=MAX_MESSAGE)


class MessageOut(Schema):
    """A message of the conversation: the person's (``user``) or the run's reply
    (``assistant``), its turn, the seq of its event."""

    role: str
    content: str
    turn: int
    seq: int
    time: datetime
    by: str | None = None


class SentOut(Schema):
    """A message appended: it, and the run's status now (``running``: it is answering)."""

    message: MessageOut
    status: RunStatus


class TranscriptOut(Schema):
    conversation: bool
    status: RunStatus
    #: the messages in order, each turn's message then its reply
    items: list[MessageOut]


class CloseOut(Schema):
    id: str
    close_requested: bool
    status: RunStatus


class QuestionOut(Schema):
    """A question to a person: ``pending`` until answered, ``expired`` or ``closed`` (the
    run ended first); ``schema``: what an answer must fit (JSON Schema)."""

    id: str
    seq: int
    turn: int
    question: str
    #: the JSON schema an answer must fit ("schema" is pydantic's own name)
    answer_schema: dict[str, Any] = Field(alias="schema")
    status: str
    expires_at: datetime | None = None
    #: the tool call it belongs to, when a tool asked
    call_id: str | None = None
    answer: Any = None
    by: str | None = None

    model_config = ConfigDict(populate_by_name=True)


class AnswerIn(Schema):
    model_config = ConfigDict(extra="forbid", json_schema_extra={"examples": [{"answer": {"city": "Lyon"}}]})

    answer: Any = Field(description="any JSON value that fits the question's schema")


class AnswerOut(Schema):
    question_id: str
    answer: Any = None
    by: str | None = None
    status: RunStatus


def _from_epoch(value: float | None) -> datetime | None:
    return datetime.fromtimestamp(value, UTC) if value is not None else None


def _message(m: transcript.Message) -> dict[str, Any]:
    return m.to_dict()


def _message_event(e: Event) -> dict[str, object]:
    d = e.data
    return {
        "role": "user",
        "content": d.get("content") or "",
        "turn": d.get("turn") or 0,
        "seq": e.seq or 0,
        "time": e.time,
        "by": d.get("by"),
    }


@router.post(
    "/runs/{run_id}/messages",
    response={201: SentOut, 200: SentOut, **_WRITE},
    summary="Send a conversation its next message",
    operation_id="send_message",
    tags=[TAG],
)
def send_message(
    request: HttpRequest,
    response: HttpResponse,
    payload: MessageIn,
    run_id: str = RunId,
    idempotency_key: str | None = Header(
        None,
        alias="Idempotency-Key",
        pattern=KEY_PATTERN,
        description="the same key and content return the same message; other content: 409",
    ),
) -> Status:
    """Append the person's next message to a conversation waiting for it (its owner
    only); the run goes on with the whole conversation. 409 with the reason when it is
    not waiting for a message."""
    p: auth.Principal = request.auth
    row = runs.load(p, run_id)
    if not access.owns(p.user, row.owner_id):
        raise ApiError(403, ["path", "run_id"], "only the run's owner talks to it", "permission_denied")
    try:
        said = host().call(
            lambda engine: conversation.say(engine, run_id, payload.content, by=p.label, key=idempotency_key)
        )
    except ConversationError as exc:
        loc = (
            ["body", "content"]
            if exc.code == "invalid"
            else (["header", "Idempotency-Key"] if exc.code == "idempotency_conflict" else ["path", "run_id"])
        )
        raise refusal(exc, loc) from None
    row = runindex.refresh(runs.USING, run_id) or row
    body = {"message": _message_event(said.message), "status": row.status}
    if said.replayed:
        response["Idempotent-Replayed"] = "true"
        return Status(200, body)
    log.info("run %s: message %s from %s", run_id, said.message.data.get("turn"), p.label)
    return Status(201, body)


@router.get(
    "/runs/{run_id}/messages",
    response={200: TranscriptOut, **_READ},
    summary="Read a conversation",
    operation_id="list_messages",
    tags=[TAG],
)
def list_messages(request: HttpRequest, run_id: str = RunId) -> dict[str, object]:
    """The conversation so far: each turn's message, then its reply. (A run that is not a
    conversation: its task, and its result's text.)"""
    row = runs.load(request.auth, run_id)
    t = transcript.load(run_id, using=runs.USING)
    return {"conversation": t.conversation, "status": row.status, "items": [_message(m) for m in t.messages()]}


@router.post(
    "/runs/{run_id}/close",
    response={202: CloseOut, **_WRITE},
    summary="Close a conversation",
    operation_id="close_conversation",
    tags=[TAG],
)
def close_conversation(request: HttpRequest, run_id: str = RunId) -> Status:
    """End a conversation waiting for its next message: it ends ``success`` with its last
    reply. 409 while it is answering (cancel it instead) or once it has ended."""
    p: auth.Principal = request.auth
    runs.load(p, run_id, "close")
    try:
        asked = host().call(lambda engine: conversation.close(engine, run_id, by=p.label))
    except ConversationError as exc:
        raise refusal(exc, ["path", "run_id"]) from None
    row = runindex.refresh(runs.USING, run_id)
    if asked:
        log.info("run %s closed by %s", run_id, p.label)
    return Status(202, {"id": run_id, "close_requested": True, "status": row.status if row else "completed"})


def _questions(run_id: str) -> list[dict[str, Any]]:
    t = transcript.load(run_id, using=runs.USING)
    return [
        {
            "id": q.id,
            "seq": q.seq,
            "turn": turn.number,
            "question": q.question,
            "schema": q.schema,
            "status": q.status,
            "expires_at": _from_epoch(q.expires_at),
            "call_id": q.call_id,
            "answer": q.answer,
            "by": q.by,
        }
        for turn in t.turns
        for q in turn.questions
    ]


@router.get(
    "/runs/{run_id}/questions",
    response={200: list[QuestionOut], **_READ},
    by_alias=True,
    summary="List a run's questions",
    operation_id="list_questions",
    tags=[TAG],
)
def list_questions(request: HttpRequest, run_id: str = RunId) -> list[dict[str, object]]:
    """The run's questions to people, in order: each with the JSON schema its answer
    must fit, its status and, once answered, the answer and who gave it."""
    runs.load(request.auth, run_id)
    return _questions(run_id)


@router.post(
    "/runs/{run_id}/questions/{question_id}",
    response={200: AnswerOut, **_WRITE},
    summary="Answer a question",
    operation_id="answer_question",
    tags=[TAG],
)
def answer_question(
    request: HttpRequest,
    payload: AnswerIn,
    run_id: str = RunId,
    question_id: str = Path(..., pattern=ID_PATTERN, max_length=200, description="the aaa.question.asked event's id"),
) -> dict[str, object]:
    """Answer a pending question (the run's owner, or whoever holds ``aaa.answer_run``):
    checked against its schema (422 with where it does not fit; nothing is recorded),
    then recorded with who answered; the run goes on. 409 when it is not pending."""
    p: auth.Principal = request.auth
    runs.load(p, run_id, "answer")
    found = next((q for q in _questions(run_id) if q["id"] == question_id), None)
    if found is None:
        raise not_found(["path", "question_id"], "question in this run")
    if found["status"] != "pending":
        raise ApiError(409, ["path", "question_id"], f"this question is {found['status']}", found["status"])
    try:
        host().call(lambda engine: conversation.answer(engine, run_id, question_id, payload.answer, by=p.label))
    except ConversationError as exc:
        loc = ["body", "answer"] if exc.code == "invalid_answer" else ["path", "question_id"]
        raise refusal(exc, loc) from None
    row = runindex.refresh(runs.USING, run_id)
    log.info("question %s of run %s answered by %s", question_id, run_id, p.label)
    return {
        "question_id": question_id,
        "answer": payload.answer,
        "by": p.label,
        "status": row.status if row else "completed",
    }
