"""The run list's actions on many runs: cancel, re-drive, erase, export; each with its
permission and (but export) Django's confirmation page, each through the engine."""

from __future__ import annotations

import html
import io
import json
import re
import zipfile
from datetime import timedelta

import pytest
from django.contrib.admin.helpers import ACTION_CHECKBOX_NAME
from django.contrib.messages import get_messages
from django.urls import reverse
from django.utils import timezone

from aaa_django.admin.runs import RunAdmin
from aaa_django.events import Event, new_id
from aaa_django.models import EventRecord, RunRecord
from aaa_django.runtime.event_types import (
    APPROVAL_REQUESTED,
    CANCEL_REQUESTED,
    RUN_STARTED,
    started_id,
)
from aaa_django.store import DjangoEventStore, exchange, runindex

from . import support
from .conftest import make_staff, start
from .test_run_pages import run_url, text

LIST = "admin:aaa_runrecord_changelist"


def changelist(query: str = "") -> str:
    return reverse(LIST) + query


def gated(site, n: int, owner=None) -> list[str]:
    """``n`` ToolLoop runs, each waiting at its ``deploy`` approval (running)."""
    ids = [start(site, f"deploy the web service {i}", owner=owner) for i in range(n)]
    for run_id in ids:
        support.wait_until(lambda r=run_id: EventRecord.objects.filter(stream=r, type=APPROVAL_REQUESTED).exists())
        runindex.refresh("default", run_id)
    return ids


def ended(run_id: str) -> str:
    return support.wait_until(lambda: (r := runindex.refresh("default", run_id)) and r.outcome)


def stalled_run(started_at=None) -> str:
    """A run whose start was written and never delivered (its process died)."""
    run_id = f"run-{new_id()}"
    loop = support.loop()
    event = Event(
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
        **({"time": started_at} if started_at else {}),
    )
    runindex.index_events("default", DjangoEventStore().append_sync([event]))
    return run_id


def act(client, action: str, ids: list[str], query: str = "", **extra):
    """Choose ``action`` for ``ids`` on the run list (as its form posts)."""
    return client.post(changelist(query), {"action": action, ACTION_CHECKBOX_NAME: ids, "index": 0, **extra})


def confirm(client, page, query: str = "", **extra):
    """Answer yes on a confirmation page: post back the fields its form holds."""
    form = re.search(r'<section class="module aaa-bulk".*?<form method="post">(.*?)</form>', text(page), re.S)
    fields: dict[str, list[str]] = {}
    for name, value in re.findall(r'<input type="hidden" name="([^"]+)" value="([^"]*)"', form.group(1)):
        fields.setdefault(name, []).append(html.unescape(value))
    return client.post(changelist(query), {**fields, **extra})


def said(response) -> list[str]:
    return [str(m) for m in get_messages(response.wsgi_request)]


def test_a_bulk_cancel_of_20_running_runs_ends_each_cancelled(client, operator, site):
    runs = gated(site, 20)
    assert set(RunRecord.objects.values_list("status", flat=True)) == {"running"}
    client.force_login(operator)

    page = act(client, "cancel_selected", runs)

    assert page.status_code == 200  # Django's confirmation page, nothing done yet
    assert "Cancel 20 runs?" in text(page) and "Ask <strong>20 runs</strong>" in text(page)
    assert not EventRecord.objects.filter(type=CANCEL_REQUESTED).exists()

    r = confirm(client, page, reason="wrong release")

    assert r.status_code == 302 and r["Location"] == changelist()
    assert "Cancellation requested for 20 runs." in said(r)
    assert {run_id: ended(run_id) for run_id in runs} == {run_id: "cancelled" for run_id in runs}
    asked = [json.loads(d) for d in EventRecord.objects.filter(type=CANCEL_REQUESTED).values_list("data", flat=True)]
    assert len(asked) == 20
    assert {(a["reason"], a["by"]) for a in asked} == {("wrong release", f"operator (user {operator.pk}, admin)")}


def test_cancel_every_run_of_one_algorithm_started_in_the_past_hour_in_one_action(client, operator, site, monkeypatch):
    """Filter by algorithm and "Past hour", select all across the list's pages, cancel:
    a run of another algorithm and a run started two hours ago are left alone."""
    monkeypatch.setattr(RunAdmin, "list_per_page", 2)
    recent = gated(site, 3)
    other = site.call(lambda e: e.start(support.workflow(ship=True), {"task": "ship it"})).run_id
    support.wait_until(lambda: EventRecord.objects.filter(stream=other, type=APPROVAL_REQUESTED).exists())
    old = stalled_run(started_at=timezone.now() - timedelta(hours=2))
    client.force_login(operator)

    listing = text(client.get(changelist("?algorithm=aaa.algos.ToolLoop")))
    past_hour = html.unescape(re.search(r'<a href="(\?[^"]*)"[^>]*>Past hour</a>', listing).group(1))
    query = past_hour
    page = text(client.get(changelist(query)))
    assert "Select all 3 runs" in page  # Django's "select across pages": 3 runs on 2 pages
    on_page = re.findall(rf'name="{ACTION_CHECKBOX_NAME}" value="([^"]+)"', page)
    assert len(on_page) == 2

    confirmation = act(client, "cancel_selected", on_page, query, select_across="1")
    assert "Cancel 3 runs?" in text(confirmation)
    r = confirm(client, confirmation, query)

    assert r.status_code == 302 and r["Location"] == changelist(query)  # the list as it was filtered
    assert {run_id: ended(run_id) for run_id in recent} == dict.fromkeys(recent, "cancelled")
    for left in (other, old):
        assert not EventRecord.objects.filter(stream=left, type=CANCEL_REQUESTED).exists()
    assert RunRecord.objects.get(pk=other).status == "running"


