"""The example site's chat page in a real browser (headless Chromium, tests/browser.py),
on the example site started as bin/serve starts it (migrate, the demo user, runserver;
SQLite, the in-process bus, live tokens on): a logged-in user starts a conversation,
sends two more messages, sees both replies written word by word (each reply's tokens
came over the event stream before its event), and answers the agent's question in the
form made from its JSON schema. The run's log says the same. Screenshots go to the
test's temporary directory (their paths are printed)."""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from tests.browser import browser, console_errors, wait  # noqa: F401  (browser: the fixture)
from tests.field.services import free_port, wait_port

pytestmark = [pytest.mark.browser, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]

#: the chat page's state, read in one script; null while the page is not (yet) there
#: (a navigation begun: the URL is the new page's before its document is)
READ = """
const root = document.getElementById("chat");
if (root === null || document.readyState === "loading") return null;
const order = Array.from(document.querySelectorAll("#chat-log li.chat-user, #chat-log li.chat-assistant"),
                         li => (li.classList.contains("chat-user") ? "user: " : "reply: ") + li.textContent);
const bubbles = Array.from(document.querySelectorAll("#chat-log li.chat-assistant"), li => ({
  text: li.textContent, final: li.dataset.final === "1", tokens: Number(li.dataset.tokens || 0),
  turn: li.dataset.turn || null, request: li.dataset.request || null}));
return {order, status: root.dataset.status || "", run: root.dataset.run || "", stream: root.dataset.stream || "",
        replies: bubbles.filter(b => b.final), live: bubbles.filter(b => !b.final),
        questions: Array.from(document.querySelectorAll("form.chat-question"), f => f.dataset.question),
        sendable: !document.getElementById("chat-send").disabled,
        error: document.getElementById("chat-error").textContent};
"""


