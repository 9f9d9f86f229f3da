"""Fixtures for the model-client tests: a recorded-response server and the clients.

``provider`` is parametrised over the OpenAI-compatible and the Anthropic client, so
a test of the retry policy, timeouts or secrets runs against both wire formats.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import pytest

from aaa_django.llm.anthropic_client import AnthropicClient
from aaa_django.llm.openai_client import OpenAICompatibleClient
from aaa_django.llm.retry import Backoff
from tests.runtime.helpers import arun

from .server import RecordedServer

#: the API key of every test client: it must never show in an error, a repr or an event
KEY = "sk-test-7Hq2Lx9PzR4vW1nB"
#: small waits, so the retry tests take milliseconds
FAST = {"timeout": 2.0, "max_retries": 2, "backoff": Backoff(initial=0.01, max=0.05, jitter=0)}


@dataclass(frozen=True)
class Provider:
    name: str
    build: Callable[..., Any]
    #: recording names
    text: str
    rate_limited: str
    server_error: str

    def client(self, server: RecordedServer, **kwargs: Any) -> Any:
        return self.build(server, **{**FAST, **kwargs})


def openai_client(server: RecordedServer, **kwargs: Any) -> OpenAICompatibleClient:
    return OpenAICompatibleClient(server.url + "/v1", KEY, "gpt-4o-mini", **kwargs)


def anthropic_client(server: RecordedServer, **kwargs: Any) -> AnthropicClient:
    return AnthropicClient(server.url, KEY, "claude-haiku-4-5", max_tokens=1024, **kwargs)


def pydantic_ai_client(server: RecordedServer, **kwargs: Any) -> Any:
    from aaa_django.llm.pydantic_ai_client import PydanticAIClient

    return PydanticAIClient("openai-chat:gpt-4o-mini", base_url=server.url + "/v1", api_key=KEY, **kwargs)


OPENAI = Provider("openai", openai_client, "openai/text", "openai/rate_limited", "openai/server_error")
ANTHROPIC = Provider("anthropic", anthropic_client, "anthropic/text", "anthropic/rate_limited", "anthropic/overloaded")


#: the OpenAI wire format again, through Pydantic AI's Model interface
PYDANTIC_AI = Provider("pydantic-ai", pydantic_ai_client, "openai/text", "openai/rate_limited", "openai/server_error")


@pytest.fixture(params=[OPENAI, ANTHROPIC, PYDANTIC_AI], ids=lambda p: p.name)
def provider(request: pytest.FixtureRequest) -> Provider:
    return request.param


@pytest.fixture
def server():
    with RecordedServer() as s:
        yield s


def complete(client: Any, request: Any) -> Any:
    """``client.complete(request)`` on a fresh loop, closing the client's SDK after."""

    async def go() -> Any:
        try:
            return await client.complete(request)
        finally:
            await client.aclose()

    return arun(go())