def test_staff_without_an_actions_permission_do_not_see_it(client, viewer, django_user_model, site):
    runs = gated(site, 2)
    client.force_login(viewer)  # sees every run, may act on none
    r = client.get(changelist())
    actions = [name for name, _ in r.context["action_form"].fields["action"].choices if name]
    assert actions == ["export_selected"]  # seeing a run is enough to export it
    for name in ("cancel_selected", "redrive_selected", "erase_selected"):
        assert f'value="{name}"' not in text(r)
    # posting the action anyway does nothing (Django: not one of the choices)
    r = act(client, "cancel_selected", runs)
    assert r.status_code == 302
    assert not EventRecord.objects.filter(type=CANCEL_REQUESTED).exists()

    canceller = make_staff(django_user_model, "canceller", "view_runrecord", "view_all_runs", "cancel_run")
    client.force_login(canceller)
    actions = [name for name, _ in client.get(changelist()).context["action_form"].fields["action"].choices]
    assert "cancel_selected" in actions
    assert "erase_selected" not in actions and "redrive_selected" not in actions


def test_bulk_erase_erases_the_ended_runs_and_names_the_running_ones_it_refuses(
    client, operator, finished_run, gated_run, media_root
):
    client.force_login(operator)
    shas = {
        b["sha256"]
        for blobs in EventRecord.objects.filter(stream=finished_run).values_list("blobs", flat=True)
        for b in blobs
    }

    page = act(client, "erase_selected", [finished_run, gated_run])
    assert "Erase 2 runs?" in text(page)
    refused = re.search(r'id="aaa-refused">(.*?)</div>', text(page), re.S).group(1)
    assert gated_run in refused and finished_run not in refused
    assert 'value="Yes, erase 1 run"' in text(page)

    r = confirm(client, page)

    assert not EventRecord.objects.filter(stream=finished_run).exists()
    assert not RunRecord.objects.filter(pk=finished_run).exists()
    assert not any(support.blob_files(media_root, s) for s in shas)
    assert EventRecord.objects.filter(stream=gated_run).exists()
    assert RunRecord.objects.get(pk=gated_run).status == "running"
    messages = said(r)
    assert any(m.startswith("1 run erased: ") for m in messages)
    assert f"1 run not erased: it has not ended (cancel, then erase): {gated_run}." in messages


def test_bulk_redrive_drives_a_stalled_run_to_its_end(client, operator, finished_run):
    stalled = stalled_run()
    assert RunRecord.objects.get(pk=stalled).status == "pending"
    client.force_login(operator)
    page = act(client, "redrive_selected", [stalled, finished_run])
    assert "Re-drive 2 runs?" in text(page) and "1 of the selected runs has ended" in text(page)
    r = confirm(client, page)
    assert "The events of 1 run were delivered again. 1 run had ended: nothing to re-drive." in said(r)
    assert ended(stalled) == "success"


def test_bulk_export_is_a_zip_of_each_runs_export(client, operator, finished_run, site, admin_user):
    second = start(site, "look up the list", owner=admin_user)
    ended(second)
    client.force_login(operator)

    r = act(client, "export_selected", [finished_run, second])

    assert r.status_code == 200 and r["Content-Type"] == "application/zip"
    assert re.match(r'attachment; filename="runs-\d{8}-\d{6}\.zip"', r["Content-Disposition"])
    archive = zipfile.ZipFile(io.BytesIO(b"".join(r.streaming_content)))
    assert sorted(archive.namelist()) == sorted([f"{finished_run}.jsonl", f"{second}.jsonl"])
    for run_id in (finished_run, second):
        data = archive.read(f"{run_id}.jsonl")
        # the run page's own export, line for line (but the header's time of export); and
        # an import reads it whole
        single = b"".join(client.get(run_url(run_id, "export")).streaming_content)
        assert data.splitlines()[1:] == single.splitlines()[1:]
        assert json.loads(data.splitlines()[0])["run"] == run_id
        export = exchange.read_export(io.BytesIO(data))
        assert export.run_id == run_id
        assert len(export.events) == EventRecord.objects.filter(stream=run_id).count()


@pytest.mark.parametrize("action", ["cancel_selected", "erase_selected"])
def test_a_bulk_action_acts_on_no_run_the_user_may_not_see(client, django_user_model, gated_run, site, action):
    """Without view_all_runs the list holds one's own runs: another owner's run id
    posted to an action is not acted on."""
    dana = make_staff(django_user_model, "dana", "view_runrecord", "cancel_run", "erase_run")
    own = gated(site, 1, owner=dana)[0]
    client.force_login(dana)
    page = act(client, action, [gated_run, own])
    assert gated_run not in text(page)
    confirm(client, page)
    assert not EventRecord.objects.filter(stream=gated_run, type=CANCEL_REQUESTED).exists()
    assert RunRecord.objects.filter(pk=gated_run).exists()
