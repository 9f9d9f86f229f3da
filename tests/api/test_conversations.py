"""Conversations and questions over the REST API, on the process's engine host (the
in-process bus, SQLite): a conversation started with ``"conversation": true`` waits
after each reply (status ``waiting``), takes the owner's next message and answers it
with the whole conversation sent as deltas; refuses what it cannot take with the
reason; closes; ends idle; a tool's question is answered, refused, or expires; and a
conversation is exported and imported as any run is."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import Permission

from aaa_django.runtime.event_types import (
    LLM_REQUESTED,
    MESSAGE_RECEIVED,
    MESSAGE_SENT,
    QUESTION_ASKED,
)
from aaa_django.site.host import EngineHost
from aaa_django.store import DjangoEventStore, runindex
from tests.conversations import site

from .conftest import _user, wait_for, wait_until

pytestmark = pytest.mark.django_db(transaction=True)

TOOLLOOP = "aaa.algos.ToolLoop"


@pytest.fixture
def talk_host(transactional_db, settings):
    """The engine host, its model the scripted one of tests/conversations/site.py."""
    settings.AAA = {
        **settings.AAA,
        "LLM_CLIENT": "tests.conversations.site.model",
        "TOOLS": ["tests.conversations.site.choose_city"],
    }
    site.REQUESTS.clear()
    site.GATE.clear()
    EngineHost.reset()
    yield EngineHost.get()
    site.GATE.set()
    EngineHost.reset()


def start(api, user, task="one", **extra):
    body = {
        "algorithm": TOOLLOOP,
        "input": {"task": task},
        "config": {"system": "Be brief."},
        "conversation": True,
        **extra,
    }
    r = api.post("/runs", json=body, headers=user.auth)
    assert r.status_code == 201, r.json()
    return r.json()


def say(api, user, run_id, content, **headers):
    return api.post(f"/runs/{run_id}/messages", json={"content": content}, headers={**user.auth, **headers})


def of_type(run_id, type):
    return [e for e in DjangoEventStore().read_sync(run_id) if e.type == type]


def test_three_messages_the_third_request_carries_the_whole_conversation_as_deltas(api, alice, talk_host):
    run = start(api, alice)
    assert run["conversation"] == {"idle": 3600} and run["links"]["close"].endswith("/close")
    run_id = run["id"]
    waiting = wait_for(api, run_id, alice.auth, status="waiting")
    assert waiting["outcome"] is None
    for content in ("two", "three"):
        r = say(api, alice, run_id, content)
        assert r.status_code == 201, r.json()
        assert r.json()["message"]["content"] == content
        assert r.json()["status"] in ("running", "waiting")  # (the scripted model is quick)
        wait_for(api, run_id, alice.auth, status="waiting")

    # the model got the whole conversation with the third request
    assert len(site.REQUESTS) == 3
    assert [(m.role, m.content) for m in site.REQUESTS[2].messages] == [
        ("system", "Be brief."),
        ("user", "one"),
        ("assistant", "heard 'one' (2 messages)"),
        ("user", "two"),
        ("assistant", "heard 'two' (4 messages)"),
        ("user", "three"),
    ]
    # the log holds each message once: every request carries only what is new
    deltas = [[(m["role"], m["content"]) for m in e.data["messages"]] for e in of_type(run_id, LLM_REQUESTED)]
    assert deltas == [[("system", "Be brief."), ("user", "one")], [("user", "two")], [("user", "three")]]
    assert [e.data["by"] for e in of_type(run_id, MESSAGE_RECEIVED)] == [alice_label(alice)] * 2

    transcript = api.get(f"/runs/{run_id}/messages", headers=alice.auth).json()
    assert transcript["conversation"] and transcript["status"] == "waiting"
    assert [(m["role"], m["turn"], m["content"]) for m in transcript["items"]] == [
        ("user", 1, "one"),
        ("assistant", 1, "heard 'one' (2 messages)"),
        ("user", 2, "two"),
        ("assistant", 2, "heard 'two' (4 messages)"),
        ("user", 3, "three"),
        ("assistant", 3, "heard 'three' (6 messages)"),
    ]
    listed = api.get("/runs?status=waiting", headers=alice.auth).json()
    assert [r["id"] for r in listed["items"]] == [run_id]


def alice_label(user):
    """Who a user's API key says the user is (``Principal.label``)."""
    return f"{user.get_username()} (user {user.pk}, key {user.key[:12]})"


