"""Acting on many runs from the run list in a real browser (headless Chromium, see
``tests/browser.py``): filter, select all across the pages, an action, its
confirmation page."""

from __future__ import annotations

import pytest
from django.urls import reverse

from aaa_django.admin.runs import RunAdmin
from aaa_django.models import EventRecord, RunRecord
from aaa_django.runtime.event_types import CANCEL_REQUESTED

from ..browser import browser, console_errors, shot, wait  # noqa: F401  (browser: the fixture)
from .test_browser import log_in
from .test_bulk import ended, gated

pytestmark = [pytest.mark.browser, pytest.mark.slow]


def test_staff_cancel_every_toolloop_run_of_the_past_hour_in_one_action(
    browser, live_server, admin_user, site, monkeypatch
):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select

    monkeypatch.setattr(RunAdmin, "list_per_page", 2)  # three runs: two pages
    runs = gated(site, 3)
    log_in(browser, live_server)
    browser.get(live_server.url + reverse("admin:aaa_runrecord_changelist") + "?algorithm=aaa.algos.ToolLoop")
    browser.find_element(By.LINK_TEXT, "Past hour").click()
    wait(browser, lambda d: "started_at__gte" in d.current_url)

    browser.find_element(By.ID, "action-toggle").click()  # this page's runs
    browser.find_element(By.CSS_SELECTOR, ".actions .question a").click()  # "Select all 3 runs"
    wait(browser, lambda d: d.find_element(By.CSS_SELECTOR, ".actions .all").is_displayed())
    assert "All 3 selected" in browser.find_element(By.CSS_SELECTOR, ".actions .all").text
    Select(browser.find_element(By.NAME, "action")).select_by_value("cancel_selected")
    browser.find_element(By.CSS_SELECTOR, ".actions button[name=index]").click()

    wait(browser, lambda d: d.find_elements(By.ID, "aaa-bulk"))
    assert browser.find_element(By.TAG_NAME, "h1").text == "Cancel 3 runs?"
    listed = [a.text for a in browser.find_elements(By.CSS_SELECTOR, ".aaa-bulk-runs a")]
    assert sorted(listed) == sorted(runs)
    browser.find_element(By.ID, "aaa-reason").send_keys("bad release")
    shot(browser, "22-bulk-cancel-confirmation")
    browser.find_element(By.ID, "aaa-confirm-bulk").click()

    wait(browser, lambda d: "Cancellation requested for 3 runs." in d.page_source)
    assert "started_at__gte" in browser.current_url  # back to the list as it was filtered
    assert {r: ended(r) for r in runs} == dict.fromkeys(runs, "cancelled")
    assert EventRecord.objects.filter(type=CANCEL_REQUESTED).count() == 3
    assert set(RunRecord.objects.values_list("outcome", flat=True)) == {"cancelled"}
    assert console_errors(browser) == []
    shot(browser, "23-bulk-cancel-done")
