"""The admin in a real browser: headless Chromium (Debian's chromium and
chromium-driver) driven by Selenium against pytest-django's live server
(``tests/browser.py``; screenshots in ``artifacts/screenshots/``)."""

from __future__ import annotations

import pytest
from django.contrib.admin.utils import quote
from django.urls import reverse

from aaa_django.models import EventRecord
from aaa_django.runtime.event_types import APPROVAL_REQUESTED, TOOL_REQUESTED

from ..browser import browser, console_errors, shot, wait  # noqa: F401  (browser: the fixture)

pytestmark = [pytest.mark.browser, pytest.mark.slow]


def log_in(driver, live_server, username: str = "admin", password: str = "password") -> None:
    from selenium.webdriver.common.by import By

    driver.get(live_server.url + reverse("admin:login"))
    driver.find_element(By.NAME, "username").send_keys(username)
    driver.find_element(By.NAME, "password").send_keys(password)
    driver.find_element(By.CSS_SELECTOR, "input[type=submit]").click()
    wait(driver, lambda d: "Site administration" in d.page_source or "Log out" in d.page_source)


def run_page(live_server, run_id: str) -> str:
    return live_server.url + reverse("admin:aaa_runrecord_change", args=(quote(run_id),))


#: the run page as the browser shows it, read in one script: no element reference is
#: kept that a poll or a reload could make stale between two WebDriver calls
READ_RUN_PAGE = """
const status = document.getElementById("aaa-status");
return {
  ready: document.readyState === "complete",
  status: status ? status.textContent.trim() : "",
  polled_rows: document.querySelectorAll("#aaa-rows tr.aaa-new").length,
  rows: Array.from(document.querySelectorAll("#aaa-rows tr.aaa-event"), r => r.innerText),
  approvals: Array.from(document.querySelectorAll(".aaa-approval"), a => a.innerText),
  live_polls: performance.getEntriesByType("resource")
    .filter(e => e.name.includes("/live/?")).length,
  live_reply: !!document.getElementById("aaa-live-reply"),
  token_requests: performance.getEntriesByType("resource")
    .filter(e => e.name.includes("/tokens/")).length,
};
"""


def read_run_page(driver) -> dict:
    return driver.execute_script(READ_RUN_PAGE)


def ended_page(driver) -> dict | None:
    """The run page once the run has ended and the page shows it as the server renders
    it: live.js reloads the page when the run ends, and rows it appended while polling
    (``aaa-new``) are gone from the reloaded page; a page rendered after the end has none."""
    page = read_run_page(driver)
    ended = page["ready"] and page["status"].startswith("completed") and not page["polled_rows"]
    return page if ended else None


def status_text(driver) -> str:
    """The run's status badge ("" while the page is being replaced)."""
    from selenium.common.exceptions import NoSuchElementException, StaleElementReferenceException
    from selenium.webdriver.common.by import By

    try:
        return driver.find_element(By.ID, "aaa-status").text
    except (NoSuchElementException, StaleElementReferenceException):
        return ""


def test_staff_read_a_finished_toolloop_run(browser, live_server, admin_user, finished_run):
    from selenium.webdriver.common.by import By

    log_in(browser, live_server)
    # the run list
    browser.get(live_server.url + reverse("admin:aaa_runrecord_changelist"))
    assert finished_run in browser.page_source
    shot(browser, "01-run-list", width=1900)  # every column, beside the admin's sidebar

    # the run page: summary and timeline
    browser.find_element(By.CSS_SELECTOR, f'#result_list a[title="{finished_run}"]').click()
    wait(browser, lambda d: d.find_elements(By.ID, "timeline"))
    assert status_text(browser) == "completed · success"
    rows = browser.find_elements(By.CSS_SELECTOR, "#aaa-rows tr.aaa-event")
    assert len(rows) == EventRecord.objects.filter(stream=finished_run).count()
    lines = [r.find_element(By.CSS_SELECTOR, ".aaa-summary-line").text for r in rows]
    assert lines[0].startswith("aaa.algos.ToolLoop started")
    assert any(line.startswith('lookup(topic="admin")') for line in lines)
    assert lines[-1].startswith("ended success: Done after 1 tool call")
    assert browser.find_elements(By.CSS_SELECTOR, "#aaa-rows tr.aaa-claimed a.aaa-hydrate")
    shot(browser, "02-run-page-finished")

    # a projection as of an earlier event: the tool was asked for, not answered yet
    tool_seq = EventRecord.objects.get(stream=finished_run, type=TOOL_REQUESTED).seq
    row = browser.find_element(By.ID, f"e{tool_seq}")
    row.find_element(By.LINK_TEXT, "state here").click()
    wait(browser, lambda d: f"Projections as of event {tool_seq}" in d.page_source)
    loop = browser.find_element(By.CSS_SELECTOR, 'details[data-name="aaa.algos.loops.LOOP"]')
    assert f"state as of event {tool_seq}" in loop.text
    state = loop.find_element(By.CSS_SELECTOR, "pre").text
    assert '"turns": 1' in state and '"results": {}' in state and '"name": "lookup"' in state
    browser.execute_script("arguments[0].scrollIntoView()", loop)
    shot(browser, "03-projection-as-of-event")

    # preview a blob (verified)
    browser.get(run_page(live_server, finished_run) + "#blobs")
    browser.find_element(By.CSS_SELECTOR, "#blobs a.aaa-preview-link").click()
    wait(browser, lambda d: d.find_elements(By.ID, "aaa-preview"))
    assert "verified" in browser.find_element(By.ID, "aaa-verification").text
    assert "fact-59" in browser.find_element(By.ID, "aaa-preview").text
    shot(browser, "04-blob-preview")


