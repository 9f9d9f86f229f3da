"""Actions on a run go through the engine: approve, deny, cancel, re-drive, erase
(starting a run: test_start_form.py; the run list's actions: test_bulk.py)."""

from __future__ import annotations

import json

from aaa_django.events import Event, new_id
from aaa_django.models import EventRecord, RunRecord
from aaa_django.runtime.event_types import (
    APPROVAL_DENIED,
    APPROVAL_GRANTED,
    APPROVAL_REQUESTED,
    CANCEL_REQUESTED,
    RUN_STARTED,
    TOOL_COMPLETED,
    TOOL_FAILED,
    started_id,
)
from aaa_django.store import DjangoEventStore, runindex

from . import support
from .test_run_pages import run_url, text


def outcome_of(run_id: str) -> str:
    return support.wait_until(lambda: (r := runindex.refresh("default", run_id)) and r.outcome)


def events(run_id: str, type_: str) -> list[dict]:
    return [
        json.loads(d)
        for d in EventRecord.objects.filter(stream=run_id, type=type_).order_by("seq").values_list("data", flat=True)
    ]


def test_approving_a_gate_lets_the_run_finish(client, operator, gated_run):
    client.force_login(operator)
    request_id = EventRecord.objects.get(stream=gated_run, type=APPROVAL_REQUESTED).id
    r = client.post(run_url(gated_run, "approve"), {"request_id": request_id, "reason": "looks safe"})
    assert r.status_code == 302 and r["Location"] == run_url(gated_run)
    assert outcome_of(gated_run) == "success"
    [granted] = events(gated_run, APPROVAL_GRANTED)
    assert granted["reason"] == "looks safe"
    assert granted["by"] == f"operator (user {operator.pk}, admin)"
    assert events(gated_run, TOOL_COMPLETED)[0]["result"] == "deployed web"
    # approving again: nothing pending any more, said plainly
    r = client.post(run_url(gated_run, "approve"), {"request_id": request_id}, follow=True)
    assert "no longer pending" in text(r)


def test_denying_a_gate_fails_the_tool_call_with_the_reason(client, operator, gated_run):
    client.force_login(operator)
    request_id = EventRecord.objects.get(stream=gated_run, type=APPROVAL_REQUESTED).id
    client.post(run_url(gated_run, "deny"), {"request_id": request_id, "reason": "not today"})
    outcome_of(gated_run)
    [denied] = events(gated_run, APPROVAL_DENIED)
    assert denied["reason"] == "not today"
    [failed] = events(gated_run, TOOL_FAILED)
    assert failed["reason"] == "denied" and "not today" in failed["error"]


def test_cancelling_ends_the_run_cancelled(client, operator, gated_run):
    client.force_login(operator)
    r = client.post(run_url(gated_run, "cancel"), {"reason": "wrong task"}, follow=True)
    assert "Cancellation requested." in text(r)
    assert outcome_of(gated_run) == "cancelled"
    assert events(gated_run, CANCEL_REQUESTED)[0]["reason"] == "wrong task"
    r = client.post(run_url(gated_run, "cancel"), {}, follow=True)
    assert "ended already" in text(r)


def test_actions_are_post_only(client, operator, gated_run):
    client.force_login(operator)
    for what in ("cancel", "approve", "deny", "redrive"):
        assert client.get(run_url(gated_run, what)).status_code == 405


def test_redrive_finishes_a_stalled_run(client, operator, site):
    """A run whose start was written but never delivered (its process died) is
    adopted by the web process's engine and driven to the end."""
    run_id = f"run-{new_id()}"
    loop = support.loop()
    started = Event(
        id=started_id(run_id),
        stream=run_id,
        type=RUN_STARTED,
        data={
            "algorithm": loop.name,
            "config": loop.config(),
            "input": {"task": "look up"},
            "budget": None,
            "deadline": None,
            "parent": None,
            "owner": None,
        },
    )
    runindex.index_events("default", DjangoEventStore().append_sync([started]))
    assert RunRecord.objects.get(pk=run_id).status == "pending"
    client.force_login(operator)
    r = client.post(run_url(run_id, "redrive"), follow=True)
    assert "delivered again" in text(r)
    assert outcome_of(run_id) == "success"
    r = client.post(run_url(run_id, "redrive"), follow=True)
    assert "nothing to re-drive" in text(r)


def test_a_run_that_has_not_ended_is_not_erased_as_over_the_api(client, operator, gated_run):
    """The engine's one rule: cancel it, then erase it (the API answers 409)."""
    client.force_login(operator)
    count = EventRecord.objects.filter(stream=gated_run).count()
    assert "cancel it, then erase it" in text(client.get(run_url(gated_run, "erase")))

    r = client.post(run_url(gated_run, "erase"), {"confirm": gated_run}, follow=True)

    assert r.status_code == 200 and f"Run {gated_run} has not ended: cancel it, then erase it." in text(r)
    assert EventRecord.objects.filter(stream=gated_run).count() == count
    assert RunRecord.objects.filter(pk=gated_run).exists()


def test_erase_asks_for_confirmation_then_erases_through_the_engine(client, operator, finished_run, media_root):
    client.force_login(operator)
    shas = {
        b["sha256"]
        for blobs in EventRecord.objects.filter(stream=finished_run).values_list("blobs", flat=True)
        for b in blobs
    }
    assert shas and all(support.blob_files(media_root, s) for s in shas)
    page = text(client.get(run_url(finished_run, "erase")))
    assert "cannot be undone" in page and "Type the run id" in page
    count = RunRecord.objects.get(pk=finished_run).last_seq
    assert f"{count} events" in page

    r = client.post(run_url(finished_run, "erase"), {"confirm": "not the id"})
    assert r.status_code == 200 and "Type the run id exactly" in text(r)
    assert EventRecord.objects.filter(stream=finished_run).count() == count

    r = client.post(run_url(finished_run, "erase"), {"confirm": finished_run}, follow=True)
    assert f"{count} events" in text(r) and "erased" in text(r)
    assert not EventRecord.objects.filter(stream=finished_run).exists()
    assert not RunRecord.objects.filter(pk=finished_run).exists()
    assert not any(support.blob_files(media_root, s) for s in shas)
    assert client.get(run_url(finished_run)).status_code == 404
