"""A run whose input is over the claim threshold, started over the REST API, is its
owner's, and ends (see ``tests/runtime/test_large_inputs.py``)."""

from __future__ import annotations

import pytest

from aaa_django.data import canonical_json, is_claimed
from aaa_django.runtime.event_types import RUN_COMPLETED
from aaa_django.site.host import EngineHost
from aaa_django.store import DjangoEventStore

from .conftest import TOOLS, wait_for

SIZES = [16_383, 16_385, 1_000_000]  # the last: within the API's 1 MiB body limit


@pytest.fixture
def host(transactional_db, settings):
    """The engine host with a blob store (the site's default storage)."""
    settings.AAA = {**settings.AAA, "TOOLS": TOOLS, "BLOB_STORAGE": "default"}
    EngineHost.reset()
    yield EngineHost.get()
    EngineHost.reset()


@pytest.mark.parametrize("size", SIZES)
def test_the_api_starts_a_run_with_a_large_input_and_its_owner_sees_it(api, alice, host, size):
    text_ = "y" * (size - len(canonical_json({"text": ""})))
    r = api.post(
        "/runs",
        json={"algorithm": "tests.api.echo", "input": {"text": text_}, "budget": {"tokens": 100}, "deadline": 600},
        headers=alice.auth,
    )
    assert r.status_code == 201, r.json()
    run = r.json()
    done = wait_for(api, run["id"], alice.auth)  # the owner sees the run (not a 404)
    assert done["outcome"] == "success" and done["value"] == {"echo": text_}
    assert done["owner"] == "alice" and done["budget"] == {"tokens": 100}
    (started,) = DjangoEventStore().read_sync(run["id"], limit=1)
    assert is_claimed(started.data) and started.data["owner"] == str(alice.pk)
    events = api.get(f"/runs/{run['id']}/events", headers=alice.auth).json()["items"]
    assert [e["type"] for e in events][-1] == RUN_COMPLETED  # nothing after it
