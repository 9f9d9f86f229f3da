"""The event types the runtime writes and reacts to (``aaa.<noun>.<past-tense verb>``).

One place for the names, so a typo is an ``AttributeError`` rather than a run that
silently waits for an event nobody writes.
"""

from __future__ import annotations

from functools import lru_cache

from aaa_django.events import Event, derive_id
from aaa_django.events.store import RUN_COMPLETED, RUN_STARTED  # the log's rules name them

CANCEL_REQUESTED = "aaa.cancel.requested"

INPUT_VALIDATED = "aaa.input.validated"
INPUT_REJECTED = "aaa.input.rejected"

#: a structured result: an answer proposed, then checked by the ValidationHandler
OUTPUT_PROPOSED = "aaa.output.proposed"
OUTPUT_VALIDATED = "aaa.output.validated"
OUTPUT_REJECTED = "aaa.output.rejected"

LLM_REQUESTED = "aaa.llm.requested"
#: an attempt of a model call, on the log before it is sent to the provider
LLM_ATTEMPTED = "aaa.llm.attempted"
#: an attempt whose process died (or stood down) with it in flight: counted at its estimate
LLM_ABANDONED = "aaa.llm.abandoned"
#: the model handler's records of its attempts: the engine reacts to them (spend,
#: limits), the run's algorithm is not stepped on them
ATTEMPT_RECORDS = frozenset({LLM_ATTEMPTED, LLM_ABANDONED})
LLM_COMPLETED = "aaa.llm.completed"
LLM_FAILED = "aaa.llm.failed"

TOOL_REQUESTED = "aaa.tool.requested"
TOOL_STARTED = "aaa.tool.started"  # the guard's intent, before a side effect
TOOL_COMPLETED = "aaa.tool.completed"
TOOL_FAILED = "aaa.tool.failed"
#: a guarded call's own outcome, come after its call was settled otherwise (found
#: uncertain: a person reconciles it): the reconciliation's evidence, never the result
TOOL_RETURNED = "aaa.tool.returned"

APPROVAL_REQUESTED = "aaa.approval.requested"
APPROVAL_GRANTED = "aaa.approval.granted"
APPROVAL_DENIED = "aaa.approval.denied"
APPROVAL_EXPIRED = "aaa.approval.expired"
APPROVAL_DECISIONS = (APPROVAL_GRANTED, APPROVAL_DENIED, APPROVAL_EXPIRED)

CHILD_REQUESTED = "aaa.child.requested"
CHILD_COMPLETED = "aaa.child.completed"

#: conversations (:mod:`aaa_django.runtime.conversation`): a person's message to a
#: run, the run's reply (it then waits for the next message), a request to close it
MESSAGE_RECEIVED = "aaa.message.received"
MESSAGE_SENT = "aaa.message.sent"
CLOSE_REQUESTED = "aaa.close.requested"
#: a question to a person, with a JSON schema for the answer; its one answer or expiry
QUESTION_ASKED = "aaa.question.asked"
QUESTION_ANSWERED = "aaa.question.answered"
QUESTION_EXPIRED = "aaa.question.expired"
QUESTION_DECISIONS = (QUESTION_ANSWERED, QUESTION_EXPIRED)


@lru_cache(maxsize=1024)
def result_id(request_id: str) -> str:
    """The one id of a request's result, whatever it is (completed or failed).

    Sharing the id between the possible result types is what makes "exactly one
    result per request" hold under races: the second result is absorbed by the store.
    """
    return derive_id(request_id, "aaa.result")


def result_event(request: Event, type: str, data: dict) -> Event:
    """The result event of ``request`` (its deterministic :func:`result_id`)."""
    return Event(
        id=result_id(request.id),
        stream=request.stream,
        type=type,
        data=data,
        causation=request.id,
        tenant=request.tenant,
    )


def attempt_id(request_id: str, attempt: int) -> str:
    """The id of a model request's attempt number ``attempt`` (1-based): two processes
    that would make the same attempt write one event, and the one whose append is
    absorbed does not send it."""
    return derive_id(request_id, LLM_ATTEMPTED, attempt)


def abandoned_id(request_id: str, attempt: int) -> str:
    """The id of the record that attempt ``attempt`` of a model request was abandoned."""
    return derive_id(attempt_id(request_id, attempt), LLM_ABANDONED)


def completion_id(run_id: str) -> str:
    """The id of a run's one ``aaa.run.completed``: racing completions collapse."""
    return derive_id(run_id, RUN_COMPLETED)


def started_id(run_id: str) -> str:
    """The id of a run's ``aaa.run.started``."""
    return derive_id(run_id, RUN_STARTED)


def decision_id(approval_id: str) -> str:
    """The one id of an approval's decision (granted, denied or expired), and of a
    question's (answered or expired)."""
    return derive_id(approval_id, "aaa.approval.decision")
