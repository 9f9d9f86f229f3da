"""API keys in the admin: created with the secret shown once, revoked, permission-gated,
and never a page with the stored hash on it."""

from __future__ import annotations

import re

import pytest
from django.contrib.admin.models import LogEntry
from django.contrib.auth.models import Permission
from django.test import Client
from django.urls import reverse

from aaa_django.models import ApiKey

from .conftest import make_staff
from .test_run_pages import text

pytestmark = pytest.mark.django_db

SECRET = re.compile(re.escape(ApiKey.SCHEME) + r"[A-Za-z0-9_-]{43}")


def url(what: str, *args) -> str:
    return reverse(f"admin:aaa_apikey_{what}", args=args)


def api_status(secret: str) -> int:
    """What the REST API (mounted at /api/aaa/ by tests/urls.py) answers to the key."""
    return Client().get("/api/aaa/runs", HTTP_AUTHORIZATION=f"Bearer {secret}").status_code


@pytest.fixture
def alice(django_user_model):
    return django_user_model.objects.create_user("alice", password="pw")


def test_a_created_key_is_shown_once_stored_hashed_and_authenticates(client, admin_user, alice):
    client.force_login(admin_user)
    assert client.get(url("add")).status_code == 200
    r = client.post(url("add"), {"user": alice.pk, "name": "ci", "expires_days": "30"})

    assert r.status_code == 200  # the secret is in this answer, not behind a redirect
    assert "no-store" in r["Cache-Control"]
    (secret,) = set(SECRET.findall(text(r)))
    key = ApiKey.objects.get()
    assert (key.user, key.name, key.hashed) == (alice, "ci", ApiKey.hash(secret))
    assert key.expires_at is not None
    assert secret not in (key.prefix, key.name, key.hashed) and secret.startswith(key.prefix)

    # nothing kept it: not the session, a cookie, the admin's log, nor any later page
    assert secret not in str(dict(client.session))
    assert all(secret not in c.value for c in r.cookies.values())
    assert all(secret not in e.object_repr + e.change_message for e in LogEntry.objects.all())
    for page in (url("changelist"), url("change", key.pk), url("history", key.pk)):
        assert client.get(page).status_code == 200
        assert secret not in text(client.get(page))

    assert api_status(secret) == 200
    key.refresh_from_db()
    assert key.last_used_at is not None


def test_revoking_a_key_from_its_page_makes_the_api_answer_401(client, admin_user, alice):
    key, secret = ApiKey.create_key(alice, name="report")
    assert api_status(secret) == 200
    client.force_login(admin_user)
    page = text(client.get(url("change", key.pk)))
    assert url("revoke", key.pk) in page
    confirm = client.get(url("revoke", key.pk))
    assert confirm.status_code == 200 and "401" in text(confirm)
    assert ApiKey.objects.get(pk=key.pk).revoked_at is None  # GET only asks

    r = client.post(url("revoke", key.pk))
    assert r.status_code == 302 and r["Location"] == url("change", key.pk)
    assert api_status(secret) == 401
    page = text(client.get(url("change", key.pk)))
    assert "revoked" in page and url("revoke", key.pk) not in page


def test_revoking_selected_keys_from_the_list(client, admin_user, alice):
    (a, secret_a), (_, secret_b) = ApiKey.create_key(alice), ApiKey.create_key(alice)
    client.force_login(admin_user)
    r = client.post(url("changelist"), {"action": "revoke_keys", "_selected_action": [a.pk]})
    assert r.status_code == 302
    assert (api_status(secret_a), api_status(secret_b)) == (401, 200)
    assert 'href="?state=revoked"' in text(client.get(url("changelist")))
    assert a.prefix in text(client.get(url("changelist") + "?state=revoked"))
    assert a.prefix not in text(client.get(url("changelist") + "?state=active"))


def test_without_the_apikey_permissions_every_page_is_403(client, django_user_model, alice):
    key, secret = ApiKey.create_key(alice)
    nobody = make_staff(django_user_model, "nobody")
    client.force_login(nobody)
    for page in (url("changelist"), url("add"), url("change", key.pk), url("revoke", key.pk)):
        assert client.get(page).status_code == 403, page
    assert client.post(url("add"), {"user": nobody.pk}).status_code == 403
    assert client.post(url("revoke", key.pk)).status_code == 403
    assert client.post(url("changelist"), {"action": "revoke_keys", "_selected_action": [key.pk]}).status_code == 403
    assert ApiKey.objects.count() == 1 and api_status(secret) == 200


