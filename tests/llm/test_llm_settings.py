"""``AAA["LLM"]`` -> the site's model client (``aaa_django.site.llm_settings``)."""

from __future__ import annotations

import re

import pytest
from django.core.exceptions import ImproperlyConfigured

from aaa_django.llm.anthropic_client import AnthropicClient
from aaa_django.llm.openai_client import OpenAICompatibleClient
from aaa_django.site.llm_settings import check_llm_settings, client_from_settings

from .conftest import KEY


@pytest.mark.parametrize(
    "aaa",
    [
        {},
        {"LLM": None},
        {"LLM": {}},
        # what the example site writes when AAA_LLM_* are unset
        {"LLM": {"PROVIDER": "openai", "BASE_URL": None, "API_KEY": "", "MODEL": ""}},
    ],
    ids=["no-key", "none", "empty", "empty-env"],
)
def test_nothing_configured_gives_no_client(settings, aaa):
    settings.AAA = aaa
    assert client_from_settings() is None
    assert check_llm_settings() == []


def test_an_openai_compatible_server(settings):
    settings.AAA = {
        "LLM": {
            "BASE_URL": "http://localhost:11434/v1",
            "MODEL": "llama3.1:8b",
            "TIMEOUT": 5,
            "MAX_RETRIES": 1,
            "PRICING": {"llama3.1:8b": {"input": 0, "output": 0}},
        }
    }
    client = client_from_settings()
    assert isinstance(client, OpenAICompatibleClient)
    assert (client.base_url, client.model, client.timeout, client.max_retries) == (
        "http://localhost:11434/v1",
        "llama3.1:8b",
        5,
        1,
    )
    assert client.pricing.price("llama3.1:8b") is not None
    assert check_llm_settings() == []


def test_anthropic(settings):
    settings.AAA = {"LLM": {"PROVIDER": "anthropic", "API_KEY": KEY, "MODEL": "claude-haiku-4-5", "MAX_TOKENS": 2048}}
    client = client_from_settings()
    assert isinstance(client, AnthropicClient)
    assert (client.base_url, client.model, client.max_tokens) == (None, "claude-haiku-4-5", 2048)
    assert KEY not in repr(client)


def test_any_model_pydantic_ai_reaches(settings):
    from aaa_django.llm.pydantic_ai_client import PydanticAIClient

    settings.AAA = {
        "LLM": {
            "PROVIDER": "pydantic-ai",
            "MODEL": "anthropic:claude-haiku-4-5",
            "API_KEY": KEY,
            "BASE_URL": "http://127.0.0.1:9/",
            "MAX_RETRIES": 3,
        }
    }
    client = client_from_settings()
    assert isinstance(client, PydanticAIClient)
    assert (client.model, client.base_url, client.max_retries) == (
        "anthropic:claude-haiku-4-5",
        "http://127.0.0.1:9/",
        3,
    )
    assert KEY not in repr(client) and KEY not in str(vars(client))
    assert check_llm_settings() == []


@pytest.mark.parametrize(
    "llm, says",
    [
        ({"API_KEY": KEY}, "MODEL is required"),
        ({"MODEL": "m", "PROVIDER": "gemini"}, "PROVIDER must be one of"),
        ({"MODEL": "m", "TIMEOUT": 0}, "TIMEOUT must be"),
        ({"MODEL": "m", "MAX_RETRIES": -1}, "MAX_RETRIES must be an int >= 0"),
        ({"MODEL": "m", "PRICING": {"m": {"input": 1}}}, "PRICING: "),
        ({"MODEL": "m", "BASEURL": "http://x"}, "unknown keys ['BASEURL']"),
        ({"MODEL": "m", "API_KEY": 12345678}, "API_KEY must be a str"),
    ],
)
def test_a_bad_config_is_a_clear_error_at_start_up(settings, llm, says):
    settings.AAA = {"LLM": llm}
    with pytest.raises(ImproperlyConfigured, match=re.escape(says)):
        client_from_settings()
    [error] = check_llm_settings()
    assert error.id == "aaa.E060" and says in error.msg
    assert KEY not in error.msg and "12345678" not in error.msg


def test_a_missing_sdk_is_reported_by_the_check(settings, monkeypatch):
    import sys

    settings.AAA = {"LLM": {"PROVIDER": "anthropic", "MODEL": "claude-haiku-4-5", "API_KEY": KEY}}
    monkeypatch.setitem(sys.modules, "anthropic", None)
    [error] = check_llm_settings()
    assert "pip install 'aaa_django[anthropic]'" in error.hint
    settings.AAA = {"LLM": {"PROVIDER": "pydantic-ai", "MODEL": "test"}}
    monkeypatch.setitem(sys.modules, "pydantic_ai", None)
    [error] = check_llm_settings()
    assert "pip install 'aaa_django[pydantic-ai]'" in error.hint


# -- combinations that cannot work: errors at start-up (aaa_django.checks.check_models) -------


@pytest.mark.parametrize(
    "model, says",
    [
        ("nosuch:m", "ValueError: Unknown provider: nosuch"),
        ("openai-chat:gpt-4o-mini", "Set the `OPENAI_API_KEY` environment variable"),  # no key anywhere
    ],
)
def test_a_pydantic_ai_model_that_cannot_be_built_is_an_error_at_start_up(settings, monkeypatch, model, says):
    from aaa_django.checks import check_models

    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    settings.AAA = {"LLM": {"PROVIDER": "pydantic-ai", "MODEL": model}}
    [error] = check_models()
    assert error.id == "aaa.E061" and says in error.msg
    settings.AAA = {"LLM": {"PROVIDER": "pydantic-ai", "MODEL": "openai-chat:gpt-4o-mini", "API_KEY": KEY}}
    assert check_models() == []


def test_an_agent_without_a_model_needs_one_from_the_site(settings):
    from aaa_django.checks import check_models

    modelless, own = "tests.pydantic_ai.own_model.modelless", "tests.pydantic_ai.own_model.agent"
    settings.AAA = {"AGENTS": [modelless, own]}
    [error] = check_models()
    assert error.id == "aaa.E062" and repr(modelless) in error.msg  # the agent with a model needs nothing
    for site_model in (
        {"LLM": {"MODEL": "m", "BASE_URL": "http://127.0.0.1:9/v1"}},
        {"LLM_CLIENT": "project.api_demo.scripted_model"},
        {"WORKER_SETUP": "tests.celery.site.setup"},
    ):
        settings.AAA = {"AGENTS": [modelless], **site_model}
        assert check_models() == []
