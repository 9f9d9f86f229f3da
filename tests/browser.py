"""Headless Chromium for the browser tests (Debian's chromium and chromium-driver,
driven by Selenium against pytest-django's live server).

``browser``: a fresh Chromium (a fixture, see tests/conftest.py); ``shot`` saves a
whole-page screenshot under ``artifacts/screenshots/`` (git-ignored; CI keeps the
folder as the run's artefacts); ``wait`` waits for a condition. Without Chromium the
tests skip on a developer's machine and fail under bin/test and CI
(``require_service``).
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from .conftest import require_service

SCREENSHOTS = Path(__file__).resolve().parents[1] / "artifacts" / "screenshots"
CHROMIUM = os.environ.get("AAA_CHROMIUM", "/usr/bin/chromium")
CHROMEDRIVER = os.environ.get("AAA_CHROMEDRIVER", "/usr/bin/chromedriver")
# The flags NOTES.md lists for Chromium on these machines (no network, no sandbox).
FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-dev-shm-usage",
    "--window-size=1440,1100",
)
WAIT = 20


def have_chromium() -> bool:
    found = all(shutil.which(p) or Path(p).is_file() for p in (CHROMIUM, CHROMEDRIVER))
    try:
        import selenium  # noqa: F401
    except ImportError:
        return False
    return found


@pytest.fixture
def browser(tmp_path):
    require_service("chromium", have_chromium())
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in FLAGS:
        options.add_argument(flag)
    options.add_argument(f"--user-data-dir={tmp_path / 'chromium-profile'}")
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})  # console_errors
    driver = webdriver.Chrome(service=Service(executable_path=CHROMEDRIVER), options=options)
    driver.set_page_load_timeout(WAIT)
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    try:
        yield driver
    finally:
        driver.quit()


def console_errors(driver) -> list[str]:
    """What the page wrote to the console as errors (a script's exception, a failed
    request) since the last call; not the browser's own look for a /favicon.ico (the
    test site has none)."""
    return [
        e["message"]
        for e in driver.get_log("browser")
        if e["level"] == "SEVERE" and "/favicon.ico " not in e["message"]
    ]


def shot(driver, name: str, width: int = 1440) -> Path:
    path = SCREENSHOTS / f"{name}.png"
    # The whole page, not only the window: grow the window to the document's height.
    driver.set_window_size(width, 1100)
    height = driver.execute_script("return document.documentElement.scrollHeight")
    driver.set_window_size(width, min(max(int(height), 900), 6000))
    driver.save_screenshot(str(path))
    driver.set_window_size(1440, 1100)
    return path


def wait(driver, condition, timeout: float = WAIT, *, retry_stale: bool = False):
    """``condition(driver)`` once it is truthy. ``retry_stale``: a condition that finds
    its elements itself is tried again when one went stale (the live page replaces its
    actions panel when the run changes, and reloads itself when the run ends)."""
    from selenium.common.exceptions import StaleElementReferenceException
    from selenium.webdriver.support.ui import WebDriverWait

    ignored = (StaleElementReferenceException,) if retry_stale else ()
    return WebDriverWait(driver, timeout, poll_frequency=0.1, ignored_exceptions=ignored).until(condition)
