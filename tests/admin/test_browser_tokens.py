"""Live tokens on the run page in a real browser (headless Chromium, ``tests/browser.py``):
while a run's model call streams from a local server speaking OpenAI's chunk format,
staff watching the run page see the reply as it is written, before the reply's
``aaa.llm.completed`` is in the log (the server holds the rest of the reply until the
test has seen the text on the page); once the run ends, the page shows the reply from
the log and listens no more."""

from __future__ import annotations

import json
import threading

import pytest

from aaa_django.algos import ToolLoop
from aaa_django.models import EventRecord
from aaa_django.runtime.event_types import LLM_COMPLETED, LLM_REQUESTED
from aaa_django.tools import ToolRegistry
from tests.llm.live import model_server, tokens_host  # noqa: F401  (fixtures)
from tests.llm.server import Reply
from tests.llm.streams import openai_stream

from ..browser import browser, console_errors, shot, wait  # noqa: F401  (browser: the fixture)
from .test_browser import ended_page, log_in, run_page

pytestmark = [pytest.mark.browser, pytest.mark.slow]

TEXTS = ["Deploying", " the web", " service", " now:", " all checks", " are green."]


#: the live reply as the browser shows it
READ_LIVE = """
const box = document.getElementById("aaa-live-reply");
const rows = Array.from(document.querySelectorAll("#aaa-rows tr.aaa-event"), r => r.innerText);
if (!box) return {box: false, rows};
return {box: true, state: box.dataset.state, request: box.dataset.request || null,
        shown: !box.hidden && box.getBoundingClientRect().height > 0,
        text: document.getElementById("aaa-live-text").textContent, rows};
"""


def test_staff_watch_a_models_reply_as_it_is_written(browser, live_server, admin_user, model_server, tokens_host):
    listening, seen = threading.Event(), threading.Event()
    # the first text once the page listens; the last once the test has seen the others
    model_server.script(Reply(parts=openai_stream(TEXTS), holds={1: listening, len(TEXTS): seen}, hold_seconds=60))
    log_in(browser, live_server)
    run_id = tokens_host.call(
        lambda e: e.start(ToolLoop(ToolRegistry([])), {"task": "Deploy the web service"}, owner=str(admin_user.pk))
    ).run_id

    browser.get(run_page(live_server, run_id))
    page = wait(browser, lambda d: (p := d.execute_script(READ_LIVE))["box"] and p["state"] == "open" and p)
    assert not page["shown"]  # nothing to show yet
    listening.set()
    written = "".join(TEXTS[:-1])
    page = wait(browser, lambda d: (p := d.execute_script(READ_LIVE))["text"] == written and p)
    # shown while the reply is not whole: its event is not in the log, nor on the page
    assert page["shown"]
    assert page["request"] == EventRecord.objects.get(stream=run_id, type=LLM_REQUESTED).id
    assert not EventRecord.objects.filter(stream=run_id, type=LLM_COMPLETED).exists()
    assert not any(LLM_COMPLETED in row for row in page["rows"])
    shot(browser, "13-run-page-live-tokens")
    seen.set()

    # the run ends: the page reloads, shows the reply from the log, listens no more
    ended = wait(browser, ended_page)
    assert ended["status"] == "completed · success"
    assert any(LLM_COMPLETED in row for row in ended["rows"])
    assert not browser.execute_script(READ_LIVE)["box"]
    reply = json.loads(EventRecord.objects.get(stream=run_id, type=LLM_COMPLETED).data)
    assert reply["response"]["message"]["content"] == "".join(TEXTS)
    assert console_errors(browser) == []
