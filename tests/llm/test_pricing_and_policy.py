"""The pure parts: the pricing table, the backoff decision, Retry-After parsing."""

from __future__ import annotations

import email.utils
import pickle

import pytest

from aaa_django.llm import Usage
from aaa_django.llm.errors import LLMCallError
from aaa_django.llm.pricing import Pricing
from aaa_django.llm.provider import Secret, safe_url
from aaa_django.llm.retry import Backoff, reason_for_status, retry_after

TABLE = {"gpt-4o-mini": {"input": 0.15, "output": 0.60}, "gpt-4o": {"input": 2.5, "output": 10}}


def test_cost_is_dollars_per_million_tokens():
    cost = Pricing(TABLE).cost(Usage(input_tokens=1_000_000, output_tokens=500_000), "gpt-4o-mini")
    assert (cost.usd, cost.priced, cost.model) == (0.45, True, "gpt-4o-mini")


def test_the_answered_name_is_tried_before_the_asked_one_and_prefixes_never_match():
    p = Pricing({**TABLE, "gpt-4o-2024-08-06": {"input": 2.0, "output": 8.0}})
    usage = Usage(input_tokens=1_000_000, output_tokens=0)
    assert p.cost(usage, "gpt-4o-2024-08-06", "gpt-4o").usd == 2.0
    assert p.cost(usage, "gpt-4o-2024-11-20", "gpt-4o").usd == 2.5
    assert p.cost(usage, "gpt-4o-mini-2024-07-18", None).priced is False  # not gpt-4o's price


def test_an_unknown_model_costs_zero_and_is_flagged():
    cost = Pricing(TABLE).cost(Usage(input_tokens=10, output_tokens=10), "llama3.1:8b")
    assert (cost.usd, cost.priced, cost.model) == (0.0, False, None)
    assert Pricing(None).cost(Usage(input_tokens=10), "anything").priced is False


@pytest.mark.parametrize(
    "table, message",
    [
        ({"m": {"input": 1}}, "'output'"),
        ({"m": {"input": -1, "output": 1}}, ">= 0"),
        ({"m": {"input": "1", "output": 1}}, ">= 0"),
        ({"m": {"input": True, "output": 1}}, ">= 0"),
        ({"m": {"input": 1, "output": 1, "cached": 0.5}}, "unknown keys"),
        ({"m": 3}, "must map"),
    ],
)
def test_a_malformed_table_is_refused(table, message):
    with pytest.raises(ValueError, match=message):
        Pricing(table)


def test_backoff_doubles_up_to_its_cap_and_jitters_down():
    b = Backoff(initial=0.5, max=4.0, jitter=0.25)
    assert [b.delay(n) for n in range(1, 6)] == [0.5, 1.0, 2.0, 4.0, 4.0]
    assert b.delay(2, rand=0.999) == pytest.approx(1.0 * (1 - 0.25 * 0.999))


def test_backoff_honours_retry_after_up_to_its_limit():
    b = Backoff(max_retry_after=60)
    assert b.delay(1, retry_after=30) == 30
    assert b.delay(5, retry_after=0) == 0
    assert b.delay(1, retry_after=61) is None  # fail now rather than hold a worker


def test_retry_after_in_seconds_milliseconds_or_a_date():
    assert retry_after({"retry-after": "2"}) == 2.0
    assert retry_after({"retry-after": "0.25"}) == 0.25
    assert retry_after({"retry-after-ms": "1500", "retry-after": "9"}) == 1.5
    date = email.utils.formatdate(1_000_030, usegmt=True)
    assert retry_after({"retry-after": date}, now=1_000_000) == pytest.approx(30)
    assert retry_after({"retry-after": "soon"}) is None
    assert retry_after({}) is None


@pytest.mark.parametrize(
    "status, reason",
    [
        (429, "rate_limit"),
        (500, "server_error"),
        (503, "server_error"),
        (529, "server_error"),
        (408, "server_error"),
        (409, "server_error"),
        (401, "auth"),
        (403, "auth"),
        (400, "client_error"),
        (404, "client_error"),
        (422, "client_error"),
    ],
)
def test_status_reasons(status, reason):
    assert reason_for_status(status) == reason


def test_an_error_pickles_and_says_what_happened():
    attempts = [
        {"attempt": 1, "status": 500, "reason": "server_error", "error": "boom", "elapsed": 0.1, "retry_in": 0.5},
        {"attempt": 2, "status": 500, "reason": "server_error", "error": "boom", "elapsed": 0.2},
    ]
    error = LLMCallError(
        "boom", reason="server_error", status=500, attempts=attempts, provider="openai-compatible", model="gpt-4o-mini"
    )
    text = str(error)
    assert text.startswith(
        "openai-compatible call to 'gpt-4o-mini' failed (server_error, HTTP 500) after 2 attempts: boom"
    )
    assert "#1 HTTP 500 after 0.100s, retried in 0.500s; #2 HTTP 500 after 0.200s" in text
    again = pickle.loads(pickle.dumps(error))
    assert (str(again), again.attempts, again.retryable) == (text, attempts, True)


def test_secrets_and_urls_hide_credentials():
    assert repr(Secret("sk-live-123")) == "Secret('***')" and "sk-live" not in str(Secret("sk-live-123"))
    with pytest.raises(TypeError):
        pickle.dumps(Secret("sk-live-123"))
    assert safe_url("http://user:pw@host:8000/v1") == "http://host:8000/v1"
    assert safe_url("http://localhost:11434/v1") == "http://localhost:11434/v1"