def test_view_permission_lists_and_opens_keys_but_cannot_revoke_or_create(client, django_user_model, alice):
    key, secret = ApiKey.create_key(alice)
    reader = make_staff(django_user_model, "reader", "view_apikey")
    client.force_login(reader)
    listing = text(client.get(url("changelist")))
    assert key.prefix in listing and "revoke_keys" not in listing and url("add") not in listing
    page = client.get(url("change", key.pk))
    assert page.status_code == 200
    assert url("revoke", key.pk) not in text(page) and 'name="_save"' not in text(page)
    assert client.post(url("revoke", key.pk)).status_code == 403
    assert client.post(url("change", key.pk), {"name": "renamed"}).status_code == 403
    assert client.get(url("add")).status_code == 403
    assert api_status(secret) == 200 and ApiKey.objects.get(pk=key.pk).name == ""


def test_keys_for_other_users_need_the_permission_to_change_users(client, django_user_model, alice):
    maker = make_staff(django_user_model, "maker", "add_apikey")
    client.force_login(maker)
    r = client.post(url("add"), {"user": alice.pk})
    assert r.status_code == 200 and "errors-user" in text(r)
    assert not ApiKey.objects.exists()
    r = client.post(url("add"), {"user": maker.pk})
    assert SECRET.search(text(r)) and ApiKey.objects.get().user == maker

    maker.user_permissions.add(Permission.objects.get(codename="change_user"))
    maker = django_user_model.objects.get(pk=maker.pk)  # drop the cached permissions
    client.force_login(maker)
    client.post(url("add"), {"user": alice.pk})
    assert ApiKey.objects.filter(user=alice).count() == 1


def test_the_hash_is_never_rendered_and_keys_are_not_deleted(client, admin_user, alice):
    client.force_login(admin_user)
    created = client.post(url("add"), {"user": alice.pk, "name": "ci"})
    key = ApiKey.objects.get()
    pages = [created] + [
        client.get(p) for p in (url("changelist"), url("change", key.pk), url("revoke", key.pk), url("history", key.pk))
    ]
    for page in pages:
        assert page.status_code == 200
        assert key.hashed[:16] not in text(page)
    # nor is it searchable (the page echoes the query, so look at the result count)
    found = client.get(url("changelist"), {"q": key.hashed}).context["cl"].result_count
    assert found == 0
    assert client.get(url("changelist"), {"q": key.prefix}).context["cl"].result_count == 1

    assert client.post(url("delete", key.pk), {"post": "yes"}).status_code == 403
    assert ApiKey.objects.filter(pk=key.pk).exists()


def test_the_three_states_agree_in_the_model_the_list_and_the_command(client, admin_user, alice):
    """ApiKey.state, ApiKeyQuerySet.active/expired/revoked, the admin's filter and
    column, and ``aaa_apikey list`` are one rule: revoked wins over expired."""
    from datetime import timedelta
    from io import StringIO

    from django.core.management import call_command
    from django.utils import timezone

    active, _ = ApiKey.create_key(alice, name="k-active", expires_in=timedelta(days=1))
    expired, _ = ApiKey.create_key(alice, name="k-expired")
    revoked, _ = ApiKey.create_key(alice, name="k-revoked")
    both, _ = ApiKey.create_key(alice, name="k-both")
    past = timezone.now() - timedelta(seconds=1)
    ApiKey.objects.filter(pk__in=[expired.pk, both.pk]).update(expires_at=past)
    revoked.revoke()
    ApiKey.objects.get(pk=both.pk).revoke()

    want = {"active": {active.pk}, "expired": {expired.pk}, "revoked": {revoked.pk, both.pk}}
    for state, pks in want.items():
        assert set(getattr(ApiKey.objects, state)().values_list("pk", flat=True)) == pks, state
        assert {k.pk for k in ApiKey.objects.all() if k.state == state} == pks, state

    client.force_login(admin_user)
    for state, pks in want.items():
        r = client.get(url("changelist"), {"state": state})
        assert {k.pk for k in r.context["cl"].result_list} == pks, state
        assert text(r).count(f">{state}</span>") == len(pks), state  # the state column

    listing = StringIO()
    call_command("aaa_apikey", "list", stdout=listing)
    lines = {line.split()[-1]: line.split()[2] for line in listing.getvalue().splitlines()}
    assert lines == {"k-active": "active", "k-expired": "expired", "k-revoked": "revoked", "k-both": "revoked"}
