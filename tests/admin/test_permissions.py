"""Who sees and who acts: staff without the run permissions see no buttons and get
403 when they post; events and snapshots are read-only even for superusers."""

from __future__ import annotations

import pytest
from django.urls import reverse

from aaa_django.models import EventRecord, RunRecord, SnapshotRecord
from aaa_django.runtime.event_types import APPROVAL_DECISIONS, APPROVAL_REQUESTED, CANCEL_REQUESTED

from .conftest import make_staff
from .test_run_pages import run_url, text

BUTTONS = ("Cancel run", "Approve", "Deny", "Re-drive", "Erase…")


def test_a_viewer_sees_a_gated_run_without_action_buttons_and_gets_403(client, viewer, gated_run):
    client.force_login(viewer)
    r = client.get(run_url(gated_run))
    assert r.status_code == 200
    page = text(r)
    assert "Waiting for approval" in page and "deploy" in page
    for label in BUTTONS:
        assert label not in page, label
    assert "no permission to act" in page
    request_id = EventRecord.objects.get(stream=gated_run, type=APPROVAL_REQUESTED).id

    for what, data in (
        ("cancel", {"reason": "x"}),
        ("approve", {"request_id": request_id}),
        ("deny", {"request_id": request_id}),
        ("redrive", {}),
        ("erase", {"confirm": gated_run}),
    ):
        assert client.post(run_url(gated_run, what), data).status_code == 403, what
    assert client.get(run_url(gated_run, "erase")).status_code == 403
    assert client.get(reverse("admin:aaa_runrecord_add")).status_code == 403
    assert client.post(reverse("admin:aaa_runrecord_add"), {}).status_code == 403
    assert "Start a run" not in text(client.get(reverse("admin:aaa_runrecord_changelist")))

    # nothing happened to the run
    types = list(EventRecord.objects.filter(stream=gated_run).values_list("type", flat=True))
    assert CANCEL_REQUESTED not in types
    assert not set(types) & set(APPROVAL_DECISIONS)
    assert RunRecord.objects.get(pk=gated_run).status == "running"


def test_an_operator_sees_every_button(client, operator, gated_run):
    client.force_login(operator)
    page = text(client.get(run_url(gated_run)))
    for label in BUTTONS:
        assert label in page, label


def test_without_view_all_runs_staff_see_only_their_own_runs(client, django_user_model, finished_run, site):
    from aaa_django.store import runindex

    from . import support
    from .conftest import start

    dana = make_staff(django_user_model, "dana", "view_runrecord", "view_eventrecord")
    own = start(site, "look up my own", owner=dana)
    support.wait_until(lambda: (r := runindex.refresh("default", own)) and r.outcome)
    client.force_login(dana)
    listing = text(client.get(reverse("admin:aaa_runrecord_changelist")))
    assert own in listing and finished_run not in listing
    assert client.get(run_url(finished_run)).status_code == 404  # ids do not leak
    assert client.get(run_url(finished_run, "live")).status_code == 404
    assert client.post(run_url(finished_run, "cancel")).status_code == 404
    # an owner acts on their own run, as in the API
    page = text(client.get(run_url(own)))
    assert "Erase…" in page
    # events of others' runs are not listed either
    events = text(client.get(reverse("admin:aaa_eventrecord_changelist")))
    assert own in events and finished_run not in events


def test_an_action_permission_without_view_all_runs_shows_no_one_elses_run(client, django_user_model, gated_run):
    """The API's rule (aaa_django.access): seeing needs view_all_runs; the action's
    permission still acts on a run given by id."""
    erin = make_staff(django_user_model, "erin", "view_runrecord", "cancel_run")
    client.force_login(erin)
    assert gated_run not in text(client.get(reverse("admin:aaa_runrecord_changelist")))
    assert client.get(run_url(gated_run)).status_code == 404
    assert client.post(run_url(gated_run, "redrive")).status_code == 404
    r = client.post(run_url(gated_run, "cancel"), {"reason": "by id"})
    assert r.status_code == 302
    types = EventRecord.objects.filter(stream=gated_run).values_list("type", flat=True)
    assert CANCEL_REQUESTED in types
    # back to the run list, not to the run's page (a 404 for her), with the message
    changelist = reverse("admin:aaa_runrecord_changelist")
    assert r["Location"] == changelist
    after = client.get(r["Location"])
    assert after.status_code == 200
    assert "Cancellation requested." in text(after) and gated_run not in text(after)


