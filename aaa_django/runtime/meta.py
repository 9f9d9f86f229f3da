"""``RUNMETA``: the engine's own view of a run, a projection like any other.

The engine decides limits and completion from this state alone, so any process can
adopt any run. It folds only small hot fields (usage, cost, ids, the run's limits):
the engine keeps :data:`FOLDED` in a claim-checked event's stub, so this fold (the
engine's and the run index's, over raw events) never needs a blob.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, Field

from aaa_django.events import Event, Projection

from .budget import Budget, Spend
from .event_types import (
    APPROVAL_DECISIONS,
    APPROVAL_REQUESTED,
    CANCEL_REQUESTED,
    CHILD_COMPLETED,
    CHILD_REQUESTED,
    CLOSE_REQUESTED,
    INPUT_REJECTED,
    INPUT_VALIDATED,
    LLM_ABANDONED,
    LLM_ATTEMPTED,
    LLM_COMPLETED,
    LLM_FAILED,
    LLM_REQUESTED,
    MESSAGE_RECEIVED,
    MESSAGE_SENT,
    QUESTION_ASKED,
    QUESTION_DECISIONS,
    RUN_COMPLETED,
    RUN_STARTED,
    TOOL_COMPLETED,
    TOOL_FAILED,
    TOOL_REQUESTED,
)

#: The fields :func:`apply` reads, by event type: a claim-checked event keeps them in
#: its stub (with the engine's ``hot_fields``), so a big input or big tool arguments
#: never hide a run's budget, deadline or approval gate. (A rejected input's ``errors``
#: are kept small by the ``ValidationHandler``: at most :data:`MAX_ERRORS`, big inputs
#: cut short.)
FOLDED: dict[str, tuple[str, ...]] = {
    RUN_STARTED: ("algorithm", "parent", "key", "owner", "deadline", "budget", "conversation"),
    CANCEL_REQUESTED: ("reason", "by"),
    CLOSE_REQUESTED: ("by",),
    MESSAGE_RECEIVED: ("turn", "waits", "by", "key"),
    MESSAGE_SENT: ("turn", "waits", "idle", "request_id"),
    QUESTION_ASKED: ("waits", "expires", "tool_request_id", "tool_request_seq", "call_id", "name"),
    **{t: ("request_id", "waits", "by") for t in QUESTION_DECISIONS},
    CHILD_REQUESTED: ("child", "key"),
    CHILD_COMPLETED: ("child",),
    APPROVAL_REQUESTED: ("tool_request_id", "tool_request_seq", "call_id", "name", "expires_at"),
    **{t: ("request_id",) for t in APPROVAL_DECISIONS},
    LLM_REQUESTED: ("tag", "thread"),
    LLM_ATTEMPTED: ("request_id", "attempt", "estimate", "by"),
    LLM_ABANDONED: ("request_id", "attempt", "usage", "cost"),
    LLM_COMPLETED: ("request_id", "usage", "cost"),
    LLM_FAILED: ("request_id", "usage", "cost"),
    TOOL_REQUESTED: ("call_id", "name"),
    INPUT_REJECTED: ("errors",),
}

#: Errors kept in the state for an ``invalid_input`` run (the event has them all).
MAX_ERRORS = 20


class PendingApproval(BaseModel):
    """An approval gate waiting for a decision."""

    seq: int
    tool_request_id: str
    tool_request_seq: int
    call_id: str | None = None
    name: str | None = None
    expires_at: float | None = None


class Estimate(BaseModel):
    """What a model attempt costs at most, as its maker estimated it before sending it
    (``aaa.llm.attempted``'s ``estimate``): its prompt's tokens, the reply's limit,
    priced by the client's table."""

    input_tokens: int = 0
    output_tokens: int = 0
    cost: float = 0.0

    @classmethod
    def of(cls, d: object) -> Estimate:
        d = d if isinstance(d, dict) else {}
        usage = d.get("usage")
        usage = usage if isinstance(usage, dict) else {}
        return cls(
            input_tokens=int(usage.get("input_tokens") or 0),
            output_tokens=int(usage.get("output_tokens") or 0),
            cost=float(d.get("cost") or 0.0),
        )

    def data(self) -> dict[str, object]:
        """As a result's ``usage`` and ``cost`` (what :func:`apply` tallies)."""
        return {"usage": {"input_tokens": self.input_tokens, "output_tokens": self.output_tokens}, "cost": self.cost}


class OpenCall(BaseModel):
    """A model or tool request with no result yet: what the run's end records of it (a
    result of its own before ``aaa.run.completed``), and a model call's attempts."""

    #: "llm" or "tool"
    kind: str
    seq: int = 0
    #: a model request's ``tag`` and ``thread`` (its result carries them)
    tag: str | None = None
    thread: str | None = None
    #: a tool request's ``call_id`` and ``name``
    call_id: str | None = None
    name: str | None = None
    #: the number of the model call's latest attempt on the log (0: none yet)
    attempts: int = 0
    #: of its attempts, those recorded abandoned
    abandoned: int = 0
    #: the estimate of the latest attempt while nothing says how it went: what it is
    #: counted at if it never comes back
    in_flight: Estimate | None = None
    #: the process that made the latest attempt (its ``by``: ``runtime.holding.holder_id``)
    maker: str | None = None


class PendingQuestion(BaseModel):
    """A question to a person waiting for its answer (:mod:`.conversation`)."""

    seq: int
    #: when it expires, seconds since the epoch (None: never)
    expires_at: float | None = None
    #: the tool call whose result the answer is (a tool asked), if any
    tool_request_id: str | None = None


#: a run's statuses (:attr:`RunMeta.status`), in the order a run goes through them; a
#: run index row holds one of them (never "new": a row is made with the run's start).
#: "waiting": running, and waiting for a person only (a conversation's next message, a
#: question's answer); it holds nothing but its rows meanwhile
STATUSES = ("new", "pending", "running", "waiting", "completed")
#: the statuses of a run that has not ended
OPEN_STATUSES = STATUSES[:-1]

#: the fields :meth:`RunMeta.__deepcopy__` copies (set, as an assignment would)
_COPIED = ("spend", "children", "approvals", "calls", "questions")


class RunMeta(BaseModel):
    """Status, spend and open obligations of one run."""

    run_id: str | None = None
    algorithm: str | None = None
    #: "new" (no started event), "pending" (input not validated yet), "running",
    #: "waiting" (for a person: see :attr:`waits`), "completed"
    status: str = "new"
    outcome: str | None = None
    completion_seq: int | None = None
    parent: str | None = None
    child_key: str | None = None
    owner: str | None = None
    #: absolute deadline, seconds since the epoch
    deadline: float | None = None
    budget: Budget | None = None
    spend: Spend = Field(default_factory=Spend)
    input_errors: list[Any] | None = None
    cancel: dict[str, Any] | None = None
    #: open child runs: run id -> key in this run
    children: dict[str, str] = Field(default_factory=dict)
    #: pending approvals: approval request id -> details
    approvals: dict[str, PendingApproval] = Field(default_factory=dict)
    #: model requests still waiting for a result
    llm_open: int = 0
    tool_open: int = 0
    #: the model and tool requests still waiting for a result, by request id
    calls: dict[str, OpenCall] = Field(default_factory=dict)
    #: a conversation (``aaa.run.started``'s ``conversation``: ``{"idle": seconds or
    #: None}``): after each reply the run waits for the person's next message
    conversation: dict[str, Any] | None = None
    #: replies sent (``aaa.message.sent``)
    turns: int = 0
    #: the run waits for the person's next message
    awaiting: bool = False
    #: seq of the latest reply
    reply_seq: int | None = None
    #: when an unanswered wait for the next message ends the run (idle timeout)
    idle_until: float | None = None
    #: a close requested (``aaa.close.requested``): ``{"by"}``
    close: dict[str, Any] | None = None
    #: open questions to a person: question id -> details
    questions: dict[str, PendingQuestion] = Field(default_factory=dict)
    #: what the run waits for from people (its next message, questions' answers), as the
    #: latest event that changed it says: the status is "waiting" while it is above 0.
    #: Carried by the events (each is appended against the log it counted from), so a
    #: fold that starts from the run index's row, which keeps no questions, agrees
    waits: int = 0

    def __deepcopy__(self, memo: dict | None = None) -> RunMeta:
        # The holder copies a state before folding on: copy only what the fold
        # mutates in place (spend, the two dicts); the rest is replaced, never mutated.
        # (``__copy__`` and the copied ``__dict__`` written directly: ``model_copy``
        # and assignments through pydantic's ``__setattr__`` cost twice as much, once
        # per event the engine folds; the fields set are the same.)
        new = self.__copy__()
        fields = new.__dict__
        fields["spend"] = self.spend.__copy__()
        fields["children"] = dict(self.children)
        fields["approvals"] = dict(self.approvals)
        fields["calls"] = dict(self.calls)  # (an entry is replaced, never mutated)
        fields["questions"] = dict(self.questions)
        new.model_fields_set.update(_COPIED)
        return new

    @property
    def started(self) -> bool:
        return self.status != "new"

    @property
    def completed(self) -> bool:
        return self.status == "completed"

    @property
    def validated(self) -> bool:
        return self.status in ("running", "waiting", "completed")

    def open_calls(self) -> list[tuple[str, OpenCall]]:
        """The requests without a result, oldest first: ``(request id, call)``."""
        return sorted(self.calls.items(), key=lambda item: item[1].seq)

    @property
    def due(self) -> float | None:
        """When the run's next timer falls due (seconds since the epoch): the earliest
        of its deadline, its pending approvals' and questions' expiries and, while it
        waits for a message, its idle timeout; None once it has ended or when it has
        none. Past due until something is recorded for it."""
        if not self.started or self.completed:
            return None
        times = [a.expires_at for a in self.approvals.values() if a.expires_at is not None]
        times += [q.expires_at for q in self.questions.values() if q.expires_at is not None]
        if self.deadline is not None:
            times.append(self.deadline)
        if self.awaiting and self.idle_until is not None:
            times.append(self.idle_until)
        return min(times, default=None)


def due_time(e: Event) -> float | None:
    """The time an event sets a timer for: a run's deadline (``aaa.run.started``), an
    approval's expiry (``aaa.approval.requested``), a question's (``aaa.question.asked``),
    a conversation's idle timeout (``aaa.message.sent``); None for every other event.
    What :attr:`RunMeta.due` is folded from, for an index of due times kept as events
    are stored (the engine's loop timers, the run index's ``due_at``)."""
    if e.type == RUN_STARTED:
        return e.data.get("deadline")
    if e.type == APPROVAL_REQUESTED:
        return e.data.get("expires_at")
    if e.type == QUESTION_ASKED:
        return after(e, e.data.get("expires"))
    if e.type == MESSAGE_SENT:
        return after(e, e.data.get("idle"))
    return None


def after(e: Event, seconds: object) -> float | None:
    """``seconds`` after the event's time (None when ``seconds`` is not a number): the
    expiries a step decides are relative, so a replay decides the same data."""
    if isinstance(seconds, bool) or not isinstance(seconds, (int, float)):
        return None
    return e.time.timestamp() + float(seconds)


def apply(s: RunMeta, e: Event) -> RunMeta:
    t, d = e.type, e.data
    if s.completed:
        # After the end only bookkeeping changes: late results are still paid for.
        if t in (LLM_COMPLETED, LLM_FAILED):
            _tally(s.spend, d)
            s.calls.pop(d.get("request_id") or e.causation or "", None)
        elif t in (TOOL_COMPLETED, TOOL_FAILED):
            s.calls.pop(e.causation or "", None)
        elif t == CHILD_COMPLETED:
            s.children.pop(d.get("child") or "", None)
        elif t in APPROVAL_DECISIONS:
            s.approvals.pop(d.get("request_id") or "", None)
        elif t in QUESTION_DECISIONS:
            s.questions.pop(d.get("request_id") or "", None)
        return s
    if t == RUN_STARTED:
        s.run_id = e.stream
        s.status = "pending"
        s.algorithm = d.get("algorithm")
        s.parent = d.get("parent")
        s.child_key = d.get("key")
        s.owner = d.get("owner")
        s.deadline = d.get("deadline")
        s.budget = Budget(**d["budget"]) if d.get("budget") else None
        conversation = d.get("conversation")
        s.conversation = dict(conversation) if isinstance(conversation, dict) else None
    elif t == INPUT_VALIDATED:
        if s.status == "pending":
            s.status = "waiting" if s.waits else "running"
    elif t == INPUT_REJECTED:
        s.input_errors = list(d.get("errors") or [])[:MAX_ERRORS]
    elif t == LLM_REQUESTED:
        s.spend.model_calls += 1
        s.llm_open += 1
        s.calls[e.id] = OpenCall(kind="llm", seq=e.seq or 0, tag=d.get("tag"), thread=d.get("thread"))
    elif t == LLM_ATTEMPTED:
        s.spend.attempts += 1
        call = s.calls.get(d.get("request_id") or "")
        if call is not None:
            s.calls[d["request_id"]] = call.model_copy(
                update={
                    "attempts": max(call.attempts, int(d.get("attempt") or 0)),
                    "in_flight": Estimate.of(d.get("estimate")),
                    "maker": d.get("by"),
                }
            )
    elif t == LLM_ABANDONED:
        s.spend.abandoned += 1
        _tally(s.spend, d)  # the attempt's estimate: its reply never came
        call = s.calls.get(d.get("request_id") or "")
        if call is not None:
            s.calls[d["request_id"]] = call.model_copy(update={"abandoned": call.abandoned + 1, "in_flight": None})
    elif t in (LLM_COMPLETED, LLM_FAILED):
        s.llm_open = max(0, s.llm_open - 1)
        _tally(s.spend, d)
        s.calls.pop(d.get("request_id") or e.causation or "", None)
    elif t == TOOL_REQUESTED:
        s.spend.tool_calls += 1
        s.tool_open += 1
        s.calls[e.id] = OpenCall(kind="tool", seq=e.seq or 0, call_id=d.get("call_id"), name=d.get("name"))
    elif t in (TOOL_COMPLETED, TOOL_FAILED):
        s.tool_open = max(0, s.tool_open - 1)
        s.calls.pop(e.causation or "", None)
    elif t == CANCEL_REQUESTED:
        s.cancel = s.cancel or {"reason": d.get("reason"), "by": d.get("by")}
    elif t == CHILD_REQUESTED:
        s.children[d["child"]] = d.get("key") or ""
    elif t == CHILD_COMPLETED:
        s.children.pop(d.get("child") or "", None)
    elif t == APPROVAL_REQUESTED:
        s.approvals[e.id] = PendingApproval(
            seq=e.seq or 0,
            tool_request_id=d["tool_request_id"],
            tool_request_seq=d["tool_request_seq"],
            call_id=d.get("call_id"),
            name=d.get("name"),
            expires_at=d.get("expires_at"),
        )
    elif t in APPROVAL_DECISIONS:
        s.approvals.pop(d.get("request_id") or "", None)
    elif t in _WAITS:
        _wait(s, e)
    elif t == CLOSE_REQUESTED:
        s.close = s.close or {"by": d.get("by")}
    elif t == RUN_COMPLETED:
        s.status = "completed"
        s.outcome = d.get("outcome")
        s.completion_seq = e.seq
    return s


#: the events that change what a run waits for from people
_WAITS = frozenset({MESSAGE_SENT, MESSAGE_RECEIVED, QUESTION_ASKED, *QUESTION_DECISIONS})


def _wait(s: RunMeta, e: Event) -> None:
    t, d = e.type, e.data
    if t == MESSAGE_SENT:
        s.turns += 1
        s.awaiting = True
        s.reply_seq = e.seq
        s.idle_until = after(e, d.get("idle"))
    elif t == MESSAGE_RECEIVED:
        s.awaiting = False
        s.idle_until = None
    elif t == QUESTION_ASKED:
        s.questions[e.id] = PendingQuestion(
            seq=e.seq or 0, expires_at=after(e, d.get("expires")), tool_request_id=d.get("tool_request_id")
        )
    else:
        s.questions.pop(d.get("request_id") or "", None)
    s.waits = max(0, int(d.get("waits") or 0))
    if s.status in ("running", "waiting"):
        s.status = "waiting" if s.waits else "running"


def _tally(spend: Spend, d: dict) -> None:
    usage = d.get("usage") or {}
    spend.tokens_in += int(usage.get("input_tokens") or 0)
    spend.tokens_out += int(usage.get("output_tokens") or 0)
    spend.cost = round(spend.cost + float(d.get("cost") or 0.0), 12)


RUNMETA: Projection[RunMeta] = Projection(
    RunMeta,
    apply,
    name="aaa.runtime.engine.RUNMETA",
    version=3,  # 2: conversations and questions (status "waiting"); 3: model attempts (calls)
    state_type=RunMeta,
    every=64,
)
