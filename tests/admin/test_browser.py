"""The admin in a real browser: headless Chromium (Debian's chromium and
chromium-driver) driven by Selenium against pytest-django's live server.

Screenshots go to ``artifacts/screenshots/`` (git-ignored; CI keeps them as
artefacts). Without Chromium these tests skip on a developer's machine and fail under
bin/test and CI (``require_service``).
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest
from django.contrib.admin.utils import quote
from django.urls import reverse

from aaa_django.models import EventRecord
from aaa_django.runtime import types as T

from ..conftest import require_service

SCREENSHOTS = Path(__file__).resolve().parents[2] / "artifacts" / "screenshots"
CHROMIUM = os.environ.get("AAA_CHROMIUM", "/usr/bin/chromium")
CHROMEDRIVER = os.environ.get("AAA_CHROMEDRIVER", "/usr/bin/chromedriver")
# The flags NOTES.md lists for Chromium on these machines (no network, no sandbox).
FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--disable-dev-shm-usage", "--window-size=1440,1100")
WAIT = 20

pytestmark = [pytest.mark.browser, pytest.mark.slow]


def _have_chromium() -> bool:
    found = all(shutil.which(p) or Path(p).is_file() for p in (CHROMIUM, CHROMEDRIVER))
    try:
        import selenium  # noqa: F401
    except ImportError:
        return False
    return found


@pytest.fixture
def browser(tmp_path):
    require_service("chromium", _have_chromium())
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in FLAGS:
        options.add_argument(flag)
    options.add_argument(f"--user-data-dir={tmp_path / 'chromium-profile'}")
    driver = webdriver.Chrome(service=Service(executable_path=CHROMEDRIVER), options=options)
    driver.set_page_load_timeout(WAIT)
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    try:
        yield driver
    finally:
        driver.quit()


def shot(driver, name: str, width: int = 1440) -> Path:
    path = SCREENSHOTS / f"{name}.png"
    # The whole page, not only the window: grow the window to the document's height.
    driver.set_window_size(width, 1100)
    height = driver.execute_script("return document.documentElement.scrollHeight")
    driver.set_window_size(width, min(max(int(height), 900), 6000))
    driver.save_screenshot(str(path))
    driver.set_window_size(1440, 1100)
    return path


def wait(driver, condition, timeout: float = WAIT):
    from selenium.webdriver.support.ui import WebDriverWait

    return WebDriverWait(driver, timeout, poll_frequency=0.1).until(condition)


def log_in(driver, live_server, username: str = "admin", password: str = "password") -> None:
    from selenium.webdriver.common.by import By

    driver.get(live_server.url + reverse("admin:login"))
    driver.find_element(By.NAME, "username").send_keys(username)
    driver.find_element(By.NAME, "password").send_keys(password)
    driver.find_element(By.CSS_SELECTOR, "input[type=submit]").click()
    wait(driver, lambda d: "Site administration" in d.page_source or "Log out" in d.page_source)


def run_page(live_server, run_id: str) -> str:
    return live_server.url + reverse("admin:aaa_runrecord_change", args=(quote(run_id),))


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
    tool_seq = EventRecord.objects.get(stream=finished_run, type=T.TOOL_REQUESTED).seq
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
    assert status_text(browser) == "running"
    approval = browser.find_element(By.CSS_SELECTOR, ".aaa-approval")
    assert "deploy" in approval.text and '"service": "web"' in approval.text
    shot(browser, "05-live-run-waiting-for-approval")

    approval.find_element(By.NAME, "reason").send_keys("ship it")
    approval.find_element(By.CSS_SELECTOR, "button.aaa-approve").click()
    wait(browser, lambda d: "Approved." in d.page_source)
    # the deployment takes a moment: the page shows the run still running, then
    # updates itself (polling) until the run has ended
    wait(browser, lambda d: status_text(d) == "completed · success")
    rows = browser.find_elements(By.CSS_SELECTOR, "#aaa-rows tr.aaa-event")
    lines = [r.text for r in rows]
    assert any("deploy approved by admin" in line and "ship it" in line for line in lines)
    assert any("deploy → deployed web" in line for line in lines)
    assert "ended success" in lines[-1]
    assert not browser.find_elements(By.CSS_SELECTOR, ".aaa-approval")
    shot(browser, "06-live-run-finished")


def test_a_live_page_updates_itself_when_someone_else_acts(browser, live_server, admin_user,
                                                          gated_run, site):
    """Approved elsewhere (the API, another admin): the open page follows on its own."""
    from selenium.webdriver.common.by import By

    log_in(browser, live_server)
    browser.get(run_page(live_server, gated_run))
    wait(browser, lambda d: d.find_elements(By.CSS_SELECTOR, ".aaa-approval"))
    before = len(browser.find_elements(By.CSS_SELECTOR, "#aaa-rows tr.aaa-event"))
    request_id = EventRecord.objects.get(stream=gated_run, type=T.APPROVAL_REQUESTED).id
    assert site.call(lambda e: e.approve(gated_run, request_id, by="someone else"))
    # new rows arrive by polling while the tool runs (no reload yet)
    wait(browser, lambda d: d.find_elements(By.CSS_SELECTOR, "#aaa-rows tr.aaa-new"))
    assert "approved by someone else" in browser.find_element(By.ID, "aaa-rows").text
    wait(browser, lambda d: status_text(d) == "completed · success")
    after = len(browser.find_elements(By.CSS_SELECTOR, "#aaa-rows tr.aaa-event"))
    assert after > before
