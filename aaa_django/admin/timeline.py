"""A run's event timeline: pages of rows, each with a one-line summary of its event.

Pages are ranges of ``seq`` (dense from 1 in every stream), so page ``k`` is one
indexed range query whatever the length of the log: a 50,000-event run costs the
same to open as a 5-event one. Summaries read only the event's own data (a
claim-checked event shows its hot fields and is marked for hydration on demand).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from aaa_django.data import CLAIM_MARKER
from aaa_django.models import EventRecord
from aaa_django.runtime.event_types import (
    APPROVAL_DENIED,
    APPROVAL_EXPIRED,
    APPROVAL_GRANTED,
    APPROVAL_REQUESTED,
    CANCEL_REQUESTED,
    CHILD_COMPLETED,
    CHILD_REQUESTED,
    INPUT_REJECTED,
    INPUT_VALIDATED,
    LLM_ABANDONED,
    LLM_ATTEMPTED,
    LLM_COMPLETED,
    LLM_FAILED,
    LLM_REQUESTED,
    OUTPUT_PROPOSED,
    OUTPUT_REJECTED,
    OUTPUT_VALIDATED,
    RUN_COMPLETED,
    RUN_STARTED,
    TOOL_COMPLETED,
    TOOL_FAILED,
    TOOL_REQUESTED,
    TOOL_STARTED,
)

from .attempts import abandoned_summary, attempted_summary

#: events per timeline page by default, and the most a page may show
PAGE_SIZE = 50
MAX_PAGE_SIZE = 200
#: characters of a one-line summary
SUMMARY_CHARS = 160

_ROW_FIELDS = ("id", "seq", "type", "time", "causation", "data", "blobs")


@dataclass
class Row:
    """One event as the timeline shows it."""

    id: str
    seq: int
    type: str
    time: datetime
    causation: str | None
    summary: str
    claimed: bool
    blobs: list[dict[str, Any]]
    #: where the causation event is: (run id, seq), or None if not stored (any more)
    cause_at: tuple[str, int] | None = None
    #: the page of that event, in its run's timeline
    cause_page: int | None = None


@dataclass
class Page:
    number: int
    size: int
    count: int  # events in the run
    rows: list[Row] = field(default_factory=list)

    @property
    def pages(self) -> int:
        return max(1, -(-self.count // self.size))

    @property
    def first_seq(self) -> int:
        return (self.number - 1) * self.size + 1

    @property
    def last_seq(self) -> int:
        """The highest seq this page can hold (it may not exist yet)."""
        return self.number * self.size

    @property
    def is_tail(self) -> bool:
        """The page that grows as the run appends."""
        return self.number >= self.pages

    @property
    def has_previous(self) -> bool:
        return self.number > 1

    @property
    def has_next(self) -> bool:
        return self.number < self.pages


def page_size(raw: Any) -> int:
    try:
        n = int(raw)
    except (TypeError, ValueError):
        return PAGE_SIZE
    return min(max(n, 1), MAX_PAGE_SIZE)


def page_of(seq: int, size: int) -> int:
    return max(1, -(-seq // size))


def load_page(run_id: str, count: int, number: Any, size: int, *, using: str = "default") -> Page:
    """Page ``number`` (1-based; "last" or out of range is clamped) of the run's timeline.

    Two queries: the page's events, and where their causes are.
    """
    pages = max(1, -(-count // size))
    if number == "last":
        n = pages
    else:
        try:
            n = int(number)
        except (TypeError, ValueError):
            n = 1
    n = min(max(n, 1), pages)
    page = Page(number=n, size=size, count=count)
    page.rows = rows(run_id, after=page.first_seq - 1, upto=page.last_seq, size=size, using=using)
    return page


def rows(run_id: str, *, after: int, upto: int, size: int, using: str = "default") -> list[Row]:
    """The rows of events ``after < seq <= upto`` (at most ``size``), causes resolved."""
    records = (
        EventRecord.objects.using(using)
        .filter(stream=run_id, seq__gt=after, seq__lte=upto)
        .order_by("seq")
        .values_list(*_ROW_FIELDS)[:size]
    )
    out = [_row(*r) for r in records]
    causes = {r.causation for r in out if r.causation}
    if causes:
        where = {
            id_: (stream, seq)
            for id_, stream, seq in EventRecord.objects.using(using)
            .filter(id__in=causes)
            .values_list("id", "stream", "seq")
        }
        for r in out:
            if r.causation in where:
                r.cause_at = where[r.causation]
                r.cause_page = page_of(r.cause_at[1], size)
    return out


def _row(id_: str, seq: int, type_: str, time_: datetime, causation: str | None, data_text: str, blobs: Any) -> Row:
    try:
        data = json.loads(data_text)
    except ValueError:
        data = {}
    claimed = isinstance(data, dict) and data.get(CLAIM_MARKER) is True
    return Row(
        id=id_,
        seq=seq,
        type=type_,
        time=time_,
        causation=causation,
        summary=summarize(
            type_, data if isinstance(data, dict) else {"value": data}, claimed=claimed, blobs=blobs or []
        ),
        claimed=claimed,
        blobs=list(blobs or []),
    )


# -- one-line summaries ----------------------------------------------------------------


def summarize(
    type_: str, data: dict[str, Any], *, claimed: bool = False, blobs: Sequence[Mapping[str, object]] | None = None
) -> str:
    """A readable line for an event: what happened, in the event type's own terms."""
    if claimed:
        size = sum(n for b in (blobs or []) if isinstance(n := b.get("size"), int))
        hot = {k: v for k, v in data.items() if k != CLAIM_MARKER}
        line = f"payload claim-checked ({_bytes(size)})"
        if hot.get("name"):
            line = f"{hot['name']}: " + line
        if hot.get("usage"):
            line += " · " + _usage(hot.get("usage"), hot.get("cost"))
        return _clip(line)
    fn = _SUMMARIES.get(type_)
    try:
        line = fn(data) if fn is not None else _json(data)
    except Exception:  # an odd payload must not break the page: show it raw
        line = _json(data)
    return _clip(line)