def test_a_message_to_a_run_that_is_not_waiting_is_a_409_with_the_reason(api, alice, bob, talk_host):
    run_id = start(api, alice, task="wait for it")["id"]
    wait_until(lambda: site.REQUESTS)  # the model is answering
    r = say(api, alice, run_id, "hello?")
    assert r.status_code == 409, r.json()
    (error,) = r.json()["detail"]
    assert error["type"] == "not_waiting" and error["loc"] == ["path", "run_id"]
    assert "it is answering" in error["msg"]
    site.GATE.set()
    wait_for(api, run_id, alice.auth, status="waiting")
    assert not of_type(run_id, MESSAGE_RECEIVED)

    # not the owner: another user does not see it (404); bad input is a 422 with the field
    assert say(api, bob, run_id, "hi").status_code == 404
    empty = say(api, alice, run_id, "")
    assert empty.status_code == 422 and empty.json()["detail"][0]["loc"] == ["body", "payload", "content"]
    wrong = api.post(f"/runs/{run_id}/messages", json={"content": 3}, headers=alice.auth)
    assert wrong.status_code == 422
    extra = api.post(f"/runs/{run_id}/messages", json={"content": "x", "role": "system"}, headers=alice.auth)
    assert extra.status_code == 422

    # a run that is no conversation never waits for a message
    plain = api.post("/runs", json={"algorithm": TOOLLOOP, "input": {"task": "once"}}, headers=alice.auth)
    done = wait_for(api, plain.json()["id"], alice.auth)
    assert done["outcome"] == "success"
    r = say(api, alice, plain.json()["id"], "and then?")
    assert r.status_code == 409 and r.json()["detail"][0]["type"] == "ended"


def test_the_same_idempotency_key_gives_the_same_message_another_content_is_a_409(api, alice, talk_host):
    run_id = start(api, alice)["id"]
    wait_for(api, run_id, alice.auth, status="waiting")
    first = say(api, alice, run_id, "two", **{"Idempotency-Key": "k-1"})
    assert first.status_code == 201
    again = say(api, alice, run_id, "two", **{"Idempotency-Key": "k-1"})
    assert again.status_code == 200 and again["Idempotent-Replayed"] == "true"
    assert again.json()["message"]["seq"] == first.json()["message"]["seq"]
    other = say(api, alice, run_id, "something else", **{"Idempotency-Key": "k-1"})
    assert other.status_code == 409 and other.json()["detail"][0]["loc"] == ["header", "Idempotency-Key"]
    wait_for(api, run_id, alice.auth, status="waiting")
    assert len(of_type(run_id, MESSAGE_RECEIVED)) == 1 and len(site.REQUESTS) == 2


def test_close_ends_the_conversation_success_with_its_last_reply(api, alice, talk_host):
    run_id = start(api, alice)["id"]
    wait_for(api, run_id, alice.auth, status="waiting")
    r = api.post(f"/runs/{run_id}/close", headers=alice.auth)
    assert r.status_code == 202, r.json()
    done = wait_for(api, run_id, alice.auth)
    assert done["outcome"] == "success"
    assert done["value"] == {"text": "heard 'one' (2 messages)", "turns": 1, "closed_by": alice_label(alice)}
    again = api.post(f"/runs/{run_id}/close", headers=alice.auth)
    assert again.status_code == 409 and again.json()["detail"][0]["type"] == "ended"
    r = say(api, alice, run_id, "still there?")
    assert r.status_code == 409


def test_a_conversation_nobody_answers_ends_at_its_idle_timeout(api, alice, talk_host):
    run_id = start(api, alice, conversation={"idle": 0.5})["id"]
    done = wait_for(api, run_id, alice.auth)
    assert done["outcome"] == "timeout"
    assert done["value"] == {"reason": "idle", "idle": 0.5, "turns": 1}
    assert len(of_type(run_id, MESSAGE_SENT)) == 1


def test_a_message_past_the_budget_is_refused_with_the_reason(api, alice, talk_host):
    run_id = start(api, alice, budget={"model_calls": 1})["id"]
    wait_for(api, run_id, alice.auth, status="waiting")
    r = say(api, alice, run_id, "two")
    assert r.status_code == 409
    (error,) = r.json()["detail"]
    assert error["type"] == "over_budget"
    assert error["msg"] == "the conversation's budget is spent: model_calls 1 of 1; close it or start another"
    assert api.get(f"/runs/{run_id}", headers=alice.auth).json()["status"] == "waiting"


