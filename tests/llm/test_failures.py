"""The one retry policy, on both wire formats: what is retried, how long the client
waits, what a call that fails for good raises, and that the key never shows."""

from __future__ import annotations

import pickle
import threading

import pytest

from aaa_django.llm import LLMRequest, Message
from aaa_django.llm.errors import LLMCallError

from .conftest import KEY, complete
from .server import Reply

ASK = LLMRequest(messages=[Message(role="user", content="Say hello to Lyon in five words.")])


def recorder() -> tuple[list[float], object]:
    """A ``sleep`` for a client that records the delays the retry policy chose
    instead of waiting them out."""
    waited: list[float] = []

    async def sleep(seconds: float) -> None:
        waited.append(seconds)

    return waited, sleep


def fails(client, request=ASK) -> LLMCallError:
    with pytest.raises(LLMCallError) as info:
        complete(client, request)
    return info.value


def test_a_429_is_retried_after_its_retry_after(provider, server):
    server.script(Reply.recorded(provider.rate_limited, headers={"retry-after": "0.3"}), Reply.recorded(provider.text))
    waited, sleep = recorder()
    reply = complete(provider.client(server, sleep=sleep), ASK)
    assert waited == [0.3]  # the server's wait, not our 0.01 s backoff
    assert reply.message.content == "Bonjour Lyon, city of lights!"
    assert [(a["attempt"], a["status"], a["reason"]) for a in reply.attempts] == [
        (1, 429, "rate_limit"),
        (2, None, "ok"),
    ]
    assert reply.attempts[0]["retry_in"] == 0.3
    assert "rate limit" in reply.attempts[0]["error"].lower()
    assert len(server.requests) == 2


def test_a_retry_after_longer_than_we_wait_fails_at_once(provider, server):
    server.script(Reply.recorded(provider.rate_limited, headers={"retry-after": "3600"}))
    error = fails(provider.client(server))
    assert (error.reason, error.status, len(error.attempts)) == ("rate_limit", 429, 1)
    assert "asked to retry after 3600s" in str(error)
    assert len(server.requests) == 1


def test_a_500_is_retried_with_backoff(provider, server):
    server.script(Reply.recorded(provider.server_error), Reply.recorded(provider.text))
    waited, sleep = recorder()
    reply = complete(provider.client(server, sleep=sleep), ASK)
    assert reply.message.content == "Bonjour Lyon, city of lights!"
    assert waited == [0.01]
    first, second = reply.attempts
    assert first["reason"] == "server_error" and first["retry_in"] == 0.01
    assert second["reason"] == "ok"


def test_a_persistent_500_fails_with_every_attempt(provider, server):
    server.script(*[Reply.recorded(provider.server_error)] * 3)
    waited, sleep = recorder()
    error = fails(provider.client(server, max_retries=2, sleep=sleep))
    assert waited == [0.01, 0.02]
    assert error.reason == "server_error" and error.retryable
    assert error.status in (500, 529)  # OpenAI's 500, Anthropic's 529 "overloaded"
    assert [a["attempt"] for a in error.attempts] == [1, 2, 3]
    assert [a.get("retry_in") for a in error.attempts] == [0.01, 0.02, None]  # doubling
    text = str(error)
    assert "after 3 attempts" in text and "#1 HTTP" in text and "#3 HTTP" in text
    assert len(server.requests) == 3


def test_a_bad_request_is_not_retried(provider, server):
    server.script(
        Reply(
            status=400,
            body={"type": "error", "error": {"type": "invalid_request_error", "message": "messages: field required"}},
        )
    )
    error = fails(provider.client(server))
    assert (error.reason, error.status, len(error.attempts)) == ("client_error", 400, 1)
    assert "messages: field required" in str(error)


