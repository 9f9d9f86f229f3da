"""Our messages and tool specs to each provider's wire format and back, checked
against recorded exchanges: the request the client sends must equal the recorded
request, and the recorded reply must come back as our message, usage and cost."""

from __future__ import annotations

import asyncio
import logging

import pytest

from aaa_django.llm import LLMClient, LLMRequest, Message
from aaa_django.llm.errors import LLMCallError
from aaa_django.llm.messages import ToolCall

from .conftest import ANTHROPIC, OPENAI, complete
from .server import Reply, recording

WEATHER = {
    "name": "get_weather",
    "description": "The current weather in a city.",
    "parameters": {
        "additionalProperties": False,
        "properties": {"city": {"type": "string"}},
        "required": ["city"],
        "type": "object",
    },
}
PRICES = {
    "gpt-4o-mini": {"input": 0.15, "output": 0.60},
    "claude-haiku-4-5": {"input": 1.0, "output": 5.0},
}


def text_request(**kw) -> LLMRequest:
    return LLMRequest(
        messages=[
            Message(role="system", content="You are a concise assistant."),
            Message(role="user", content="Say hello to Lyon in five words."),
        ],
        **kw,
    )


def asking() -> list[Message]:
    return [
        Message(role="system", content="Use the tools to answer."),
        Message(role="user", content="What is the weather in Lyon?"),
    ]


@pytest.mark.parametrize(
    "p, usage, cost",
    [
        (OPENAI, (27, 8), (27 * 0.15 + 8 * 0.60) / 1e6),
        (ANTHROPIC, (25, 11), (25 * 1.0 + 11 * 5.0) / 1e6),
    ],
    ids=["openai", "anthropic"],
)
def test_text_round_trip(server, p, usage, cost):
    server.script(Reply.recorded(p.text))
    reply = complete(p.client(server, pricing=PRICES), text_request())
    assert server.requests[0].json == recording(p.text)["request"]
    assert reply.message == Message(role="assistant", content="Bonjour Lyon, city of lights!")
    assert (reply.usage.input_tokens, reply.usage.output_tokens) == usage
    assert reply.cost == pytest.approx(cost) and reply.priced
    assert reply.finish_reason == "stop"
    # the model the provider answered with (the dated one), priced by the name asked for
    assert reply.model == recording(p.text)["response"]["body"]["model"]


def test_openai_tool_call_round_trip(server):
    server.script(Reply.recorded("openai/tool_call"), Reply.recorded("openai/tool_result"))
    client = OPENAI.client(server)

    async def go():
        first = await client.complete(LLMRequest(messages=asking(), tools=[WEATHER]))
        conversation = asking() + [
            first.message,
            Message(
                role="tool", content="18 C, sunny", tool_call_id=first.message.tool_calls[0].id, name="get_weather"
            ),
        ]
        second = await client.complete(LLMRequest(messages=conversation, tools=[WEATHER]))
        await client.aclose()
        return first, second

    first, second = asyncio.run(go())
    assert first.message.tool_calls == (
        ToolCall(id="call_Qx7mN2pL9vR4sT1wY8zK3bC6", name="get_weather", arguments={"city": "Lyon"}),
    )
    assert first.message.content is None and first.finish_reason == "tool_calls"
    assert first.usage.input_tokens == 68
    # the assistant's tool call went back as `tool_calls` with JSON-string arguments,
    # the result as a `role: "tool"` message answering its id
    assert server.requests[0].json == recording("openai/tool_call")["request"]
    assert server.requests[1].json == recording("openai/tool_result")["request"]
    assert second.message.content == "It is 18 C and sunny in Lyon." and not second.message.tool_calls


def test_anthropic_tool_use_round_trip(server):
    server.script(Reply.recorded("anthropic/tool_use"), Reply.recorded("anthropic/tool_result"))
    client = ANTHROPIC.client(server)

    async def go():
        first = await client.complete(LLMRequest(messages=asking(), tools=[WEATHER]))
        conversation = asking() + [
            first.message,
            Message(
                role="tool", content="18 C, sunny", tool_call_id=first.message.tool_calls[0].id, name="get_weather"
            ),
        ]
        second = await client.complete(LLMRequest(messages=conversation, tools=[WEATHER]))
        await client.aclose()
        return first, second

    first, second = asyncio.run(go())
    assert first.message == Message(
        role="assistant",
        content="I'll look up the weather in Lyon.",
        tool_calls=(ToolCall(id="toolu_01A09q90qw90lq917835lq9", name="get_weather", arguments={"city": "Lyon"}),),
    )
    assert first.finish_reason == "tool_calls"  # stop_reason "tool_use", in OpenAI's words
    # system prompt apart; tool_use block back in the assistant turn; tool_result in a user turn
    assert server.requests[0].json == recording("anthropic/tool_use")["request"]
    assert server.requests[1].json == recording("anthropic/tool_result")["request"]
    assert second.message.content == "It is 18 C and sunny in Lyon."
    assert second.usage.input_tokens == 472 + 128  # cache reads count as input


