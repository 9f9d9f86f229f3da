"""The run page's attempts panel (``aaa_django.admin.attempts``, ``_attempts.html``): each
model call with its attempts, when each was sent, how it went, what it cost, and the
ones abandoned (their process died with them in flight)."""

from __future__ import annotations

import asyncio
import re
from dataclasses import replace

import pytest
from django.contrib.admin.utils import quote
from django.urls import reverse

from aaa_django.admin.attempts import model_calls
from aaa_django.events import Event
from aaa_django.runtime.event_types import LLM_ATTEMPTED, LLM_COMPLETED, LLM_REQUESTED, attempt_id, result_event
from aaa_django.store import DjangoEventStore, runindex
from tests.runtime.helpers import of_type
from tests.runtime.test_attempts import Gate, die_with_calls_in_flight


def page_of(client, user, run_id: str) -> str:
    client.force_login(user)
    r = client.get(reverse("admin:aaa_runrecord_change", args=(quote(run_id),)))
    assert r.status_code == 200
    return r.content.decode()


def rows(page: str) -> list[str]:
    return re.findall(r'<tr class="aaa-attempt[^"]*"[^>]*>.*?</tr>', page, re.S)


def stored(events: list[Event]) -> str:
    """``events`` (one run's log) in the site's database, as a run of its own."""
    store = DjangoEventStore("default")
    for e in events:
        store.append_sync([replace(e, seq=None)])
    runindex.refresh("default", events[0].stream)
    return events[0].stream


def test_a_finished_runs_calls_each_answered_at_the_first_attempt(client, admin_user, finished_run):
    page = page_of(client, admin_user, finished_run)
    calls = model_calls(finished_run)
    assert [len(c.attempts) for c in calls.calls] == [1, 1] and calls.abandoned == 0
    assert [(a.number, a.outcome) for c in calls.calls for a in c.attempts] == [(1, "answered"), (1, "answered")]
    assert 'id="attempts"' in page and "2 calls · 2 attempts sent" in page
    assert len(rows(page)) == 2 and all("answered" in r for r in rows(page))
    replies = {
        e.id: e for e in of_type([e for e in DjangoEventStore("default").read_sync(finished_run)], LLM_COMPLETED)
    }
    assert all(f"${r.data['cost']:.6f}" in page for r in replies.values())


@pytest.mark.django_db(transaction=True)
def test_a_crash_loops_attempts_show_abandoned_at_their_estimates(client, admin_user):
    _, log = asyncio.run(die_with_calls_in_flight(Gate(hold=10), crashes=3))
    run_id = stored(log)
    page = page_of(client, admin_user, run_id)
    (call,) = model_calls(run_id).calls
    estimates = [e.data["estimate"]["cost"] for e in of_type(log, LLM_ATTEMPTED)]
    assert [(a.number, a.outcome, a.abandoned, a.estimated) for a in call.attempts] == [
        (n, "abandoned", True, True) for n in (1, 2, 3)
    ]
    assert [a.cost for a in call.attempts] == estimates
    assert "1 call · 3 attempts sent · 3 abandoned" in page
    shown = rows(page)
    assert len(shown) == 3 and all("abandoned" in r and "estimated" in r for r in shown)
    assert [f"#{n}" in r for n, r in zip((1, 2, 3), shown)] == [True] * 3


@pytest.mark.django_db(transaction=True)
def test_a_clients_retries_show_how_each_went():
    started = Event.new("run-panel", "aaa.run.started", {"algorithm": "aaa.algos.ToolLoop", "input": {}})
    request = started.derive(LLM_REQUESTED, {"messages": [], "tag": "turn-1", "thread": "main"})
    attempts = [
        Event(
            id=attempt_id(request.id, n),
            stream=request.stream,
            type=LLM_ATTEMPTED,
            causation=request.id,
            data={
                "request_id": request.id,
                "attempt": n,
                "model": "m",
                "estimate": {"usage": {"input_tokens": 3, "output_tokens": 9}, "cost": 0.5},
            },
        )
        for n in (1, 2)
    ]
    reply = result_event(
        request,
        LLM_COMPLETED,
        {
            "request_id": request.id,
            "tag": "turn-1",
            "thread": "main",
            "attempt": 2,
            "response": {"message": {"role": "assistant", "content": "hi"}, "finish_reason": "stop"},
            "usage": {"input_tokens": 3, "output_tokens": 1},
            "cost": 0.002,
            "attempts": [
                {"attempt": 1, "status": 429, "reason": "rate_limit"},
                {"attempt": 2, "status": None, "reason": "ok"},
            ],
        },
    )
    run_id = stored([started, request, *attempts, reply])
    (call,) = model_calls(run_id).calls
    assert call.tag == "turn-1"
    assert [(a.number, a.outcome, a.cost, a.estimated) for a in call.attempts] == [
        (1, "retried: rate_limit, HTTP 429", 0.0, False),
        (2, "answered", 0.002, False),
    ]
    assert call.attempts[1].tokens == "3 in / 1 out"
