"""A site whose model streams from a local server, for the live-token tests of the
API and the admin: ``model_server`` (a :class:`~tests.llm.server.RecordedServer`; script
its replies) and ``tokens_host`` (``AAA["STREAM_TOKENS"]`` on, ``AAA["LLM_CLIENT"]`` the
OpenAI-compatible client on that server, and a fresh engine host built from them).
Import both fixtures into the test module."""

from __future__ import annotations

import openai  # noqa: F401  (imported now, not within the engine host's start bound)
import pytest

from aaa_django.llm.openai_client import OpenAICompatibleClient
from aaa_django.site.host import EngineHost

from .server import RecordedServer

#: the local model server of the running test (the site's LLM_CLIENT reads it)
SERVER: list[RecordedServer] = []


def streaming_client() -> OpenAICompatibleClient:
    """AAA["LLM_CLIENT"] of these tests: the OpenAI-compatible client on the local server."""
    return OpenAICompatibleClient(SERVER[-1].url + "/v1", "sk-test", "gpt-4o-mini", timeout=60, max_retries=0)


@pytest.fixture
def model_server():
    with RecordedServer() as server:
        SERVER.append(server)
        yield server
        SERVER.remove(server)


@pytest.fixture
def tokens_host(transactional_db, settings, model_server):
    settings.AAA = {**settings.AAA, "STREAM_TOKENS": True, "LLM_CLIENT": "tests.llm.live.streaming_client"}
    EngineHost.reset()
    yield EngineHost.get()
    EngineHost.reset()
