"""A site's own ``AdminSite``: every link on the app's pages stays on the site that
served the page (none leads to Django's default admin at /admin/)."""

from __future__ import annotations

import re

import pytest
from django.contrib.admin.utils import quote
from django.urls import reverse

from aaa_django.models import ApiKey, EventRecord

pytestmark = pytest.mark.urls("tests.admin.second_site")

HREF = re.compile(r'(?:href|action)="([^"]*)"')


def links(page: str) -> list[str]:
    return [h for h in HREF.findall(page) if h.startswith("/")]


def on_second_site(client, url: str, method: str = "get") -> list[str]:
    r = getattr(client, method)(url)
    assert r.status_code == 200, (url, r.status_code)
    found = links(r.content.decode())
    assert found, url
    stray = [h for h in found if h.startswith("/admin/")]
    assert not stray, (url, stray)
    return found


def test_every_page_links_within_the_site_that_serves_it(client, admin_user, finished_run):
    client.force_login(admin_user)
    name = "second:aaa_runrecord"
    rid = quote(finished_run)
    seq = EventRecord.objects.filter(stream=finished_run).exclude(blobs=[]).values_list("seq", flat=True).first()
    key, _ = ApiKey.create_key(admin_user, name="ci")
    pages = [
        reverse(f"{name}_changelist"),
        reverse(f"{name}_change", args=(rid,)),
        reverse(f"{name}_change", args=(rid,)) + "?at=2",
        reverse(f"{name}_event", args=(rid, seq)),
        reverse(f"{name}_blob", args=(rid, seq, 0)),
        reverse(f"{name}_erase", args=(rid,)),
        reverse(f"{name}_add"),
        reverse("second:aaa_eventrecord_changelist"),
        reverse("second:aaa_snapshotrecord_changelist"),
        reverse("second:aaa_apikey_changelist"),
        reverse("second:aaa_apikey_add"),
        reverse("second:aaa_apikey_change", args=(key.pk,)),
        reverse("second:aaa_apikey_revoke", args=(key.pk,)),
    ]
    for url in pages:
        on_second_site(client, url)
    # the live fragment (JSON) carries the timeline rows and the actions panel
    live = client.get(reverse(f"{name}_live", args=(rid,)) + "?after=0").json()
    stray = [h for h in links(live["rows_html"] + live["actions_html"]) if h.startswith("/admin/")]
    assert not stray
    # links that name a run lead to its page on this site
    events = on_second_site(client, reverse("second:aaa_eventrecord_changelist"))
    assert any(h.startswith(reverse(f"{name}_change", args=(rid,))) for h in events)
