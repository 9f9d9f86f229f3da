"""Fixtures of the admin tests: users with and without the app's permissions, the
engine host with the scripted model and tools, runs made through the engine.

- ``admin_user`` (pytest-django): a superuser.
- ``operator``: staff with every run permission (view all, cancel, approve, erase,
  re-drive, start).
- ``viewer``: staff who may see every run and act on none.
- ``site``: AAA settings for the tests (blob store on the default storage, a low
  claim threshold, the scripted model and tools) and a fresh EngineHost.
- ``finished_run`` / ``gated_run``: a ToolLoop run that ended ``success`` (with
  claim-checked blobs), and one waiting at an approval gate.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from django.conf import settings as django_settings
from django.contrib.auth.models import Permission

from aaa_django.models import RunRecord
from aaa_django.site.host import EngineHost
from aaa_django.store import runindex

from . import support

RUN_PERMS = (
    "view_runrecord",
    "view_all_runs",
    "cancel_run",
    "approve_run",
    "erase_run",
    "change_runrecord",
    "add_runrecord",
)


def make_staff(django_user_model, name: str, *perms: str):
    user = django_user_model.objects.create_user(name, password="pw", is_staff=True)
    for codename in perms:
        user.user_permissions.add(Permission.objects.get(codename=codename, content_type__app_label="aaa"))
    return user


@pytest.fixture
def operator(db, django_user_model):
    return make_staff(django_user_model, "operator", *RUN_PERMS)


@pytest.fixture
def viewer(db, django_user_model):
    return make_staff(django_user_model, "viewer", "view_runrecord", "view_all_runs")


@pytest.fixture
def media_root() -> Path:
    return Path(django_settings.STORAGES["default"]["OPTIONS"]["location"])


@pytest.fixture
def site(transactional_db, settings):
    """The AAA settings of the admin tests, and an engine host built from them."""
    settings.AAA = {
        **settings.AAA,
        "BLOB_STORAGE": "default",
        "CLAIM_THRESHOLD": support.CLAIM_THRESHOLD,
        "LLM_CLIENT": "tests.admin.support.fake_client",
        "TOOLS": support.TOOLS,
        "API_RATE": None,
    }
    EngineHost.reset()
    yield EngineHost.get()
    EngineHost.reset()


def start(host: EngineHost, task: str, owner=None, **config) -> str:
    run = host.call(lambda e: e.start(support.loop(**config), {"task": task}, owner=str(owner.pk) if owner else None))
    return run.run_id


@pytest.fixture
def finished_run(transactional_db, site, admin_user) -> str:
    """A ToolLoop run that looked a topic up (claim-checked result) and succeeded."""
    run_id = start(site, "look up the admin", owner=admin_user)
    support.wait_until(lambda: (r := runindex.refresh("default", run_id)) and r.outcome)
    assert RunRecord.objects.get(pk=run_id).outcome == "success"
    return run_id


@pytest.fixture
def gated_run(transactional_db, site, admin_user) -> str:
    """A ToolLoop run waiting for someone to approve its ``deploy`` call."""
    from aaa_django.models import EventRecord
    from aaa_django.runtime.event_types import APPROVAL_REQUESTED

    run_id = start(site, "deploy the web service", owner=admin_user)
    support.wait_until(lambda: EventRecord.objects.filter(stream=run_id, type=APPROVAL_REQUESTED).exists())
    runindex.refresh("default", run_id)
    return run_id
