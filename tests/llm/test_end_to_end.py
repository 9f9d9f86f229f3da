"""The engine's LLMHandler with the OpenAI-compatible client, and with the Pydantic AI
client over OpenAI's chat completions, against the local server:
a ToolLoop run asks the model, runs the tool it calls, sends the result back and ends
``success``; the log has usage and cost on every ``aaa.llm.completed`` and no secret."""

from __future__ import annotations

import json

import pytest

from aaa_django.algos import ToolLoop
from aaa_django.events import encode_json
from aaa_django.llm.openai_client import OpenAICompatibleClient
from aaa_django.tools import ToolRegistry, tool
from tests.runtime.helpers import arun, make_engine, of_type

from .conftest import FAST, KEY
from .server import RecordedServer, Reply, recording

PRICES = {"gpt-4o-mini": {"input": 0.15, "output": 0.60}}


@tool(inline=True)
def get_weather(city: str) -> str:
    """The current weather in a city."""
    return {"Lyon": "18 C, sunny"}[city]


def openai_client(server: RecordedServer, **options):
    return OpenAICompatibleClient(server.url + "/v1", KEY, "gpt-4o-mini", **options)


def pydantic_ai_client(server: RecordedServer, **options):
    from aaa_django.llm.pydantic_ai_client import PydanticAIClient

    return PydanticAIClient("openai-chat:gpt-4o-mini", base_url=server.url + "/v1", api_key=KEY, **options)


#: the client, and how it names itself in an error
CLIENTS = [
    pytest.param((openai_client, "openai-compatible call to 'gpt-4o-mini'"), id="openai"),
    pytest.param((pydantic_ai_client, "pydantic-ai call to 'openai-chat:gpt-4o-mini'"), id="pydantic-ai"),
]


@pytest.fixture(params=CLIENTS)
def client(request):
    return request.param


def run_tool_loop(server: RecordedServer, client, **client_options):
    registry = ToolRegistry([get_weather])
    client = client[0](server, pricing=PRICES, **{**FAST, **client_options})

    async def go():
        async with make_engine(registry=registry, client=client) as engine:
            run = await engine.start(
                ToolLoop(registry, system="Use the tools to answer."), {"task": "What is the weather in Lyon?"}
            )
            outcome = await run.result(timeout=15)
            await engine.drain(5)
            log = await engine.store.read(run.run_id)
        await client.aclose()
        return outcome, log

    return arun(go())


def no_secret_in(log) -> None:
    dump = "\n".join(repr(e) + encode_json(e.data) for e in log)
    assert KEY not in dump


def test_a_tool_loop_runs_to_success_on_a_real_wire_format(client):
    with RecordedServer() as server:
        server.script(Reply.recorded("openai/tool_call"), Reply.recorded("openai/tool_result"))
        outcome, log = run_tool_loop(server, client)
        # the handler rebuilt the whole conversation from the log, and the mapping sent
        # it as OpenAI expects: the assistant's tool_calls, then the tool's result
        for sent, name in zip(server.requests, ("openai/tool_call", "openai/tool_result")):
            expected = recording(name)["request"]
            if client[0] is openai_client:
                assert sent.json == expected
            else:  # Pydantic AI says more (strict, parallel_tool_calls...): the conversation is the same
                assert [_essential(m) for m in sent.json["messages"]] == [_essential(m) for m in expected["messages"]]
                assert [t["function"]["name"] for t in sent.json["tools"]] == ["get_weather"]

    assert (outcome.outcome, outcome.value) == ("success", {"text": "It is 18 C and sunny in Lyon."})
    completed = of_type(log, "aaa.llm.completed")
    assert [c.data["usage"] for c in completed] == [
        {"input_tokens": 68, "output_tokens": 15},
        {"input_tokens": 104, "output_tokens": 11},
    ]
    assert [c.data["cost"] for c in completed] == pytest.approx(
        [(68 * 0.15 + 15 * 0.60) / 1e6, (104 * 0.15 + 11 * 0.60) / 1e6]
    )
    assert completed[0].data["model"] == "gpt-4o-mini-2024-07-18"
    call = completed[0].data["response"]["message"]["tool_calls"][0]
    assert call == {"id": "call_Qx7mN2pL9vR4sT1wY8zK3bC6", "name": "get_weather", "arguments": {"city": "Lyon"}}
    assert of_type(log, "aaa.tool.completed")[0].data["result"] == "18 C, sunny"
    no_secret_in(log)


def _essential(message: dict) -> dict:
    keep = {"role": message["role"], "content": message.get("content") or None}
    if message.get("tool_calls"):
        keep["tool_calls"] = [
            (c["id"], c["function"]["name"], json.loads(c["function"]["arguments"])) for c in message["tool_calls"]
        ]
    if message.get("tool_call_id"):
        keep["tool_call_id"] = message["tool_call_id"]
    return keep


def test_a_model_that_keeps_failing_ends_the_run_failed_with_its_attempts_on_the_log(client):
    with RecordedServer() as server:
        server.script(*[Reply.recorded("openai/server_error")] * 3)
        outcome, log = run_tool_loop(server, client, max_retries=2)
        assert len(server.requests) == 3

    assert outcome.outcome == "failed"
    [failed] = of_type(log, "aaa.llm.failed")
    # the client's reason, status and attempts are facts on the log the algorithm can read
    assert (failed.data["reason"], failed.data["status"]) == ("server_error", 500)
    assert [(a["attempt"], a["status"], a.get("retry_in")) for a in failed.data["attempts"]] == [
        (1, 500, 0.01),
        (2, 500, 0.02),
        (3, 500, None),
    ]
    error = failed.data["error"]
    assert error.startswith(f"LLMCallError: {client[1]} failed (server_error, HTTP 500) after 3 attempts")
    assert "#1 HTTP 500" in error and "#3 HTTP 500" in error
    assert "httpx" not in json.dumps(failed.data)  # no SDK exception chained into the traceback
    no_secret_in(log)


def test_an_auth_failure_never_writes_the_key_into_the_log(client):
    echo = f"Incorrect API key provided: {KEY}."
    with RecordedServer() as server:
        server.script(
            Reply(
                status=401,
                body={"error": {"message": echo, "type": "invalid_request_error", "code": "invalid_api_key"}},
            )
        )
        outcome, log = run_tool_loop(server, client)
    assert outcome.outcome == "failed"
    [failed] = of_type(log, "aaa.llm.failed")
    assert (failed.data["reason"], failed.data["status"]) == ("auth", 401)
    assert "Incorrect API key provided: ***" in failed.data["error"]
    no_secret_in(log)
