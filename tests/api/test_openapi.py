"""The OpenAPI schema is valid as written, and the docs page renders it.

The schema is parsed refusing a key declared twice (``json.loads`` would keep the last
one silently, while Swagger UI refuses the whole document), then checked by an OpenAPI
validator; Swagger UI, served from the site's own static files, renders it in
Chromium without an error (screenshot ``artifacts/screenshots/07-api-docs.png``).
"""

from __future__ import annotations

import json

import pytest
from django.test import Client
from openapi_spec_validator import validate

from ..browser import browser, shot, wait  # noqa: F401  (browser: the fixture)

STREAM = "/api/aaa/runs/{run_id}/events/stream"


def strict_pairs(pairs: list[tuple[str, object]]) -> dict:
    keys = [k for k, _ in pairs]
    twice = sorted({k for k in keys if keys.count(k) > 1})
    if twice:
        raise ValueError(f"keys declared twice: {twice} in {keys}")
    return dict(pairs)


def schema_text() -> str:
    r = Client().get("/api/aaa/openapi.json")
    assert r.status_code == 200
    return r.content.decode()


def test_the_schema_declares_no_key_twice_and_is_valid_openapi():
    spec = json.loads(schema_text(), object_pairs_hook=strict_pairs)
    validate(spec)


def test_the_event_stream_is_declared_as_server_sent_events():
    responses = json.loads(schema_text(), object_pairs_hook=strict_pairs)["paths"][STREAM]["get"]["responses"]
    assert list(responses["200"]["content"]) == ["text/event-stream"]
    assert "204" in responses and "content" not in responses["204"]


@pytest.mark.browser
@pytest.mark.slow
def test_swagger_ui_renders_the_schema_without_error(browser, live_server):  # noqa: F811
    from selenium.webdriver.common.by import By

    page = Client().get("/api/aaa/docs").content.decode()
    assert "cdn." not in page and "/static/ninja/swagger-ui-bundle.js" in page  # no network
    browser.get(live_server.url + "/api/aaa/docs")
    # Swagger UI shows either the operations or an error box once it has read the schema
    # (its loading box comes first: waiting for that raced the rendering under load)
    wait(browser, lambda d: d.find_elements(By.CSS_SELECTOR, ".opblock-summary-path, .errors-wrapper"))
    shot(browser, "07-api-docs")
    errors = [e.text for e in browser.find_elements(By.CSS_SELECTOR, ".errors-wrapper")]
    assert errors == []
    ops = browser.find_elements(By.CSS_SELECTOR, ".opblock-summary-path")
    paths = {o.get_attribute("data-path") for o in ops}
    assert STREAM in paths and "/api/aaa/runs" in paths
