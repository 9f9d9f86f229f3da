"""The run page's live tokens (``aaa_django.admin.livetokens``): the page of a running
run listens on its ``tokens/`` URL only when the site streams tokens; the URL answers
those who may see the run's page, as Server-Sent Events under WSGI and ASGI, and 204
(an ``EventSource`` stops) when there is nothing to stream."""

from __future__ import annotations

import json

import pytest
from asgiref.sync import async_to_sync
from django.test import AsyncClient

from aaa_django.admin.livetokens import AsyncTokenStream, TokenStream
from aaa_django.llm.deltas import LocalTokens, TokenDelta
from aaa_django.site import tokens

from .conftest import make_staff
from .test_run_pages import run_url, text

TOKENS_ON = {"STREAM_TOKENS": True}


def token_data(chunks: list[str]) -> list[dict]:
    return [json.loads(c.split("data: ", 1)[1]) for c in chunks if c.startswith("event: token\n")]


def test_a_running_runs_page_listens_for_tokens_only_when_the_site_streams_them(
    client, admin_user, gated_run, settings
):
    client.force_login(admin_user)
    page = text(client.get(run_url(gated_run)))
    assert 'id="aaa-live-reply"' not in page and "EventSource" not in page
    assert client.get(run_url(gated_run, "tokens")).status_code == 204  # off: the browser stops

    settings.AAA = {**settings.AAA, **TOKENS_ON}
    page = text(client.get(run_url(gated_run)))
    assert f'data-tokens-url="{run_url(gated_run, "tokens")}"' in page and "new EventSource" in page
    r = client.get(run_url(gated_run, "tokens"))
    assert r.status_code == 200 and r["Content-Type"] == "text/event-stream; charset=utf-8"
    assert "no-cache" in r["Cache-Control"] and r["X-Accel-Buffering"] == "no"
    r.close()


def test_an_ended_run_has_no_live_tokens(client, admin_user, finished_run, settings):
    settings.AAA = {**settings.AAA, **TOKENS_ON}
    client.force_login(admin_user)
    assert 'id="aaa-live-reply"' not in text(client.get(run_url(finished_run)))
    assert client.get(run_url(finished_run, "tokens")).status_code == 204


def test_the_tokens_of_a_run_are_for_those_who_may_see_its_page(client, django_user_model, viewer, gated_run, settings):
    settings.AAA = {**settings.AAA, **TOKENS_ON}
    url = run_url(gated_run, "tokens")
    assert client.get(url).status_code == 302  # to the admin's login
    client.force_login(make_staff(django_user_model, "nobody"))
    assert client.get(url).status_code == 403  # staff without the run permissions
    client.force_login(make_staff(django_user_model, "own-runs-only", "view_runrecord"))
    assert client.get(url).status_code == 404  # not their run: not even said to exist
    client.force_login(viewer)
    r = client.get(url)
    assert r.status_code == 200
    r.close()


def test_under_asgi_the_stream_is_an_async_one(admin_user, gated_run, settings):
    settings.AAA = {**settings.AAA, **TOKENS_ON}

    async def read() -> list[str]:
        client = AsyncClient()
        await client.aforce_login(admin_user)
        r = await client.get(run_url(gated_run, "tokens"))
        assert r.status_code == 200 and r.is_async
        chunks = aiter(r.streaming_content)
        got = [(await anext(chunks)).decode()]  # subscribed: the first message is sent
        tokens.LOCAL.publish(TokenDelta(gated_run, "q1", 0, "Deploying"))
        tokens.LOCAL.publish(TokenDelta("run-other", "q2", 0, "not ours"))
        while not token_data(got):
            got.append((await anext(chunks)).decode())
        await chunks.aclose()
        r.close()
        return got

    got = async_to_sync(read)()
    assert got[0] == "retry: 1000\n\n"
    assert token_data(got) == [{"run_id": gated_run, "request_id": "q1", "index": 0, "text": "Deploying"}]


class Clock:
    """A clock that moves only when told to."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


@pytest.mark.parametrize("kind", [TokenStream, AsyncTokenStream], ids=["wsgi", "asgi"])
def test_a_stream_sends_its_runs_deltas_in_order_and_closes_its_subscription(kind):
    feed, clock = LocalTokens(), Clock()
    stream = kind(feed.subscribe("run-1"), seconds=30, clock=clock)
    sent = [TokenDelta("run-1", "q1", i, t) for i, t in enumerate(["The", " weather", " is"])]
    feed.publish(TokenDelta("run-2", "q9", 0, "another run"))
    for d in sent:
        feed.publish(d)

    got: list[str] = []
    if kind is TokenStream:
        for chunk in stream:
            got.append(chunk)
            if chunk.startswith("event: token"):
                clock.now = 31  # past the stream's time: it ends once these are sent
    else:

        async def read() -> None:
            async for chunk in stream:
                got.append(chunk)
                if chunk.startswith("event: token"):
                    clock.now = 31

        async_to_sync(read)()
    stream.close()

    assert got[0] == "retry: 1000\n\n"
    assert token_data(got) == [d.to_dict() for d in sent]
    feed.publish(TokenDelta("run-1", "q1", 3, " late"))
    assert stream.subscription.wait(0) == []  # closed: unsubscribed