def test_an_algorithm_that_holds_no_conversation_is_a_422_that_names_those_that_do(api, alice, talk_host):
    r = api.post(
        "/runs", json={"algorithm": "tests.api.echo", "input": {"text": "hi"}, "conversation": True}, headers=alice.auth
    )
    assert r.status_code == 422
    (error,) = r.json()["detail"]
    assert error["loc"] == ["body", "conversation"] and error["type"] == "not_conversational"
    assert "aaa.algos.ToolLoop" in error["msg"] and "aaa.algos.PydanticAIAgent" in error["msg"]
    bad = api.post(
        "/runs", json={"algorithm": TOOLLOOP, "input": {"task": "x"}, "conversation": {"idle": -1}}, headers=alice.auth
    )
    assert bad.status_code == 422
    assert api.get("/runs", headers=alice.auth).json()["count"] == 0


def pending_question(api, user, run_id):
    def check():
        return [q for q in api.get(f"/runs/{run_id}/questions", headers=user.auth).json() if q["status"] == "pending"]

    return wait_until(check)


def test_a_question_is_answered_and_a_bad_answer_refused_with_the_errors(api, alice, carol, talk_host):
    run_id = start(api, alice)["id"]
    wait_for(api, run_id, alice.auth, status="waiting")
    assert say(api, alice, run_id, "which city?").status_code == 201
    (question,) = pending_question(api, alice, run_id)
    assert question["question"] == "Which city? (two are known)" and question["schema"] == site.CITY
    assert question["turn"] == 2 and question["call_id"]
    assert api.get(f"/runs/{run_id}", headers=alice.auth).json()["status"] == "waiting"
    url = f"/runs/{run_id}/questions/{question['id']}"

    bad = api.post(url, json={"answer": {"city": "Paris"}}, headers=alice.auth)
    assert bad.status_code == 422
    assert bad.json()["detail"] == [
        {"loc": ["body", "answer", "city"], "msg": "'Paris' is not one of ['Lyon', 'Porto']", "type": "enum"}
    ]
    missing = api.post(url, json={}, headers=alice.auth)
    assert missing.status_code == 422
    # who may see every run may not answer for its owner
    assert api.post(url, json={"answer": {"city": "Lyon"}}, headers=carol.auth).status_code == 403
    # a message while a question waits is refused with the reason
    r = say(api, alice, run_id, "hello?")
    assert r.status_code == 409 and "waits for an answer to a question" in r.json()["detail"][0]["msg"]

    ok = api.post(url, json={"answer": {"city": "Porto"}}, headers=alice.auth)
    assert ok.status_code == 200, ok.json()
    assert ok.json()["answer"] == {"city": "Porto"} and ok.json()["by"] == alice_label(alice)
    wait_for(api, run_id, alice.auth, status="waiting")
    items = api.get(f"/runs/{run_id}/messages", headers=alice.auth).json()["items"]
    assert items[-1]["content"] == 'you chose {"city": "Porto"}'
    (answered,) = api.get(f"/runs/{run_id}/questions", headers=alice.auth).json()
    assert answered["status"] == "answered" and answered["answer"] == {"city": "Porto"}
    again = api.post(url, json={"answer": {"city": "Lyon"}}, headers=alice.auth)
    assert again.status_code == 409 and again.json()["detail"][0]["type"] == "answered"
    unknown = api.post(f"/runs/{run_id}/questions/nope", json={"answer": 1}, headers=alice.auth)
    assert unknown.status_code == 404


def test_whoever_holds_the_permission_answers_another_owners_question(api, alice, bob, talk_host):
    bob.user_permissions.add(*Permission.objects.filter(codename__in=["view_all_runs", "answer_run"]))
    run_id = start(api, alice)["id"]
    wait_for(api, run_id, alice.auth, status="waiting")
    say(api, alice, run_id, "which city?")
    (question,) = pending_question(api, alice, run_id)
    r = api.post(f"/runs/{run_id}/questions/{question['id']}", json={"answer": {"city": "Lyon"}}, headers=bob.auth)
    assert r.status_code == 200 and r.json()["by"] == alice_label(bob)
    # but only the owner talks to it
    wait_for(api, run_id, alice.auth, status="waiting")
    assert say(api, bob, run_id, "hi from bob").status_code == 403


def test_an_expired_question_is_a_409_and_the_tool_call_fails_expired(api, alice, talk_host):
    run_id = start(api, alice)["id"]
    wait_for(api, run_id, alice.auth, status="waiting")
    say(api, alice, run_id, "which city, quickly?")
    # its expiry (0.5 s) is a timer of the engine: the question ends expired, the model is told
    wait_until(
        lambda: [q for q in api.get(f"/runs/{run_id}/questions", headers=alice.auth).json() if q["status"] == "expired"]
    )
    (question,) = api.get(f"/runs/{run_id}/questions", headers=alice.auth).json()
    assert question["expires_at"] is not None
    r = api.post(f"/runs/{run_id}/questions/{question['id']}", json={"answer": {"city": "Lyon"}}, headers=alice.auth)
    assert r.status_code == 409 and r.json()["detail"][0]["type"] == "expired"
    wait_for(api, run_id, alice.auth, status="waiting")
    items = api.get(f"/runs/{run_id}/messages", headers=alice.auth).json()["items"]
    assert items[-1]["content"] == "you chose error (expired): the question to a person expired unanswered"


