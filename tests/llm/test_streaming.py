"""Streaming model clients against a local server speaking each provider's stream
format (OpenAI's chat-completion chunks, Anthropic's Messages events), through the
real SDKs: the text comes piece by piece while the reply is not whole (the server
holds the rest until the test has seen the first piece), and the reply returned is
the one ``complete`` gives: text, tool calls, usage, cost, finish reason. Through the
LLMHandler, the pieces go to the delta sink and the log gets the one
``aaa.llm.completed``."""

from __future__ import annotations

import threading

import pytest

from aaa_django.algos import ToolLoop
from aaa_django.llm import LLMHandler
from aaa_django.llm.deltas import LocalTokens, TokenDelta
from aaa_django.llm.messages import LLMRequest, Message
from aaa_django.runtime.event_types import LLM_COMPLETED, LLM_REQUESTED
from aaa_django.tools import ToolRegistry
from tests.runtime.helpers import arun, make_engine, of_type

from .conftest import FAST, KEY, anthropic_client, openai_client, pydantic_ai_client
from .server import RecordedServer, Reply
from .streams import anthropic_stream, openai_stream

PRICES = {"gpt-4o-mini": {"input": 0.15, "output": 0.60}, "claude-haiku-4-5": {"input": 1.0, "output": 5.0}}
TEXTS = ["The weather", " in Lyon", " is sunny."]
#: FAST's retries, with room for a loaded machine's first connection
OPTIONS = {**FAST, "timeout": 15.0}


def pydantic_ai_anthropic_client(server: RecordedServer, **kwargs):
    from aaa_django.llm.pydantic_ai_client import PydanticAIClient

    return PydanticAIClient("anthropic:claude-haiku-4-5", base_url=server.url, api_key=KEY, **kwargs)


#: (client, wire format, the part holding the text after the first piece): the two
#: hand-written clients, and Pydantic AI's models over each wire format
WIRES = [
    pytest.param((openai_client, openai_stream, 2), id="openai"),
    pytest.param((anthropic_client, anthropic_stream, 4), id="anthropic"),
    pytest.param((pydantic_ai_client, openai_stream, 2), id="pydantic-ai-openai"),
    pytest.param((pydantic_ai_anthropic_client, anthropic_stream, 4), id="pydantic-ai-anthropic"),
]


@pytest.fixture(params=WIRES)
def wire(request):
    return request.param


def stream(client, request, on_text):
    async def go():
        try:
            return await client.stream(request, on_text)
        finally:
            await client.aclose()

    return arun(go())


def test_a_streamed_reply_comes_piece_by_piece_and_is_the_whole_reply(wire):
    build, fmt, second = wire
    first_seen = threading.Event()
    pieces: list[tuple[int, str]] = []

    def on_text(index: int, text: str) -> None:
        pieces.append((index, text))
        first_seen.set()

    with RecordedServer() as server:
        # the second piece is sent only once the client has handed out the first
        server.script(Reply(parts=fmt(TEXTS), holds={second: first_seen}))
        client = build(server, pricing=PRICES, **OPTIONS)
        response = stream(client, LLMRequest(messages=[Message(role="user", content="Weather?")]), on_text)
    assert pieces == list(enumerate(TEXTS))
    assert response.message.content == "".join(TEXTS) and not response.message.tool_calls
    assert (response.usage.input_tokens, response.usage.output_tokens) == (12, 5)
    assert response.cost > 0 and response.finish_reason == "stop"
    assert server.requests[0].json["stream"] is True


def test_a_streamed_tool_call_is_gathered_from_its_pieces(wire):
    build, fmt, _ = wire
    with RecordedServer() as server:
        server.script(Reply(parts=fmt(["Let me look."], tool=("get_weather", '{"city": "Lyon"}'))))
        client = build(server, pricing=PRICES, **OPTIONS)
        pieces: list[tuple[int, str]] = []
        response = stream(
            client,
            LLMRequest(
                messages=[Message(role="user", content="Weather?")], tools=[{"name": "get_weather", "parameters": {}}]
            ),
            lambda i, t: pieces.append((i, t)),
        )
    assert pieces == [(0, "Let me look.")]
    [call] = response.message.tool_calls
    assert (call.name, call.arguments) == ("get_weather", {"city": "Lyon"}) and call.id
    assert response.finish_reason == "tool_calls"


