"""``manage.py aaa_apikey``, the API's settings checks, and the engine host's setup."""

from __future__ import annotations

from io import StringIO

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from django.test import override_settings

from aaa_django.checks import check_api_settings
from aaa_django.models import ApiKey


@pytest.mark.django_db
def test_apikey_create_list_revoke(api, django_user_model):
    django_user_model.objects.create_user("dora")
    out, err = StringIO(), StringIO()
    call_command("aaa_apikey", "create", "--user", "dora", "--name", "ci", stdout=out, stderr=err)
    raw = out.getvalue().strip()
    assert raw.startswith("aaa_") and "shown once" in err.getvalue()
    assert api.get("/runs", headers={"X-API-Key": raw}).status_code == 200
    listing = StringIO()
    call_command("aaa_apikey", "list", stdout=listing)
    assert raw[:12] in listing.getvalue() and raw not in listing.getvalue()
    assert "active" in listing.getvalue()
    call_command("aaa_apikey", "revoke", raw[:12], stdout=StringIO())
    assert ApiKey.objects.get().revoked_at is not None
    assert api.get("/runs", headers={"X-API-Key": raw}).status_code == 401
    with pytest.raises(CommandError, match="no user"):
        call_command("aaa_apikey", "create", "--user", "nobody")
    with pytest.raises(CommandError, match="no active key"):
        call_command("aaa_apikey", "revoke", raw[:12])


def ids(aaa) -> list[str]:
    with override_settings(AAA=aaa):
        return [e.id for e in check_api_settings()]


def test_api_settings_checks():
    assert ids({}) == []
    assert (
        ids(
            {
                "LLM_CLIENT": "aaa_django.llm.FakeLLMClient",
                "TOOLS": ["tests.api.algos.guarded"],
                "PROJECTIONS": ["aaa_django.runtime.meta.RUNMETA"],
                "API_RATE": "10/5min",
                "API_MAX_BODY": 10,
                "API_STREAM_SECONDS": 1,
                "API_STREAMS_PER_USER": 1,
            }
        )
        == []
    )
    assert ids({"API_STREAMS_PER_USER": 0}) == ["aaa.E022"]
    assert ids({"LLM_CLIENT": "no.such.factory"}) == ["aaa.E020"]
    assert ids({"TOOLS": ["tests.api.algos.NOPE"]}) == ["aaa.E020"]
    assert ids({"PROJECTIONS": ["aaa_django.runtime.event_types.RUN_STARTED"]}) == ["aaa.E020"]
    assert ids({"TOOLS": "tests.api.algos.guarded"}) == ["aaa.E003"]
    assert ids({"API_RATE": "often"}) == ["aaa.E021"]
    assert ids({"API_RATE": "10/ms"}) == ["aaa.E021"]
    assert ids({"API_KEY_FAILURES": "lots"}) == ["aaa.E021"]
    assert ids({"API_KEY_FAILURES": None, "API_RATE": None}) == []
    assert ids({"API_MAX_BODY": 0, "API_STREAM_SECONDS": True}) == ["aaa.E022", "aaa.E003"]


def test_a_host_without_a_model_client_fails_model_requests_clearly():
    import asyncio

    from aaa_django.site.engines import NoModelClient

    with pytest.raises(RuntimeError, match="AAA\\['LLM_CLIENT'\\]"):
        asyncio.run(NoModelClient().complete(None))


@pytest.mark.parametrize(
    "debug,backend,aaa,warned",
    [
        (False, "django.core.cache.backends.locmem.LocMemCache", {}, True),
        (False, "django.core.cache.backends.dummy.DummyCache", {"API_RATE": None}, True),
        (True, "django.core.cache.backends.locmem.LocMemCache", {}, False),
        (False, "django.core.cache.backends.db.DatabaseCache", {}, False),
        (False, "django.core.cache.backends.redis.RedisCache", {}, False),
        # the stream cap counts in the cache too, whatever the rates
        (False, "django.core.cache.backends.locmem.LocMemCache", {"API_RATE": None, "API_KEY_FAILURES": None}, True),
    ],
)
def test_a_per_process_cache_for_the_api_limits_is_warned_about(debug, backend, aaa, warned):
    from aaa_django.checks import check_api_cache

    caches = {"default": {"BACKEND": backend, "LOCATION": "aaa_cache"}}
    with override_settings(DEBUG=debug, CACHES=caches, AAA=aaa):
        found = [w.id for w in check_api_cache()]
    assert found == (["aaa.W020"] if warned else [])
