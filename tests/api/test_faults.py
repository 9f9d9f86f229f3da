"""An infrastructure failure inside a handler, seen as a user sees it: a model reply too
big to keep in its event goes to the blob store, whose S3 bucket is missing. The run
ends ``failed`` at once (not ``timeout`` at its deadline), and the reason names the
cause in the API and on the admin's run page.
"""

from __future__ import annotations

import json

import pytest
from django.contrib.admin.utils import quote
from django.urls import reverse

from aaa_django.site.host import EngineHost

from .conftest import wait_for

#: a reply above the claim threshold (16 KiB): it must go to the blob store
BIG = "z" * 20_000


def big_model():
    """An LLM_CLIENT factory: a scripted model whose one reply is BIG."""
    from aaa_django.llm import FakeLLMClient
    from aaa_django.llm.fake import text

    return FakeLLMClient(lambda request: text(BIG))


@pytest.fixture
def missing_bucket(transactional_db, settings, s3_bucket):
    """The site's blob storage is an S3 bucket that does not exist; a fresh host."""
    options = {**s3_bucket, "bucket_name": s3_bucket["bucket_name"] + "-gone"}
    settings.STORAGES = {
        **settings.STORAGES,
        "blobs": {"BACKEND": "storages.backends.s3.S3Storage", "OPTIONS": options},
    }
    settings.AAA = {**settings.AAA, "BLOB_STORAGE": "blobs", "LLM_CLIENT": "tests.api.test_faults.big_model"}
    EngineHost.reset()
    yield
    EngineHost.reset()


def test_a_missing_bucket_fails_the_run_naming_it_in_the_api_and_the_admin(api, alice, admin_client, missing_bucket):
    run = api.post(
        "/runs", json={"algorithm": "aaa.algos.ToolLoop", "input": {"task": "hi"}, "deadline": 300}, headers=alice.auth
    ).json()

    done = wait_for(api, run["id"], alice.auth)

    assert done["outcome"] == "failed"  # now, not `timeout` five minutes later
    value = done["value"]
    assert value["error"].startswith("the blob store failed: BlobStoreUnavailable: NoSuchBucket: ")
    assert (value["service"], value["transient"], value["event_type"]) == ("blob store", False, "aaa.llm.requested")
    page = admin_client.get(reverse("admin:aaa_runrecord_change", args=(quote(run["id"]),)))
    assert page.status_code == 200
    assert "NoSuchBucket" in page.content.decode() and "failed" in page.content.decode()
    events = api.get(f"/runs/{run['id']}/events", headers=alice.auth).json()["items"]
    assert [e["type"] for e in events][-1] == "aaa.run.completed"
    assert json.dumps(events).count("aaa.run.completed") == 1
