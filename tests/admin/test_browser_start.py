"""Starting a run from the admin's form in a real browser (headless Chromium, see
``tests/browser.py``): choose the algorithm, fill its fields, tick a site tool."""

from __future__ import annotations

import json

import pytest
from django.urls import reverse

from aaa_django.models import EventRecord, RunRecord
from aaa_django.runtime.event_types import RUN_STARTED, TOOL_REQUESTED

from ..browser import browser, console_errors, shot, wait  # noqa: F401  (browser: the fixture)
from .test_browser import ended_page, log_in
from .test_start_form import tool_names

pytestmark = [pytest.mark.browser, pytest.mark.slow]


def test_staff_start_a_toolloop_from_its_form_with_a_site_tool_ticked(browser, live_server, admin_user, site):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select

    log_in(browser, live_server)
    browser.get(live_server.url + reverse("admin:aaa_runrecord_add") + "?algorithm=aaa.algos.SelfConsistency")
    wait(browser, lambda d: d.find_elements(By.NAME, "config__n"))
    # choosing ToolLoop shows its fields (the page's script asks for ?algorithm=...)
    Select(browser.find_element(By.ID, "id_algorithm")).select_by_value("aaa.algos.ToolLoop")
    wait(browser, lambda d: d.find_elements(By.NAME, "input__task"))
    assert not browser.find_elements(By.NAME, "config__n")
    boxes = {b.get_attribute("value"): b for b in browser.find_elements(By.NAME, "config__tools")}
    assert sorted(boxes) == ["deploy", "fetch", "lookup"]
    assert all(b.is_selected() for b in boxes.values())  # the site's tools, offered by default

    browser.find_element(By.NAME, "input__task").send_keys("Look up the admin, please.")
    turns = browser.find_element(By.NAME, "config__max_turns")
    turns.clear()
    turns.send_keys("3")
    for name in ("deploy", "fetch"):  # offer only lookup
        boxes[name].click()
    assert [n for n, b in boxes.items() if b.is_selected()] == ["lookup"]
    browser.find_element(By.NAME, "budget__model_calls").send_keys("5")
    shot(browser, "20-start-form-toolloop")
    browser.find_element(By.NAME, "_start").click()

    # the run's page, once the run has ended
    page = wait(browser, ended_page)
    run = RunRecord.objects.get()
    assert browser.current_url.endswith(reverse("admin:aaa_runrecord_change", args=(run.run_id,)))
    assert page["status"] == "completed · success"
    started = json.loads(EventRecord.objects.get(stream=run.run_id, type=RUN_STARTED).data)
    assert started["input"] == {"task": "Look up the admin, please."}
    assert started["config"]["max_turns"] == 3
    assert tool_names(started["config"]["tools"]) == ["lookup"]  # the ticked tool, and only it
    assert started["budget"] == {"model_calls": 5}
    assert run.owner == admin_user
    called = [
        json.loads(d)["name"]
        for d in EventRecord.objects.filter(stream=run.run_id, type=TOOL_REQUESTED).values_list("data", flat=True)
    ]
    assert called == ["lookup"]
    assert any('lookup(topic="admin")' in line for line in page["rows"])
    assert console_errors(browser) == []
    shot(browser, "21-run-started-from-the-form")