def test_a_conversation_exported_erased_and_imported_comes_back_with_its_transcript_and_questions(
    api, alice, django_user_model, talk_host
):
    dave = _user(django_user_model, "dave", "import_run")
    run_id = start(api, alice)["id"]
    wait_for(api, run_id, alice.auth, status="waiting")
    say(api, alice, run_id, "which city?")
    (question,) = pending_question(api, alice, run_id)
    api.post(f"/runs/{run_id}/questions/{question['id']}", json={"answer": {"city": "Porto"}}, headers=alice.auth)
    wait_for(api, run_id, alice.auth, status="waiting")
    api.post(f"/runs/{run_id}/close", headers=alice.auth)
    wait_for(api, run_id, alice.auth)
    transcript = api.get(f"/runs/{run_id}/messages", headers=alice.auth).json()
    questions = api.get(f"/runs/{run_id}/questions", headers=alice.auth).json()
    body = api.get(f"/runs/{run_id}/export", headers=alice.auth).content
    assert api.delete(f"/runs/{run_id}", headers=alice.auth).status_code == 204

    r = api.post("/imports", data=body, headers={**dave.auth, "Content-Type": "application/jsonl"})
    assert r.status_code == 201, r.json()
    assert api.get(f"/runs/{run_id}/messages", headers=dave.auth).json() == transcript
    assert api.get(f"/runs/{run_id}/questions", headers=dave.auth).json() == questions
    assert [m["content"] for m in transcript["items"]][-1] == 'you chose {"city": "Porto"}'


def test_a_waiting_conversation_is_not_an_unfinished_run_to_sweep(api, alice, talk_host):
    run_id = start(api, alice)["id"]
    wait_for(api, run_id, alice.auth, status="waiting")
    assert run_id not in runindex.unfinished("default")
    assert len(of_type(run_id, QUESTION_ASKED)) == 0


@pytest.fixture
def streaming_host(transactional_db, settings):
    """The engine host with live tokens on, its model the same script, streamed a word at a time."""
    settings.AAA = {
        **settings.AAA,
        "LLM_CLIENT": "tests.conversations.site.streaming_model",
        "STREAM_TOKENS": True,
        "TOOLS": ["tests.conversations.site.choose_city"],
    }
    site.REQUESTS.clear()
    EngineHost.reset()
    yield EngineHost.get()
    EngineHost.reset()


def test_one_event_stream_carries_a_conversation_its_waits_and_its_replies_tokens(live_server, alice, streaming_host):
    from .sse import Live
    from .test_stream_live import Http

    client = Http(live_server.url, alice.auth)
    status, run = client.json("POST", "/runs", {"algorithm": TOOLLOOP, "input": {"task": "one"}, "conversation": True})
    assert status == 201, run
    stream = Live(live_server.url, f"/api/aaa/runs/{run['id']}/events/stream", alice.auth)
    assert stream.status == 200

    def until(type):
        got = []
        while (m := stream.next()) is not None:
            got.append(m)
            if m.event == "message" and m.data["type"] == type:
                return got
        raise AssertionError(f"the stream ended before {type}: {got}")

    try:
        first = until("aaa.message.sent")
        assert first[-1].data["data"]["waits"] == 1  # the run waits: for the next message
        status, _ = client.json("POST", f"/runs/{run['id']}/messages", {"content": "two"})
        assert status == 201
        second = until("aaa.message.sent")  # the same stream: it did not end at the first reply
        closed = client.json("POST", f"/runs/{run['id']}/close")
        rest = until("aaa.run.completed")
    finally:
        stream.close()
    events = [m.data for m in second if m.event == "message"]
    waits = [(e["type"], e["data"]["waits"]) for e in events if "waits" in e["data"]]
    assert waits == [("aaa.message.received", 0), ("aaa.message.sent", 1)]
    reply = events[-1]["data"]
    tokens = [m.data for m in second if m.event == "token"]
    # the reply's tokens came before its event, all of them (the stream was open before the message)
    assert {t["request_id"] for t in tokens} == {reply["request_id"]}
    assert "".join(t["text"] for t in tokens) == reply["content"] == "heard 'two' (3 messages)"
    assert closed[0] == 202 and rest[-1].data["data"]["outcome"] == "success"
