"""The run list and the run page: what staff read (Django test client)."""

from __future__ import annotations

import html
import json
import re
from zoneinfo import ZoneInfo

from django.contrib.admin.utils import quote
from django.urls import reverse

from aaa_django.models import EventRecord, RunRecord
from aaa_django.runtime.event_types import CHILD_REQUESTED, TOOL_COMPLETED, TOOL_REQUESTED
from aaa_django.store import runindex


def run_url(run_id: str, what: str = "change", *args) -> str:
    return reverse(f"admin:aaa_runrecord_{what}", args=(quote(run_id), *args))


def text(response) -> str:
    return response.content.decode()


def test_run_list_shows_the_index_with_filters_and_search(client, admin_user, finished_run):
    client.force_login(admin_user)
    r = client.get(reverse("admin:aaa_runrecord_changelist"))
    assert r.status_code == 200
    page = text(r)
    run = RunRecord.objects.get(pk=finished_run)
    assert finished_run in page
    assert "aaa.algos.ToolLoop" in page
    assert "completed · success" in page
    assert "admin" in page  # the owner
    assert f">{run.tokens:,}<" in page and f"${run.cost:.6f}" in page
    assert f'<td class="field-events_col">{run.last_seq}</td>' in page
    for column in ("started", "ended", "duration"):
        assert column in page.lower()
    # filters: outcome, status, algorithm, date
    for f in ("?outcome=success", "?status__exact=completed", "?algorithm=aaa.algos.ToolLoop", "started_at__gte"):
        assert f in page
    assert "Start a run" in page

    assert finished_run not in text(client.get(reverse("admin:aaa_runrecord_changelist") + "?outcome=failed"))
    assert finished_run in text(client.get(reverse("admin:aaa_runrecord_changelist") + "?outcome=success"))
    assert finished_run in text(client.get(reverse("admin:aaa_runrecord_changelist") + "?q=" + finished_run[-8:]))
    assert finished_run in text(client.get(reverse("admin:aaa_runrecord_changelist") + "?q=admin"))
    assert finished_run not in text(client.get(reverse("admin:aaa_runrecord_changelist") + "?q=nobody"))


def test_run_page_shows_summary_timeline_projections_and_blobs(client, admin_user, finished_run):
    client.force_login(admin_user)
    r = client.get(run_url(finished_run))
    assert r.status_code == 200
    page = text(r)
    # summary
    assert "aaa.algos.ToolLoop" in page and "completed · success" in page
    assert "look up the admin" in page  # the input
    assert "Done after 1 tool call" in page  # the outcome value
    # timeline: one readable line per event, causation links
    types = list(EventRecord.objects.filter(stream=finished_run).order_by("seq").values_list("type", flat=True))
    for t in set(types):
        assert t in page
    assert "aaa.algos.ToolLoop started" in page
    assert "lookup(topic=&quot;admin&quot;)" in page
    assert "ended success" in page
    assert re.search(r'href="\?page=1&amp;per=50#e\d+"[^>]*>&larr; \d+', page)
    # claim-checked events are marked, with a hydrate link
    assert "claim-checked" in page and "?hydrate=1" in page
    # projections: RUNMETA and LOOP (and CONVERSATION), with their source
    assert 'data-name="aaa.runtime.engine.RUNMETA"' in page
    assert 'data-name="aaa.algos.loops.LOOP"' in page
    assert "events folded" in page or "event folded" in page
    # blobs: verified
    assert "verified" in page and "preview" in page


def test_time_travel_folds_projections_as_of_an_earlier_event(client, admin_user, finished_run):
    client.force_login(admin_user)
    first_tool = EventRecord.objects.get(stream=finished_run, type=TOOL_REQUESTED).seq
    r = client.get(run_url(finished_run) + f"?at={first_tool}")
    page = text(r)
    assert "Projections as of event" in page
    loop = re.search(r'data-name="aaa.algos.loops.LOOP".*?<pre class="aaa-json">(.*?)</pre>', page, re.S).group(1)
    state = json.loads(loop.replace("&quot;", '"').replace("&#x27;", "'"))
    assert state["turns"] == 1
    assert [c["name"] for c in state["calls"]] == ["lookup"]
    assert state["results"] == {}  # the tool had not answered yet
    assert f"state as of event {first_tool}" in page
    assert "a replay from the first event" in page  # no snapshot that early


def test_event_page_hydrates_a_claim_checked_event_on_demand(client, admin_user, finished_run):
    client.force_login(admin_user)
    e = EventRecord.objects.get(stream=finished_run, type=TOOL_COMPLETED)
    assert json.loads(e.data) == {"$claim": True, "call_id": json.loads(e.data)["call_id"], "name": "lookup"}
    page = text(client.get(run_url(finished_run, "event", e.seq)))
    assert "claim-checked" in page and "Hydrate" in page and "fact-59" not in page
    page = text(client.get(run_url(finished_run, "event", e.seq) + "?hydrate=1"))
    assert 'id="aaa-hydrated"' in page and "fact-59" in page


