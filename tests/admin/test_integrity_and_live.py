"""A tampered blob is a clear integrity error, never a crash; a live run's page
gets its updates from the live/ endpoint."""

from __future__ import annotations

from aaa_django.models import EventRecord
from aaa_django.runtime.event_types import APPROVAL_REQUESTED, TOOL_COMPLETED

from . import support
from .test_run_pages import run_url, text


def tamper(media_root, sha256: str) -> None:
    [path] = support.blob_files(media_root, sha256)
    data = bytearray(path.read_bytes())
    data[10:20] = b"XXXXXXXXXX"
    path.write_bytes(bytes(data))


def test_a_tampered_blob_shows_an_integrity_error_not_a_crash(client, admin_user, finished_run, media_root):
    client.force_login(admin_user)
    e = EventRecord.objects.get(stream=finished_run, type=TOOL_COMPLETED)
    sha = e.blobs[0]["sha256"]
    tamper(media_root, sha)

    r = client.get(run_url(finished_run, "blob", e.seq, 0))
    assert r.status_code == 409
    page = text(r)
    assert 'id="aaa-blob-error"' in page and "INTEGRITY ERROR" in page and "is corrupt" in page
    assert "fact-59" not in page  # the bad bytes are never shown
    assert 'id="aaa-preview"' not in page

    r = client.get(run_url(finished_run, "blob_download", e.seq, 0))
    assert r.status_code == 409 and not r.streaming if hasattr(r, "streaming") else True
    assert "INTEGRITY ERROR" in text(r)

    r = client.get(run_url(finished_run, "event", e.seq) + "?hydrate=1")
    assert r.status_code == 200
    assert 'id="aaa-hydrate-error"' in text(r) and "BlobIntegrityError" in text(r)

    # the run page still opens; its blob table says which blob failed
    r = client.get(run_url(finished_run))
    assert r.status_code == 200
    assert "INTEGRITY ERROR" in text(r)
    # folding as of an event after the tampered one needs the payload: that projection
    # says so, the others are still shown
    r = client.get(run_url(finished_run) + f"?at={e.seq + 1}")
    assert r.status_code == 200
    page = text(r)
    assert "Blob integrity error" in page
    assert 'data-name="aaa.runtime.engine.RUNMETA"' in page


def test_a_missing_blob_is_reported_too(client, admin_user, finished_run, media_root):
    client.force_login(admin_user)
    e = EventRecord.objects.get(stream=finished_run, type=TOOL_COMPLETED)
    for p in support.blob_files(media_root, e.blobs[0]["sha256"]):
        p.unlink()
    r = client.get(run_url(finished_run, "blob", e.seq, 0))
    assert r.status_code == 409 and "missing" in text(r)
    assert client.get(run_url(finished_run, "blob", e.seq, 7)).status_code == 404


def test_live_endpoint_sends_new_rows_status_and_actions(client, admin_user, gated_run):
    client.force_login(admin_user)
    page = text(client.get(run_url(gated_run)))
    assert 'data-live-url="' in page and 'data-status="running"' in page
    assert "aaa/live.js" in page
    last = EventRecord.objects.filter(stream=gated_run).order_by("-seq").first().seq

    r = client.get(run_url(gated_run, "live") + f"?after={last - 2}&until=50")
    assert r.status_code == 200
    data = r.json()
    assert data["status"] == "running" and data["outcome"] is None
    assert data["last_seq"] == last and data["after"] == last
    assert data["rows_html"].count('class="aaa-event') == 2
    assert APPROVAL_REQUESTED in data["rows_html"]
    assert "Approve" in data["actions_html"] and "deploy" in data["actions_html"]

    # nothing new: no rows
    data = client.get(run_url(gated_run, "live") + f"?after={last}&until=50").json()
    assert data["rows_html"].strip() == "" and data["after"] == last
    # a page that is not the tail (until <= after) never gets rows
    data = client.get(run_url(gated_run, "live") + "?after=2&until=0").json()
    assert data["rows_html"].strip() == ""


def test_a_finished_run_page_does_not_poll(client, admin_user, finished_run):
    client.force_login(admin_user)
    page = text(client.get(run_url(finished_run)))
    assert 'data-status="completed"' in page
