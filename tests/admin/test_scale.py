"""A 50,000-event run opens with a bounded number of queries and a bounded page."""

from __future__ import annotations

import time

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.urls import reverse

from aaa_django.events import Event, derive_id, new_id
from aaa_django.runtime.event_types import (
    INPUT_VALIDATED,
    LLM_COMPLETED,
    LLM_REQUESTED,
    RUN_STARTED,
    TOOL_COMPLETED,
    TOOL_REQUESTED,
    result_id,
    started_id,
)
from aaa_django.store import DjangoEventStore, runindex

from .test_run_pages import run_url, text

BATCH = 1000


def build_run(n_events: int, owner=None) -> str:
    """A ToolLoop-shaped run of ``n_events`` events (model request, reply asking for a
    tool, tool request, tool result; again and again), appended straight to the store
    in batches, then indexed."""
    store = DjangoEventStore()
    run_id = f"run-{new_id()}"
    started = Event(
        id=started_id(run_id),
        stream=run_id,
        type=RUN_STARTED,
        data={
            "algorithm": "aaa.algos.ToolLoop",
            "config": {},
            "input": {"task": "count"},
            "budget": None,
            "deadline": None,
            "parent": None,
            "owner": str(owner.pk) if owner else None,
        },
    )
    events = [
        started,
        Event(id=result_id(started.id), stream=run_id, type=INPUT_VALIDATED, data={}, causation=started.id),
    ]
    i = 0
    while len(events) < n_events:
        message = (
            {"role": "user", "content": "count"}
            if i == 0
            else {"role": "tool", "content": str(i - 1), "tool_call_id": f"c{i - 1}", "name": "tick"}
        )
        llm = Event(
            id=derive_id(started.id, "llm", i),
            stream=run_id,
            type=LLM_REQUESTED,
            data={"messages": [message], "thread": "main", "tag": f"turn-{i + 1}"},
            causation=events[-1].id,
        )
        reply = Event(
            id=result_id(llm.id),
            stream=run_id,
            type=LLM_COMPLETED,
            data={
                "request_id": llm.id,
                "tag": f"turn-{i + 1}",
                "thread": "main",
                "response": {
                    "message": {
                        "role": "assistant",
                        "content": None,
                        "tool_calls": [{"id": f"c{i}", "name": "tick", "arguments": {"i": i}}],
                    },
                    "finish_reason": "tool_calls",
                },
                "usage": {"input_tokens": 5, "output_tokens": 3},
                "cost": 0.00001,
            },
            causation=llm.id,
        )
        req = Event(
            id=derive_id(started.id, "tool", i),
            stream=run_id,
            type=TOOL_REQUESTED,
            data={"call_id": f"c{i}", "name": "tick", "args": {"i": i}},
            causation=reply.id,
        )
        done = Event(
            id=result_id(req.id),
            stream=run_id,
            type=TOOL_COMPLETED,
            data={"call_id": f"c{i}", "name": "tick", "result": i},
            causation=req.id,
        )
        events += [llm, reply, req, done]
        i += 1
    events = events[:n_events]
    for k in range(0, len(events), BATCH):
        store.append_sync(events[k : k + BATCH])
    runindex.refresh("default", run_id)
    return run_id


def page_queries(client, url: str) -> tuple[int, str, float]:
    t0 = time.perf_counter()
    with CaptureQueriesContext(connection) as ctx:
        r = client.get(url)
    assert r.status_code == 200
    return len(ctx.captured_queries), text(r), time.perf_counter() - t0


@pytest.mark.slow
def test_a_50000_event_run_opens_with_bounded_queries_and_page(client, admin_user, django_assert_max_num_queries):
    client.force_login(admin_user)
    t0 = time.perf_counter()
    big = build_run(50_000)
    small = build_run(60)
    built = time.perf_counter() - t0
    assert runindex.refresh("default", big).last_seq == 50_000

    # The first open folds the projections from the log (and the library saves
    # snapshots); the second is the steady state. Both are bounded.
    with django_assert_max_num_queries(40):
        r = client.get(run_url(big))
    page = text(r)
    assert page.count('<tr id="e') == 50  # page 1 of 1,000
    assert "page 1 of 1000" in page

    n_small, _, _ = page_queries(client, run_url(small))
    n_big, page, t_big = page_queries(client, run_url(big))
    assert n_big <= n_small + 2, (n_big, n_small)  # the size of the log does not matter

    for url in (
        run_url(big) + "?page=last",
        run_url(big) + "?page=731&per=100000",
        run_url(big) + "?at=25000",
        run_url(big, "live") + "?after=49990&until=50000",
        run_url(big, "event", 49_999),
        reverse("admin:aaa_runrecord_changelist"),
        reverse("admin:aaa_eventrecord_changelist") + f"?q={big}",
    ):
        with django_assert_max_num_queries(40):
            r = client.get(url)
        assert r.status_code == 200, url
        rows = text(r).count('<tr id="e')
        assert rows <= 200, (url, rows)  # bounded page size, whatever ?per= asks
    assert text(client.get(run_url(big) + "?page=last")).count('id="e50000"') == 1
    # a projection without snapshots (CONVERSATION) over 50,000 events is folded on
    # request only; then it is, with a bounded number of queries too
    assert "not folded yet" in page and "fold=all" in page
    # Folding every registered projection costs a few queries each, never more with
    # the length of the log.
    from aaa_django.reading.projections import all_projections

    with django_assert_max_num_queries(10 + 5 * len(all_projections())):
        page = text(client.get(run_url(big) + "?fold=all"))
    assert "not folded yet" not in page and "&quot;role&quot;: &quot;tool&quot;" in page
    assert text(client.get(run_url(big) + "?page=731&per=100000")).count('<tr id="e') == 200
    print(f"\n50k run built in {built:.1f}s; steady open: {n_big} queries, {t_big * 1000:.0f} ms")
