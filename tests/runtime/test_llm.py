"""Model requests are deltas; the handler rebuilds the whole conversation from the log."""

from __future__ import annotations

import json

from aaa_django.algos import ToolLoop
from aaa_django.events import InMemoryEventStore, encode_json
from aaa_django.llm import CONVERSATION, FakeLLMClient
from aaa_django.llm.fake import text, tool_call, tool_calls
from aaa_django.tools import ToolRegistry, tool

from .helpers import arun, make_engine, of_type, tool_messages

RUN = "run-llm"


@tool(inline=True)
def echo(i: int) -> int:
    """Echoes its argument."""
    return i


def n_turns(n: int, seen: list):
    def model(request):
        seen.append([(m.role, m.content) for m in request.messages])
        k = tool_messages(request)
        return tool_call("echo", i=k) if k < n - 1 else text("done")

    return model


async def loop(n: int, seen: list, store=None):
    registry = ToolRegistry([echo])
    async with make_engine(n_turns(n, seen), registry, store=store) as engine:
        run = await engine.start(ToolLoop(registry, max_turns=n, system="be brief"), {"task": "count"}, run_id=RUN)
        outcome = await run.result(timeout=10)
        await engine.drain(5)
        return outcome, await engine.store.read(RUN)


def test_requests_carry_only_new_messages():
    seen: list = []
    outcome, log = arun(loop(4, seen))
    assert outcome.ok
    requests = of_type(log, "aaa.llm.requested")
    assert [len(r.data["messages"]) for r in requests] == [2, 1, 1, 1]
    assert [m["role"] for m in requests[0].data["messages"]] == ["system", "user"]
    assert all(r.data["messages"][0]["role"] == "tool" for r in requests[1:])


def test_the_model_sees_the_whole_conversation():
    seen: list = []
    arun(loop(3, seen))
    assert [len(s) for s in seen] == [2, 4, 6]  # + assistant reply + tool result per turn
    assert [role for role, _ in seen[-1]] == ["system", "user", "assistant", "tool", "assistant", "tool"]
    assert seen[-1][3] == ("tool", "0") and seen[-1][5] == ("tool", "1")


def test_log_bytes_grow_linearly_with_turns():
    def size(n):
        _, log = arun(loop(n, []))
        return sum(len(encode_json(e.data)) for e in log)

    s10, s20, s40 = size(10), size(20), size(40)
    per_turn_a = (s20 - s10) / 10
    per_turn_b = (s40 - s20) / 20
    assert abs(per_turn_b - per_turn_a) / per_turn_a < 0.05  # constant bytes per turn


def test_conversation_projection_any_split_equals_the_whole_fold():
    _, log = arun(loop(5, []))
    whole = CONVERSATION.fold(log)
    for cut in range(len(log) + 1):
        part = CONVERSATION.fold(log[:cut])
        import copy

        rest = CONVERSATION.fold(log[cut:], copy.deepcopy(part))
        assert rest == whole
    # and an old request's conversation is recoverable by a fold up to it
    first = of_type(log, "aaa.llm.requested")[0]
    state = CONVERSATION.fold(log[: log.index(first) + 1])
    assert [m.role for m in state.request(first.id)] == ["system", "user"]


def test_usage_and_cost_are_deterministic():
    client = FakeLLMClient(lambda r: text("abcdefgh"), price_in=0.5, price_out=1.0)
    from aaa_django.llm import LLMRequest, Message

    reply = arun(client.complete(LLMRequest(messages=[Message(role="user", content="x" * 9)])))
    assert reply.usage.input_tokens == 3 and reply.usage.output_tokens == 2
    assert reply.cost == 3 * 0.5 + 2 * 1.0


def test_parallel_tool_calls_get_distinct_deterministic_ids():
    def model(request):
        if tool_messages(request) == 0:
            return tool_calls(("echo", {"i": 1}), ("echo", {"i": 2}))
        return text(",".join(m.content for m in request.messages if m.role == "tool"))

    async def scenario():
        registry = ToolRegistry([echo])
        async with make_engine(model, registry) as engine:
            run = await engine.start(ToolLoop(registry), {"task": "two"}, run_id=RUN)
            outcome = await run.result(timeout=10)
            await engine.drain(5)
            return outcome, await engine.store.read(RUN)

    outcome, log = arun(scenario())
    assert outcome.value == {"text": "1,2"}
    ids = [e.data["call_id"] for e in of_type(log, "aaa.tool.requested")]
    assert len(set(ids)) == 2
    again = arun(scenario())[1]
    assert [e.data["call_id"] for e in of_type(again, "aaa.tool.requested")] == ids
    assert json.dumps([e.id for e in again]) == json.dumps([e.id for e in log])


def test_redelivered_answered_request_is_not_sent_again():
    seen: list = []

    async def scenario():
        store = InMemoryEventStore()
        _, log = await loop(2, seen, store=store)
        calls_before = len(seen)
        registry = ToolRegistry([echo])
        async with make_engine(n_turns(2, seen), registry, store=store) as engine:
            for e in log:  # deliver the whole finished log again
                await engine.handle(e)
            await engine.drain(5)
        return calls_before, await store.read(RUN), log

    calls_before, after, before = arun(scenario())
    assert len(seen) == calls_before
    assert [e.id for e in after] == [e.id for e in before]


def test_a_client_error_reason_and_attempts_reach_the_log():
    class ProviderDown(Exception):
        reason = "rate_limit"
        status = 429
        attempts = [{"attempt": 1, "status": 429}, {"attempt": 2, "status": 429}]

    def model(request):
        raise ProviderDown("slow down")

    async def scenario():
        async with make_engine(model, ToolRegistry([echo])) as engine:
            run = await engine.start(ToolLoop(ToolRegistry([echo])), {"task": "x"}, run_id=RUN)
            outcome = await run.result(timeout=10)
            await engine.drain(5)
            return outcome, await engine.store.read(RUN)

    outcome, log = arun(scenario())
    (failed,) = of_type(log, "aaa.llm.failed")
    assert failed.data["reason"] == "rate_limit" and failed.data["status"] == 429
    assert len(failed.data["attempts"]) == 2
    assert outcome.outcome == "failed" and outcome.value["error"]["reason"] == "rate_limit"