def test_staff_approve_a_live_run_and_watch_it_finish(browser, live_server, admin_user, gated_run):
    from selenium.webdriver.common.by import By

    log_in(browser, live_server)
    browser.get(run_page(live_server, gated_run))
    wait(browser, lambda d: d.find_elements(By.CSS_SELECTOR, ".aaa-approval"))
    page = read_run_page(browser)
    assert page["status"] == "running"
    (approval,) = page["approvals"]
    assert "deploy" in approval and '"service": "web"' in approval
    # while the run waits the page polls, and leaves the actions panel alone (a
    # replaced panel would lose what staff are typing or pointing at)
    browser.execute_script("document.getElementById('aaa-actions').dataset.seen = 'yes'")
    polls = page["live_polls"]
    wait(browser, lambda d: read_run_page(d)["live_polls"] >= polls + 2)
    assert browser.execute_script("return document.getElementById('aaa-actions').dataset.seen") == "yes"
    # live tokens are off on this site: the page neither shows nor asks for them
    page = read_run_page(browser)
    assert not page["live_reply"] and page["token_requests"] == 0
    assert console_errors(browser) == []
    shot(browser, "05-live-run-waiting-for-approval")

    def approve(d) -> bool:  # elements found afresh on every try
        form = d.find_element(By.CSS_SELECTOR, ".aaa-approval form")
        reason = form.find_element(By.NAME, "reason")
        reason.send_keys("ship it")
        assert reason.get_attribute("value") == "ship it"
        form.find_element(By.CSS_SELECTOR, "button.aaa-approve").click()
        return True

    wait(browser, approve, retry_stale=True)
    wait(browser, lambda d: "Approved." in d.page_source)
    # the deployment takes a moment: the page shows the run still running, then
    # updates itself (polling) until the run has ended, and reloads once
    page = wait(browser, ended_page)
    assert page["status"] == "completed · success"
    lines = page["rows"]
    assert any("deploy approved by admin" in line and "ship it" in line for line in lines)
    assert any("deploy → deployed web" in line for line in lines)
    assert "ended success" in lines[-1]
    assert page["approvals"] == []
    shot(browser, "06-live-run-finished")


def test_a_live_page_updates_itself_when_someone_else_acts(browser, live_server, admin_user, gated_run, site):
    """Approved elsewhere (the API, another admin): the open page follows on its own."""
    from selenium.webdriver.common.by import By

    log_in(browser, live_server)
    browser.get(run_page(live_server, gated_run))
    wait(browser, lambda d: d.find_elements(By.CSS_SELECTOR, ".aaa-approval"))
    before = len(read_run_page(browser)["rows"])
    request_id = EventRecord.objects.get(stream=gated_run, type=APPROVAL_REQUESTED).id
    assert site.call(lambda e: e.approve(gated_run, request_id, by="someone else"))
    # new rows arrive by polling while the tool runs (no reload yet)
    page = wait(browser, lambda d: (p := read_run_page(d))["polled_rows"] and p)
    assert any("approved by someone else" in row for row in page["rows"])
    page = wait(browser, ended_page)
    assert page["status"] == "completed · success"
    assert len(page["rows"]) > before