class ExampleSite:
    """The example site on a scratch SQLite file, its web server runserver (bin/serve's)."""

    def __init__(self, tmp: Path) -> None:
        self.db = tmp / "site.sqlite3"
        clean = {k: v for k, v in os.environ.items() if not k.startswith(("DJANGO_", "AAA_"))}
        self.env = {
            **clean,
            "AAA_SQLITE_PATH": str(self.db),
            "AAA_STREAM_TOKENS": "1",
            "AAA_DEBUG": "1",
            "PYTHONUNBUFFERED": "1",
        }
        self.port = free_port()
        self.log = tmp / "runserver.log"
        self.proc: subprocess.Popen | None = None

    def manage(self, *args: str) -> None:
        done = subprocess.run(
            [sys.executable, "manage.py", *args], cwd=ROOT, env=self.env, capture_output=True, text=True, timeout=180
        )
        assert done.returncode == 0, done.stdout + done.stderr

    def __enter__(self) -> "ExampleSite":
        self.manage("migrate", "--noinput")
        self.manage("demo_user", "--username", "demo", "--password", "demo")
        with open(self.log, "w") as out:
            self.proc = subprocess.Popen(
                [sys.executable, "manage.py", "runserver", f"127.0.0.1:{self.port}", "--noreload"],
                cwd=ROOT,
                env=self.env,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        wait_port(self.port, proc=self.proc)
        return self

    def __exit__(self, *exc) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(15)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def events(self, run_id: str) -> list[tuple[str, dict]]:
        with sqlite3.connect(self.db) as db:
            rows = db.execute("SELECT type, data FROM aaa_event WHERE stream = ? ORDER BY seq", [run_id])
            return [(t, json.loads(d)) for t, d in rows]


def say(driver, text: str) -> None:
    from selenium.webdriver.common.by import By

    wait(driver, lambda d: (page := d.execute_script(READ)) is not None and page["sendable"])
    box = driver.find_element(By.ID, "chat-input")
    box.clear()
    box.send_keys(text)
    driver.find_element(By.ID, "chat-send").click()


def replies(n: int):
    """The page once it shows ``n`` replies and the run waits for the next message."""

    def check(driver):
        page = driver.execute_script(READ)
        return (
            page
            if page is not None and len(page["replies"]) == n and page["status"] == "waiting" and page["sendable"]
            else None
        )

    return check


def shot(driver, tmp: Path, name: str) -> Path:
    height = driver.execute_script("return document.documentElement.scrollHeight")
    driver.set_window_size(1280, min(max(int(height), 800), 4000))
    path = tmp / f"{name}.png"
    driver.save_screenshot(str(path))
    print(f"\nscreenshot: {path}")
    return path


def test_a_conversation_on_the_chat_page_streams_its_replies_and_answers_a_question(browser, tmp_path):  # noqa: F811
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select

    with ExampleSite(tmp_path) as site:
        browser.set_window_size(1280, 900)
        browser.get(site.url + "/chat/")
        wait(browser, lambda d: "/chat/login/" in d.current_url)
        browser.find_element(By.NAME, "username").send_keys("demo")
        browser.find_element(By.NAME, "password").send_keys("demo")
        browser.find_element(By.CSS_SELECTOR, "form button[type=submit]").click()
        wait(browser, lambda d: d.current_url.rstrip("/").endswith("/chat"))

        say(browser, "Hello!")  # starts the conversation
        first = wait(browser, replies(1))
        run_id = first["run"]
        assert first["stream"] == "open" and browser.current_url.endswith(f"?run={run_id}")

        say(browser, "Tell me about this site.")
        second = wait(browser, replies(2))
        reply = second["replies"][1]
        assert reply["text"].startswith("You said: \u201cTell me about this site.\u201d. This is turn 2")
        # written word by word: one token a word, all of them before the reply's event
        assert reply["tokens"] == len(reply["text"].split()) > 1
        shot(browser, tmp_path, "chat-01-two-replies")

        say(browser, "How many people live there?")
        (question,) = wait(browser, lambda d: (p := d.execute_script(READ)) is not None and p["questions"] or None)
        assert wait(browser, lambda d: (p := d.execute_script(READ)) is not None and p["status"] == "waiting")
        form = browser.find_element(By.CSS_SELECTOR, f'form.chat-question[data-question="{question}"]')
        assert "Which city do you mean" in form.text
        Select(form.find_element(By.NAME, "city")).select_by_visible_text("Porto")
        shot(browser, tmp_path, "chat-02-question-form")
        form.find_element(By.CSS_SELECTOR, "button[type=submit]").click()
        third = wait(browser, replies(3))
        reply = third["replies"][2]
        assert reply["text"] == "It has 231,800 inhabitants, by the demo's table."
        assert reply["tokens"] == len(reply["text"].split()) > 1
        assert third["questions"] == [] and third["live"] == []
        # each message, then its reply, in the log's order
        assert third["order"] == [
            "user: Hello!",
            "reply: " + third["replies"][0]["text"],
            "user: Tell me about this site.",
            "reply: " + third["replies"][1]["text"],
            "user: How many people live there?",
            "reply: " + third["replies"][2]["text"],
        ]
        assert (
            'Which city do you mean (for its population)? \u2014 you answered {"city":"Porto"}'
            in browser.find_element(By.ID, "chat-log").text
        )
        shot(browser, tmp_path, "chat-03-answered")
        assert console_errors(browser) == []

        log = site.events(run_id)
        sent = [d["content"] for t, d in log if t == "aaa.message.sent"]
        assert sent == [r["text"] for r in third["replies"]]
        assert [d["content"] for t, d in log if t == "aaa.message.received"] == [
            "Tell me about this site.",
            "How many people live there?",
        ]
        (answered,) = [d for t, d in log if t == "aaa.question.answered"]
        assert answered["answer"] == {"city": "Porto"} and answered["by"].startswith("demo (user ")
        assert log[-1][0] == "aaa.message.sent"
