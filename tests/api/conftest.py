"""Fixtures of the REST API tests: users, keys, a TestClient, runs, the engine host.

- ``api``: ninja's TestClient over the router (JSON bodies get their Content-Type).
- ``alice`` / ``bob``: users with an API key each (``alice.key``) who may start runs
  (``aaa.add_runrecord``); ``carol``: who may see every run, and nothing more.
- ``make_run(owner, ...)``: writes a run's log straight to the store (no engine), and
  indexes it: for read-only tests on the ordinary transactional test database.
- ``host``: the process's EngineHost with the test tools, on a transactional
  database (its thread writes with its own connection), reset after the test.
"""

from __future__ import annotations

import time
from typing import Any

import pytest
from django.contrib.auth.models import Permission
from django.core.cache import cache
from ninja.testing import TestClient

from aaa_django.api import router
from aaa_django.events import Event, derive_id, new_id
from aaa_django.models import ApiKey
from aaa_django.runtime.event_types import (
    INPUT_VALIDATED,
    RUN_COMPLETED,
    RUN_STARTED,
    completion_id,
    started_id,
)
from aaa_django.site.host import EngineHost
from aaa_django.store import DjangoEventStore, runindex

from . import algos  # noqa: F401  (registers the test algorithms)

TOOLS = ["tests.api.algos.guarded"]


class JsonClient(TestClient):
    """TestClient that labels JSON bodies as JSON, as every real client does."""

    def request(self, method, path, data=None, json=None, **kw):
        if json is not None:
            headers = dict(kw.pop("headers", None) or {})
            headers.setdefault("Content-Type", "application/json")
            kw["headers"] = headers
        return super().request(method, path, data, json, **kw)


@pytest.fixture
def api() -> JsonClient:
    return JsonClient(router)


@pytest.fixture(autouse=True)
def _no_rate_limit(settings):
    settings.AAA = {**getattr(settings, "AAA", {}), "API_RATE": None}
    cache.clear()


def _user(django_user_model, name: str, *perms: str):
    user = django_user_model.objects.create_user(name, password="pw")
    for codename in perms:
        user.user_permissions.add(Permission.objects.get(codename=codename))
    _, user.key = ApiKey.create_key(user, name=f"{name}'s key")
    user.auth = {"Authorization": f"Bearer {user.key}"}
    return user


@pytest.fixture
def alice(db, django_user_model):
    return _user(django_user_model, "alice", "add_runrecord")


@pytest.fixture
def bob(db, django_user_model):
    return _user(django_user_model, "bob", "add_runrecord")


@pytest.fixture
def carol(db, django_user_model):
    """May see every run (aaa.view_all_runs), start none, act on none but her own."""
    return _user(django_user_model, "carol", "view_all_runs")


@pytest.fixture
def make_run(db):
    """``make_run(owner, types=[...], algorithm=...)``: a run's log, written directly."""
    store = DjangoEventStore("default")

    def make(
        owner=None,
        *,
        types=(INPUT_VALIDATED,),
        algorithm="tests.api.echo",
        outcome="success",
        value=None,
        data=None,
        run_id=None,
    ) -> str:
        run_id = run_id or f"run-{new_id()}"
        started = Event(
            id=started_id(run_id),
            stream=run_id,
            type=RUN_STARTED,
            data={
                "algorithm": algorithm,
                "config": {},
                "input": {"text": "hi"},
                "budget": None,
                "deadline": None,
                "parent": None,
                "owner": str(owner.pk) if owner else None,
            },
        )
        events = [started]
        for i, t in enumerate(types):
            d = dict((data or {}).get(t, {}))
            if t == RUN_COMPLETED:
                d = {"outcome": outcome, "value": value}
                events.append(Event(id=completion_id(run_id), stream=run_id, type=t, data=d))
            else:
                events.append(Event(id=derive_id(started.id, t, i), stream=run_id, type=t, data=d))
        stored = store.append_sync(events)
        runindex.index_events("default", stored)
        return run_id

    return make


@pytest.fixture
def host(transactional_db, settings):
    """The process's engine host, with the test tools, reset around the test."""
    settings.AAA = {**settings.AAA, "TOOLS": TOOLS}
    EngineHost.reset()
    yield EngineHost.get()
    EngineHost.reset()


def wait_for(
    api: TestClient, run_id: str, headers: dict, *, status: str = "completed", timeout: float = 10.0
) -> dict[str, Any]:
    """Poll ``GET /runs/{id}`` until the run has ``status``; return the run."""
    end = time.monotonic() + timeout
    while True:
        r = api.get(f"/runs/{run_id}", headers=headers)
        assert r.status_code == 200, r.json()
        if r.json()["status"] == status:
            return r.json()
        if time.monotonic() > end:
            raise AssertionError(f"run {run_id} is {r.json()['status']}, not {status}")
        time.sleep(0.02)


def wait_until(check, timeout: float = 10.0):
    end = time.monotonic() + timeout
    while not (value := check()):
        if time.monotonic() > end:
            raise AssertionError("condition not met in time")
        time.sleep(0.02)
    return value