def test_acting_without_seeing_always_returns_to_the_run_list(client, django_user_model, gated_run, monkeypatch):
    """An incomplete approval form and an engine that does not answer send the user
    who may act but not see back to the list, with the message (not to a 404)."""
    from aaa_django.admin import engine

    changelist = reverse("admin:aaa_runrecord_changelist")
    frank = make_staff(django_user_model, "frank", "view_runrecord", "approve_run", "change_runrecord")
    client.force_login(frank)

    r = client.post(run_url(gated_run, "approve"), {})
    assert r.status_code == 302 and r["Location"] == changelist
    after = client.get(r["Location"])
    assert after.status_code == 200 and "Which approval? The form was incomplete." in text(after)

    def down(*args, **kwargs):
        raise engine.EngineUnavailable("stopped for the test")

    monkeypatch.setattr(engine, "redrive", down)
    r = client.post(run_url(gated_run, "redrive"))
    assert r.status_code == 302 and r["Location"] == changelist
    after = client.get(r["Location"])
    assert after.status_code == 200
    assert "The engine did not answer: stopped for the test" in text(after)

    # who sees the run still goes back to its page
    client.force_login(make_staff(django_user_model, "gina", "view_runrecord", "view_all_runs", "approve_run"))
    r = client.post(run_url(gated_run, "approve"), {})
    assert r.status_code == 302 and r["Location"] == run_url(gated_run)
    assert "Which approval?" in text(client.get(r["Location"]))


def test_staff_without_any_run_permission_get_no_runs_pages(client, django_user_model, finished_run):
    nobody = make_staff(django_user_model, "nobody")
    client.force_login(nobody)
    assert client.get(reverse("admin:aaa_runrecord_changelist")).status_code == 403
    assert client.get(run_url(finished_run)).status_code == 403
    assert client.post(run_url(finished_run, "cancel")).status_code == 403


def test_anonymous_users_are_sent_to_the_login_page(client, finished_run):
    r = client.get(run_url(finished_run))
    assert r.status_code == 302 and "/login/" in r["Location"]
    r = client.post(run_url(finished_run, "cancel"))
    assert r.status_code == 302 and "/login/" in r["Location"]


@pytest.mark.parametrize("model", [EventRecord, SnapshotRecord])
def test_events_and_snapshots_are_read_only_even_for_superusers(client, admin_user, finished_run, model):
    client.force_login(admin_user)
    name = model._meta.model_name
    listing = client.get(reverse(f"admin:aaa_{name}_changelist"))
    assert listing.status_code == 200
    assert reverse(f"admin:aaa_{name}_add") not in text(listing)
    assert 'name="action"' not in text(listing)  # no bulk delete
    assert client.get(reverse(f"admin:aaa_{name}_add")).status_code == 403
    if model is SnapshotRecord:  # a short run has none yet: save one as a projection would
        from aaa_django.events import Snapshot
        from aaa_django.store import DjangoEventStore

        head = EventRecord.objects.get(stream=finished_run, seq=1)
        DjangoEventStore().save_snapshot_sync(Snapshot(finished_run, "tests.P", 1, 1, head.id, "{}"))
    obj = model.objects.filter(stream=finished_run).first()
    assert obj is not None
    change = client.get(reverse(f"admin:aaa_{name}_change", args=(obj.pk,)))
    assert change.status_code == 200
    assert 'name="_save"' not in text(change)
    before = model.objects.count()
    assert client.post(reverse(f"admin:aaa_{name}_change", args=(obj.pk,)), {}).status_code == 403
    assert client.post(reverse(f"admin:aaa_{name}_delete", args=(obj.pk,)), {"post": "yes"}).status_code == 403
    assert model.objects.count() == before


def test_the_run_index_is_not_editable_either(client, admin_user, finished_run):
    client.force_login(admin_user)
    assert client.post(reverse("admin:aaa_runrecord_delete", args=(finished_run,)), {"post": "yes"}).status_code == 403
    assert RunRecord.objects.filter(pk=finished_run).exists()


def test_starting_a_run_needs_active_staff_with_add_runrecord(client, django_user_model):
    """Django's own has_add_permission, behind the admin's gate (active staff only)."""
    add = reverse("admin:aaa_runrecord_add")
    for name, staff, active in (("plain", False, True), ("gone", True, False)):
        user = make_staff(django_user_model, name, "view_runrecord", "add_runrecord")
        django_user_model.objects.filter(pk=user.pk).update(is_staff=staff, is_active=active)
        client.force_login(user)
        r = client.get(add)
        assert r.status_code == 302 and "/login/" in r["Location"], name
    starter = make_staff(django_user_model, "starter", "add_runrecord")
    client.force_login(starter)
    assert "Start a run" in text(client.get(reverse("admin:aaa_runrecord_changelist")))
    client.force_login(make_staff(django_user_model, "looker", "view_runrecord"))
    assert client.get(add).status_code == 403