def test_a_retried_stream_starts_its_pieces_over():
    with RecordedServer() as server:
        server.script(Reply(status=503, body={"error": {"message": "busy"}}), Reply(parts=openai_stream(TEXTS)))
        pieces: list[tuple[int, str]] = []
        response = stream(
            openai_client(server, **OPTIONS),
            LLMRequest(messages=[Message(role="user", content="?")]),
            lambda i, t: pieces.append((i, t)),
        )
    assert pieces == list(enumerate(TEXTS)) and response.message.content == "".join(TEXTS)


class Recorder:
    """A delta sink that keeps what it is given."""

    def __init__(self) -> None:
        self.deltas: list[TokenDelta] = []

    def publish(self, delta: TokenDelta) -> None:
        self.deltas.append(delta)


def test_the_handler_publishes_the_pieces_and_logs_the_one_reply(wire):
    build, fmt, _ = wire
    sink = Recorder()
    with RecordedServer() as server:
        server.script(Reply(parts=fmt(TEXTS)))
        client = build(server, pricing=PRICES, **OPTIONS)

        async def go():
            engine = make_engine()
            LLMHandler(client, deltas=sink).attach(engine)
            async with engine:
                run = await engine.start(ToolLoop(ToolRegistry([])), {"task": "Weather?"})
                outcome = await run.result(timeout=15)
                await engine.drain(5)
                log = await engine.store.read(run.run_id)
            await client.aclose()
            return run.run_id, outcome, log

        run_id, outcome, log = arun(go())
    assert outcome.outcome == "success"
    [request] = of_type(log, LLM_REQUESTED)
    [completed] = of_type(log, LLM_COMPLETED)
    assert sink.deltas == [TokenDelta(run_id, request.id, i, t) for i, t in enumerate(TEXTS)]
    assert completed.data["response"]["message"]["content"] == "".join(TEXTS)
    # nothing of the deltas is in the log: the reply is its one event
    assert not [e for e in log if e.type.startswith("aaa.token")]


def test_without_a_sink_the_handler_does_not_stream():
    with RecordedServer() as server:
        server.script(Reply.recorded("openai/text"))
        client = openai_client(server, **OPTIONS)

        async def go():
            engine = make_engine()
            LLMHandler(client).attach(engine)
            async with engine:
                run = await engine.start(ToolLoop(ToolRegistry([])), {"task": "Hi"})
                outcome = await run.result(timeout=15)
            await client.aclose()
            return outcome

        assert arun(go()).outcome == "success"
    assert "stream" not in server.requests[0].json


def test_local_tokens_fan_out_to_each_subscriber_of_the_run():
    tokens = LocalTokens()
    a, b, other = tokens.subscribe("r1"), tokens.subscribe("r1"), tokens.subscribe("r2")
    delta = TokenDelta("r1", "q1", 0, "hi")
    tokens.publish(delta)
    assert a.wait(0) == [delta] and b.wait(1) == [delta] and other.wait(0) == []
    a.close()
    tokens.publish(delta)
    assert a.wait(0) == [] and b.wait(0) == [delta]


def test_a_pydantic_ai_model_streams_when_it_can_and_answers_whole_when_it_cannot():
    from pydantic_ai.messages import ModelResponse, TextPart
    from pydantic_ai.models.function import FunctionModel

    from aaa_django.llm.pydantic_ai_client import PydanticAIClient

    def whole(messages, info):
        return ModelResponse(parts=[TextPart("".join(TEXTS))])

    async def pieces(messages, info):
        for t in TEXTS:
            yield t

    request = LLMRequest(messages=[Message(role="user", content="Weather?")])
    for model, expected in ((FunctionModel(whole), []), (FunctionModel(stream_function=pieces), TEXTS)):
        seen: list[str] = []
        response = stream(PydanticAIClient(model), request, lambda i, t, seen=seen: seen.append(t))
        assert response.message.content == "".join(TEXTS) and seen == expected