def _clip(text: str, n: int = SUMMARY_CHARS) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= n else text[: n - 1] + "…"


def _json(value: object) -> str:
    return json.dumps(value, ensure_ascii=False, sort_keys=True, default=str)


def _bytes(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024  # type: ignore[assignment]
    return f"{n} B"


def _usage(usage: Any, cost: Any) -> str:
    usage = usage or {}
    line = f"{usage.get('input_tokens', 0)} in / {usage.get('output_tokens', 0)} out tokens"
    if cost:
        line += f", ${float(cost):.6f}"
    return line


def _args(args: object) -> str:
    if isinstance(args, dict):
        return ", ".join(f"{k}={_json(v)}" for k, v in args.items())
    return _json(args)


def _started(d: dict) -> str:
    line = f"{d.get('algorithm')} started"
    if d.get("parent"):
        line += f" as child {d.get('key')!r} of {d['parent']}"
    if d.get("input") is not None:
        line += f" · input {_json(d.get('input'))}"
    if d.get("budget"):
        line += f" · budget {_json(d['budget'])}"
    return line


def _completed(d: dict) -> str:
    value = d.get("value")
    if isinstance(value, dict) and set(value) == {"text"}:
        value = value["text"]
    return f"ended {d.get('outcome')}: " + (value if isinstance(value, str) else _json(value))


def _rejected(what: str) -> Callable[[dict], str]:
    def line(d: dict) -> str:
        errors = d.get("errors") or []
        first = errors[0] if errors else {}
        where = ".".join(str(p) for p in first.get("loc", ())) or what
        return f"{what} rejected ({len(errors)} error{'s' * (len(errors) != 1)}): {where}: {first.get('msg', '')}"

    return line


def _llm_requested(d: dict) -> str:
    msgs = d.get("messages") or []
    line = f"model request {d.get('tag') or ''}".rstrip()
    line += f" · {len(msgs)} new message{'s' * (len(msgs) != 1)}"
    if msgs:
        last = msgs[-1]
        line += f" · {last.get('role')}: {last.get('content') or ''}"
    return line


def _llm_completed(d: dict) -> str:
    message = (d.get("response") or {}).get("message") or {}
    calls = message.get("tool_calls") or []
    if calls:
        said = "asks for " + "; ".join(f"{c.get('name')}({_args(c.get('arguments'))})" for c in calls)
    else:
        said = f"replies: {message.get('content') or ''}"
    unpriced = " · unpriced (no price for this model: cost 0)" if d.get("priced") is False else ""
    return f"{said} · {_usage(d.get('usage'), d.get('cost'))}{unpriced}"


def _failed(kind: str) -> Callable[[dict], str]:
    def line(d: dict) -> str:
        who = d.get("name") or kind
        return f"{who} failed ({d.get('reason')}): {d.get('error')}"

    return line


def _tool_requested(d: dict) -> str:
    return f"{d.get('name')}({_args(d.get('args'))}) · call {d.get('call_id')}"


def _tool_completed(d: dict) -> str:
    result = d.get("result")
    return f"{d.get('name')} → {result if isinstance(result, str) else _json(result)}"


def _approval_requested(d: dict) -> str:
    line = f"approval needed: {d.get('name')}({_args(d.get('args'))})"
    if d.get("expires_at"):
        line += " · expires " + datetime.fromtimestamp(float(d["expires_at"])).isoformat(timespec="seconds")
    return line


def _decision(word: str) -> Callable[[dict], str]:
    def line(d: dict) -> str:
        text = f"{d.get('name')} {word}"
        if d.get("by"):
            text += f" by {d['by']}"
        if d.get("reason"):
            text += f": {d['reason']}"
        return text

    return line


_SUMMARIES: dict[str, Callable[[dict], str]] = {
    RUN_STARTED: _started,
    RUN_COMPLETED: _completed,
    CANCEL_REQUESTED: lambda d: (
        f"cancel requested by {d.get('by') or 'someone'}" + (f": {d['reason']}" if d.get("reason") else "")
    ),
    INPUT_VALIDATED: lambda d: "input is valid",
    INPUT_REJECTED: _rejected("input"),
    OUTPUT_PROPOSED: lambda d: f"answer proposed, to fit {d.get('schema')}: {_json(d.get('value'))}",
    OUTPUT_VALIDATED: lambda d: "answer fits its schema",
    OUTPUT_REJECTED: _rejected("answer"),
    LLM_REQUESTED: _llm_requested,
    LLM_ATTEMPTED: attempted_summary,
    LLM_ABANDONED: abandoned_summary,
    LLM_COMPLETED: _llm_completed,
    LLM_FAILED: _failed("model"),
    TOOL_REQUESTED: _tool_requested,
    TOOL_STARTED: lambda d: f"{d.get('name')} running (idempotency key {d.get('idempotency_key')})",
    TOOL_COMPLETED: _tool_completed,
    TOOL_FAILED: _failed("tool"),
    APPROVAL_REQUESTED: _approval_requested,
    APPROVAL_GRANTED: _decision("approved"),
    APPROVAL_DENIED: _decision("denied"),
    APPROVAL_EXPIRED: _decision("approval expired"),
    CHILD_REQUESTED: lambda d: f"child run {d.get('key')!r}: {d.get('algorithm')} ({d.get('child')})",
    CHILD_COMPLETED: lambda d: f"child {d.get('key')!r} ended {d.get('outcome')}",
}
