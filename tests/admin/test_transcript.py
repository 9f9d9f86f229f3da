"""A conversation in the admin: its transcript (each turn's message, tool calls, the
question with its answer, the reply; model calls, tokens and cost per turn), and the
form that answers a pending question, for the owner or staff with ``aaa.answer_run``:
an answer that does not fit the schema is refused with the errors and not recorded."""

from __future__ import annotations

import re

import pytest
from django.contrib.auth.models import Permission

from aaa_django.algos import ToolLoop
from aaa_django.models import EventRecord
from aaa_django.runtime.event_types import LLM_COMPLETED, QUESTION_ANSWERED
from aaa_django.site.host import EngineHost
from aaa_django.tools import ToolRegistry
from tests.conversations import site as talk

from .conftest import make_staff
from .support import wait_until

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def talk_host(transactional_db, settings):
    settings.AAA = {
        **settings.AAA,
        "LLM_CLIENT": "tests.conversations.site.model",
        "TOOLS": ["tests.conversations.site.choose_city"],
        "API_RATE": None,
    }
    EngineHost.reset()
    yield EngineHost.get()
    talk.GATE.set()
    EngineHost.reset()


def conversation_with_a_question(host, owner) -> str:
    """Turn 1 answered, turn 2 ("which city?") waiting for its question's answer."""
    registry = ToolRegistry([talk.choose_city])

    async def go(engine):
        run = await engine.start(ToolLoop(registry), {"task": "hello"}, conversation=True, owner=str(owner.pk))
        await run.waiting(timeout=10)
        await run.say("which city?", by="alice")
        await run.waiting(timeout=10)
        return run.run_id

    return host.call(go)


def page(client, run_id):
    r = client.get(f"/admin/aaa/runrecord/{run_id}/transcript/")
    assert r.status_code == 200
    return r.content.decode()


def test_the_transcript_shows_each_turn_and_staff_with_the_permission_answer(client, talk_host, django_user_model):
    owner = make_staff(django_user_model, "owner", "view_runrecord")
    answerer = make_staff(django_user_model, "answerer", "view_runrecord", "view_all_runs", "answer_run")
    viewer = make_staff(django_user_model, "viewer", "view_runrecord", "view_all_runs")
    run_id = conversation_with_a_question(talk_host, owner)

    client.force_login(viewer)
    html = page(client, run_id)
    assert html.count('class="module aaa-turn"') == 2
    assert "hello" in html and "heard &#x27;hello&#x27; (1 messages)" in html
    assert "Which city? (two are known)" in html and 'data-status="pending"' in html
    assert "choose_city" in html
    # spend per turn: the log's model calls, tokens and cost of each turn
    replies = [
        EventRecord.objects.get(pk=e.pk)
        for e in EventRecord.objects.filter(stream=run_id, type=LLM_COMPLETED).order_by("seq")
    ]
    spends = re.findall(r'aaa-turn-spend">(\d+) model calls? · (\d+) tokens', html)
    assert spends == [("1", str(_tokens(replies[0]))), ("1", str(_tokens(replies[1])))]
    assert "aaa-answer-form" not in html  # no permission: no form
    r = client.post(f"/admin/aaa/runrecord/{run_id}/answer/", {"question_id": "x", "answer": "1"})
    assert r.status_code == 403

    client.force_login(answerer)
    html = page(client, run_id)
    (qid,) = re.findall(r'name="question_id" value="([^"]+)"', html)
    r = client.post(
        f"/admin/aaa/runrecord/{run_id}/answer/", {"question_id": qid, "answer": '{"city": "Paris"}'}, follow=True
    )
    text = r.content.decode()
    assert "Not recorded: the answer does not fit the question&#x27;s schema" in text
    assert "city: &#x27;Paris&#x27; is not one of [&#x27;Lyon&#x27;, &#x27;Porto&#x27;]" in text
    assert not EventRecord.objects.filter(stream=run_id, type=QUESTION_ANSWERED).exists()
    r = client.post(
        f"/admin/aaa/runrecord/{run_id}/answer/", {"question_id": qid, "answer": '{"city": "Lyon"}'}, follow=True
    )
    assert "Answered: the run goes on." in r.content.decode()
    wait_until(lambda: "you chose" in page(client, run_id))
    html = page(client, run_id)
    assert 'data-status="answered"' in html and "answered by answerer (user" in html
    assert "you chose {&quot;city&quot;: &quot;Lyon&quot;}" in html


def _tokens(event):
    import json

    usage = json.loads(event.data)["usage"]
    return usage["input_tokens"] + usage["output_tokens"]


def test_the_run_page_links_its_transcript_and_says_it_waits(client, talk_host, django_user_model):
    owner = make_staff(django_user_model, "owner", "view_runrecord")
    owner.user_permissions.add(Permission.objects.get(codename="add_runrecord"))
    run_id = conversation_with_a_question(talk_host, owner)
    client.force_login(owner)
    html = client.get(f"/admin/aaa/runrecord/{run_id}/change/").content.decode()
    assert f"/admin/aaa/runrecord/{run_id}/transcript/" in html and "Transcript (waiting)" in html
    assert 'class="aaa-badge aaa-waiting"' in html
    # the owner answers from the transcript without any permission
    assert "aaa-answer-form" in page(client, run_id)