@pytest.mark.parametrize(
    "body, headers",
    [
        (b'{"id": "chatcmpl-1", "choices": [', {}),  # cut short
        (b"<html><body>502 Bad Gateway</body></html>", {"content-type": "text/html"}),
        ({"unexpected": "shape"}, {}),  # JSON, not the API's
    ],
    ids=["truncated-json", "html", "wrong-shape"],
)
def test_a_malformed_body_is_a_clear_error(provider, server, body, headers):
    server.script(Reply(status=200, body=body, headers=headers))
    error = fails(provider.client(server))
    assert error.reason == "malformed_response" and not error.retryable
    assert len(error.attempts) == 1  # not retried: the same server would say it again
    assert "malformed_response" in str(error)


def test_a_slow_response_times_out_per_attempt(provider, server):
    """The server holds both replies until the test ends: the call can only fail, with
    a timeout on each attempt, if the client gave up on each at its own 0.3 s (had it
    waited, the held replies would have come after 30 s and the call succeeded)."""
    held = threading.Event()
    server.script(*[Reply.recorded(provider.text, hold=held, delay=30)] * 2)
    client = provider.client(server, timeout=0.3, max_retries=1)
    try:
        error = fails(client)
    finally:
        held.set()
    assert error.reason == "timeout" and error.status is None
    assert [a["reason"] for a in error.attempts] == ["timeout", "timeout"]
    # Never more requests than attempts; the first was read by the server (it held it).
    # The second may be cut off at its 0.3 s before the server's thread reads it on a
    # loaded machine (seen once: one request recorded), so its arrival is not asserted.
    assert 1 <= len(server.requests) <= 2
    assert "0.3s" in str(error)


def test_a_connection_dropped_mid_response_is_retried(provider, server):
    server.script(Reply.recorded(provider.text, drop=True), Reply.recorded(provider.text))
    reply = complete(provider.client(server), ASK)
    assert reply.message.content == "Bonjour Lyon, city of lights!"
    assert reply.attempts[0]["reason"] == "connection"
    assert "peer closed connection" in reply.attempts[0]["error"]


def test_a_connection_that_keeps_dropping_fails(provider, server):
    server.script(*[Reply.recorded(provider.text, drop=True)] * 2)
    error = fails(provider.client(server, max_retries=1))
    assert (error.reason, error.status, len(error.attempts)) == ("connection", None, 2)


def test_a_refused_connection_fails_as_connection(provider, server):
    client = provider.client(server, max_retries=0)
    server.__exit__()  # nobody listens on that port any more
    error = fails(client)
    assert error.reason == "connection"


def test_the_key_never_shows_in_errors_or_reprs(provider, server):
    echo = f"Incorrect API key provided: {KEY}. You can find your API key at https://example.invalid."
    server.script(Reply(status=401, body={"error": {"type": "authentication_error", "message": echo}}))
    client = provider.client(server)
    error = fails(client)
    assert error.reason == "auth" and len(error.attempts) == 1
    assert "Incorrect API key provided: ***" in str(error)
    for text in (
        str(error),
        repr(error),
        repr(error.attempts),
        repr(client),
        str(vars(client)),
        repr(pickle.loads(pickle.dumps(error)).__dict__),
    ):
        assert KEY not in text
    assert error.__cause__ is None and error.__suppress_context__  # no SDK exception chained
    # ...while the key did go where it belongs: the request's headers
    sent = server.requests[0].headers
    assert KEY in (sent.get("authorization", "") + sent.get("x-api-key", ""))


def test_a_key_the_anthropic_sdk_finds_itself_is_masked_too(server, monkeypatch):
    from aaa_django.llm.anthropic_client import AnthropicClient

    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-ant-from-env-9Qz")
    server.script(
        Reply(
            status=401,
            body={
                "type": "error",
                "error": {"type": "authentication_error", "message": "invalid x-api-key sk-ant-from-env-9Qz"},
            },
        )
    )
    error = fails(AnthropicClient(server.url, None, "claude-haiku-4-5"))
    assert "sk-ant-from-env-9Qz" not in str(error) and "invalid x-api-key ***" in str(error)