def test_anthropic_merges_parallel_tool_results_into_one_user_turn():
    from aaa_django.llm.anthropic_client import to_anthropic_messages

    calls = (ToolCall(id="toolu_a", name="f", arguments={"x": 1}), ToolCall(id="toolu_b", name="f", arguments={}))
    system, messages = to_anthropic_messages(
        [
            Message(role="system", content="one"),
            Message(role="user", content="go"),
            Message(role="assistant", tool_calls=calls),
            Message(role="tool", content="1", tool_call_id="toolu_a"),
            Message(role="tool", content="2", tool_call_id="toolu_b"),
            Message(role="system", content="two"),
            Message(role="user", content="and?"),
        ]
    )
    assert system == "one\n\ntwo"
    assert [m["role"] for m in messages] == ["user", "assistant", "user"]
    assert [b["type"] for b in messages[2]["content"]] == ["tool_result", "tool_result", "text"]


def test_params_go_into_the_body_and_cannot_override_the_client(server):
    server.script(Reply.recorded("openai/text"), Reply.recorded("anthropic/text"))
    complete(OPENAI.client(server), text_request(params={"temperature": 0.2, "max_tokens": 50}))
    complete(ANTHROPIC.client(server), text_request(params={"temperature": 0.2, "max_tokens": 50}))
    assert server.requests[0].json["temperature"] == 0.2 and server.requests[0].json["max_tokens"] == 50
    assert server.requests[1].json["temperature"] == 0.2 and server.requests[1].json["max_tokens"] == 50
    with pytest.raises(ValueError, match="may not set"):
        complete(OPENAI.client(server), text_request(params={"model": "other"}))
    assert len(server.requests) == 2


def test_the_request_model_wins_over_the_client_default(server):
    server.script(Reply.recorded("openai/text"))
    complete(OPENAI.client(server), text_request(model="gpt-4.1-nano"))
    assert server.requests[0].json["model"] == "gpt-4.1-nano"


def test_an_unpriced_model_costs_zero_is_flagged_and_warned_once(server, caplog):
    server.script(Reply.recorded("openai/text"), Reply.recorded("openai/text"))
    client = OPENAI.client(server, pricing={"some-other-model": {"input": 1, "output": 1}})

    async def go():
        replies = [await client.complete(text_request()) for _ in range(2)]
        await client.aclose()
        return replies

    with caplog.at_level(logging.WARNING, logger="aaa_django.llm"):
        replies = asyncio.run(go())
    assert [(r.cost, r.priced) for r in replies] == [(0.0, False), (0.0, False)]
    assert replies[0].usage.input_tokens == 27  # usage is still recorded
    assert len([r for r in caplog.records if "no price for model 'gpt-4o-mini'" in r.getMessage()]) == 1


def test_invalid_tool_arguments_from_the_model_fail_clearly(server):
    body = recording("openai/tool_call")["response"]["body"]
    body["choices"][0]["message"]["tool_calls"][0]["function"]["arguments"] = '{"city": "Ly'
    server.script(Reply(body=body))
    with pytest.raises(LLMCallError) as info:
        complete(OPENAI.client(server), LLMRequest(messages=asking(), tools=[WEATHER]))
    assert info.value.reason == "bad_tool_arguments" and len(info.value.attempts) == 1
    assert "get_weather" in str(info.value)


def test_one_client_serves_successive_event_loops(server):
    """A process may run several loops (async_to_sync, tests): each gets its own SDK
    client, and the one of a closed loop is closed when the next loop comes."""
    server.script(*[Reply.recorded("openai/text")] * 3)
    client = OPENAI.client(server)
    for _ in range(3):
        assert asyncio.run(client.complete(text_request())).message.content
    assert len(client._sdks) == 1
    asyncio.run(client.aclose())
    assert not client._sdks


def test_the_clients_are_llm_clients(server):
    assert isinstance(OPENAI.client(server), LLMClient)
    assert isinstance(ANTHROPIC.client(server), LLMClient)


def test_a_missing_optional_sdk_says_how_to_install_it(monkeypatch):
    import sys

    from aaa_django.llm.anthropic_client import AnthropicClient

    monkeypatch.setitem(sys.modules, "anthropic", None)  # as if not installed
    with pytest.raises(ImportError, match=r"pip install 'aaa_django\[anthropic\]'"):
        AnthropicClient(None, "k", "claude-haiku-4-5")
