"""Export, import and fork in the admin: a download, an upload page, a fork form; the
fork and its origin link to each other."""

from __future__ import annotations

import json
from io import BytesIO

from django.urls import reverse

from aaa_django.admin import reading
from aaa_django.models import EventRecord, RunRecord
from aaa_django.runtime.event_types import LLM_REQUESTED, TOOL_COMPLETED
from aaa_django.store import DjangoEventStore

from .conftest import make_staff
from .test_actions import outcome_of
from .test_run_pages import run_url, text

IMPORT_URL = "admin:aaa_runrecord_import"


def download(client, run_id) -> bytes:
    r = client.get(run_url(run_id, "export"))
    assert r.status_code == 200 and r["Content-Type"].startswith("application/jsonl")
    assert r["Content-Disposition"] == f'attachment; filename="{run_id}.jsonl"'
    return b"".join(r.streaming_content)


def upload(client, body: bytes, name="run.jsonl"):
    f = BytesIO(body)
    f.name = name
    return client.post(reverse(IMPORT_URL), {"file": f})


def test_a_run_exported_from_its_page_and_imported_back(client, admin_user, operator, django_user_model, finished_run):
    client.force_login(operator)
    page = text(client.get(run_url(finished_run)))
    assert run_url(finished_run, "export") in page
    body = download(client, finished_run)
    lines = [json.loads(line) for line in body.splitlines()]
    assert lines[0]["run"] == finished_run and any("blob" in line for line in lines)
    count = EventRecord.objects.filter(stream=finished_run).count()
    client.post(run_url(finished_run, "erase"), {"confirm": finished_run})
    assert not EventRecord.objects.filter(stream=finished_run).exists()

    assert client.get(reverse(IMPORT_URL)).status_code == 403  # needs aaa.import_run
    importer = make_staff(django_user_model, "importer", "view_runrecord", "import_run")
    client.force_login(importer)
    assert "Import a run" in text(client.get(reverse("admin:aaa_runrecord_changelist")))
    r = upload(client, body)

    assert r.status_code == 302 and r["Location"] == run_url(finished_run)
    assert EventRecord.objects.filter(stream=finished_run).count() == count
    row = RunRecord.objects.get(pk=finished_run)
    assert row.owner == importer and row.outcome == "success"
    assert "Ended" in text(client.get(run_url(finished_run)))  # its page reads (blobs too)
    again = upload(client, body)
    assert again.status_code == 200 and "exists on this site already" in text(again)


def test_a_tampered_export_is_refused_and_nothing_is_stored(client, operator, django_user_model, finished_run):
    client.force_login(operator)
    body = download(client, finished_run)
    client.post(run_url(finished_run, "erase"), {"confirm": finished_run})
    forged = body.replace(b'"outcome":"success"', b'"outcome":"failed"', 1)  # fine JSON...
    blob_line = next(i for i, line in enumerate(forged.splitlines()) if line.startswith(b'{"blob"'))
    lines = forged.splitlines()
    blob = json.loads(lines[blob_line])
    blob["base64"] = blob["base64"][:-8] + ("AAAAAAA=" if blob["base64"][-8:] != "AAAAAAA=" else "BBBBBBB=")
    lines[blob_line] = json.dumps(blob).encode()

    client.force_login(make_staff(django_user_model, "importer", "view_runrecord", "import_run"))
    r = upload(client, b"\n".join(lines) + b"\n")

    assert r.status_code == 200 and "Nothing was imported" in text(r)
    assert "does not match its hash" in text(r)
    assert not EventRecord.objects.filter(stream=finished_run).exists()


def test_a_fork_from_the_admin_goes_on_with_the_edited_config(client, operator, viewer, finished_run):
    events = list(EventRecord.objects.filter(stream=finished_run).order_by("seq").values_list("seq", "type"))
    at = next(seq for seq, t in events if t == TOOL_COMPLETED)  # before the answer
    client.force_login(operator)
    form = client.get(run_url(finished_run, "fork") + f"?at={at}")
    assert form.status_code == 200 and f'value="{at}"' in text(form)
    config = json.loads(form.context["form"]["config"].value())
    assert config["max_turns"] == 4  # the run's own, to edit

    r = client.post(
        run_url(finished_run, "fork"),
        {
            "at": at,
            "config": json.dumps({**config, "model": "scripted-2"}),
            "budget": json.dumps({"model_calls": 5}),
            "deadline": "",
        },
    )

    assert r.status_code == 302, text(r)
    fork = RunRecord.objects.exclude(pk=finished_run).get()
    assert r["Location"] == run_url(fork.run_id)
    assert outcome_of(fork.run_id) == "success"
    assert (fork.forked_from, fork.forked_at, fork.owner) == (finished_run, at, operator)
    asked = [
        reading.data_of(e) for e in DjangoEventStore().read_sync(fork.run_id) if e.type == LLM_REQUESTED
    ]  # hydrated: the second quotes a long document
    assert [a.get("model") for a in asked] == [None, "scripted-2"]  # copied, then new
    page = text(client.get(run_url(fork.run_id)))
    assert "Forked from" in page and run_url(finished_run) in page
    assert run_url(fork.run_id) in text(client.get(run_url(finished_run)))  # and back

    bad = client.post(run_url(finished_run, "fork"), {"at": len(events), "config": "{}"})
    assert bad.status_code == 200 and "the run&#x27;s end" in text(bad)
    client.force_login(viewer)  # may see, may not start runs
    assert client.get(run_url(finished_run, "fork")).status_code == 403
    assert "Fork…" not in text(client.get(run_url(finished_run)))


def test_run_again_starts_the_same_run_anew_and_both_pages_link_to_each_other(client, operator, viewer, finished_run):
    client.force_login(operator)
    assert f'action="{run_url(finished_run, "again")}"' in text(client.get(run_url(finished_run)))

    r = client.post(run_url(finished_run, "again"), follow=True)

    new = RunRecord.objects.get(forked_from=finished_run)
    assert r.redirect_chain == [(run_url(new.run_id), 302)]
    assert f"Run {new.run_id} started: {finished_run} again" in text(r)
    assert new.forked_at == 1 and new.owner == operator
    original, again = (
        json.loads(EventRecord.objects.get(stream=run, seq=1).data) for run in (finished_run, new.run_id)
    )
    for key in ("algorithm", "input", "config", "budget"):
        assert again[key] == original[key], key
    assert again["forked_from"]["run"] == finished_run
    assert outcome_of(new.run_id) == "success"  # decided anew: a run of its own
    assert (
        EventRecord.objects.filter(stream=new.run_id).count() == EventRecord.objects.filter(stream=finished_run).count()
    )
    # the new run's page names its origin, the origin's page lists the new run
    page = text(client.get(run_url(new.run_id)))
    assert f'Run again from <a href="{run_url(finished_run)}">{finished_run}</a>' in page
    page = text(client.get(run_url(finished_run)))
    assert f'<td><a href="{run_url(new.run_id)}">{new.run_id}</a></td><td>1 (run again)</td>' in page

    # starting runs needs aaa.add_runrecord: a viewer sees no button and gets 403
    client.force_login(viewer)
    assert "Run again" not in text(client.get(run_url(finished_run)))
    assert client.post(run_url(finished_run, "again")).status_code == 403
    assert client.get(run_url(finished_run, "again")).status_code == 405
    assert RunRecord.objects.filter(forked_from=finished_run).count() == 1