def test_blob_preview_and_download_are_verified(client, admin_user, finished_run):
    client.force_login(admin_user)
    e = EventRecord.objects.get(stream=finished_run, type=TOOL_COMPLETED)
    r = client.get(run_url(finished_run, "blob", e.seq, 0))
    assert r.status_code == 200
    page = text(r)
    assert e.blobs[0]["sha256"] in page and "application/json" in page
    assert "verified" in page and 'id="aaa-preview"' in page and "fact-59" in page
    r = client.get(run_url(finished_run, "blob_download", e.seq, 0))
    assert r.status_code == 200
    assert r["Content-Disposition"].startswith("attachment;")
    assert r["X-Content-Type-Options"] == "nosniff"
    body = b"".join(r.streaming_content)
    import hashlib

    assert hashlib.sha256(body).hexdigest() == e.blobs[0]["sha256"]
    assert json.loads(body)["result"]["document"].startswith("fact-0")


def test_parent_and_child_runs_link_to_each_other(client, admin_user, site):
    from aaa_django.store import runindex
    from tests.runtime.algos import Parent  # registers tests.parent

    from . import support

    child = {"algorithm": "aaa.algos.ToolLoop", "config": support.loop().config()}
    parent_id = site.call(lambda e: e.start(Parent(child=child), {"task": "look up"}, owner=str(admin_user.pk))).run_id
    support.wait_until(lambda: (r := runindex.refresh("default", parent_id)) and r.outcome)
    child_id = RunRecord.objects.get(parent=parent_id).run_id
    runindex.refresh("default", child_id)
    client.force_login(admin_user)

    page = text(client.get(run_url(parent_id)))
    assert run_url(child_id) in page and "Child run" in page
    assert "child run &#x27;only&#x27;: aaa.algos.ToolLoop" in page
    assert "child &#x27;only&#x27; ended success" in page

    page = text(client.get(run_url(child_id)))
    assert f'Parent: <a href="{run_url(parent_id)}">{parent_id}</a>' in page
    # the child's start was caused by the parent's request: a link into the parent's log
    requested = EventRecord.objects.get(stream=parent_id, type=CHILD_REQUESTED).seq
    assert f"{run_url(parent_id)}?page=1&amp;per=50#e{requested}" in page


def test_projections_are_listed_runmeta_own_other_folded_deferred_each_by_name(finished_run):
    from aaa_django.admin import reading
    from aaa_django.reading import projections as registry
    from aaa_django.runtime import RUNMETA

    run = RunRecord.objects.get(pk=finished_run)
    folded = reading.fold_all(run.run_id, events=run.last_seq, algorithm=run.algorithm)
    own = reading._own_projections(run.algorithm)
    assert own and folded[0].name == RUNMETA.name
    assert [f.name for f in folded].count(RUNMETA.name) == 1
    assert {f.name for f in folded} == set(registry.all_projections())
    assert any(f.deferred for f in folded) and all(f.deferred is None for f in folded if f.name in own)
    keys = [(f.name != RUNMETA.name, f.name not in own, f.deferred is not None, f.name) for f in folded]
    assert keys == sorted(keys)


def test_a_runs_deadline_is_shown_as_a_date_and_time(client, admin_user, site, settings):
    from datetime import datetime, timezone

    from aaa_django.store import runindex

    from . import support

    settings.TIME_ZONE = "Europe/Paris"
    run_id = site.call(
        lambda e: e.start(support.loop(), {"task": "deploy the web service"}, owner=str(admin_user.pk), deadline=3600)
    ).run_id
    runindex.refresh("default", run_id)
    deadline = json.loads(EventRecord.objects.get(stream=run_id, seq=1).data)["deadline"]
    client.force_login(admin_user)
    page = text(client.get(run_url(run_id)))
    shown = re.search(r'<td id="aaa-deadline">([^<]*)</td>', page).group(1)
    at = datetime.fromtimestamp(deadline, timezone.utc).astimezone(ZoneInfo("Europe/Paris"))
    assert shown == at.strftime("%Y-%m-%d %H:%M:%S ") + at.tzname()
    assert "epoch" not in page
    site.call(lambda e: e.cancel(run_id))


def test_run_page_shows_the_schema_of_a_structured_result_and_its_verdicts(client, admin_user, site):
    from .conftest import start
    from .support import Summary, wait_until

    run_id = start(site, "look up the admin", owner=admin_user, output=Summary, output_retries=0)
    wait_until(lambda: (r := runindex.refresh("default", run_id)) and r.outcome)
    client.force_login(admin_user)
    page = text(client.get(run_url(run_id)))

    schema = re.search(r'<pre class="aaa-json" id="aaa-output-schema">(.*?)</pre>', page, re.S).group(1)
    assert json.loads(html.unescape(schema)) == Summary.model_json_schema()
    assert "answer rejected (1 error): answer: Invalid JSON" in page
    assert "completed · no_solution" in page


def test_run_page_shows_how_often_the_sweeper_re_drove_the_run(client, admin_user, finished_run, settings):
    from datetime import datetime, timezone

    settings.TIME_ZONE = "Europe/Paris"
    client.force_login(admin_user)
    assert 'id="aaa-redriven"' not in text(client.get(run_url(finished_run)))  # never re-driven
    at = 1_800_000_000.0
    RunRecord.objects.filter(pk=finished_run).update(redriven_at=at, redrives=2)
    page = text(client.get(run_url(finished_run)))
    shown = re.search(r'<td id="aaa-redriven">([^<]*)</td>', page).group(1)
    local = datetime.fromtimestamp(at, timezone.utc).astimezone(ZoneInfo("Europe/Paris"))
    assert shown == f"2 times by the sweeper, last {local.strftime('%Y-%m-%d %H:%M:%S ')}{local.tzname()}"
