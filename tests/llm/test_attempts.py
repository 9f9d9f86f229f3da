"""A provider client's own retries are attempts on the log too: the handler records
each before it is sent (``aaa_django.llm.retry.BEFORE_RETRY``), so the log's attempts
are the requests the provider's server received, on every wire format; a retry that the
run no longer wants (this process does not hold it) is not made."""

from __future__ import annotations

import asyncio

import pytest

from aaa_django.algos import Algorithm
from aaa_django.events import FoldCache, InMemoryEventStore
from aaa_django.llm import LLMHandler
from aaa_django.llm.errors import LLMCallError
from aaa_django.llm.messages import user
from aaa_django.llm.retry import BEFORE_RETRY, Backoff, Failure, StopAttempts, call_with_retries
from aaa_django.runtime import RUNMETA, Engine, InProcessBus
from tests.runtime.helpers import arun, of_type

from .server import Reply

PRICES = {
    "gpt-4o-mini": {"input": 0.15, "output": 0.60},
    "claude-haiku-4-5": {"input": 1.0, "output": 5.0},
    "openai-chat:gpt-4o-mini": {"input": 0.15, "output": 0.60},
}


# -- the hook, in the retry loop ------------------------------------------------------------------


def test_the_hook_runs_before_each_retry_after_its_wait_and_can_stop_the_call():
    order: list[str] = []
    tries = {"n": 0}

    async def attempt():
        tries["n"] += 1
        order.append(f"attempt {tries['n']}")
        raise ConnectionError("reset")

    async def sleep(seconds: float) -> None:
        order.append("wait")

    async def before(n: int) -> None:
        order.append(f"hook {n}")
        if n == 3:
            raise StopAttempts("not wanted any more")

    async def go():
        token = BEFORE_RETRY.set(before)
        try:
            await call_with_retries(
                attempt,
                lambda e: Failure("connection", str(e)),
                max_retries=5,
                backoff=Backoff(initial=0.01),
                timeout=None,
                redact=str,
                provider="test",
                model="m",
                sleep=sleep,
            )
        finally:
            BEFORE_RETRY.reset(token)

    with pytest.raises(StopAttempts):
        asyncio.run(go())
    assert order == ["attempt 1", "wait", "hook 2", "attempt 2", "wait", "hook 3"]


def test_without_a_hook_the_retries_are_the_clients_alone():
    async def attempt():
        raise ConnectionError("reset")

    async def sleep(seconds: float) -> None:
        pass

    with pytest.raises(LLMCallError) as info:
        asyncio.run(
            call_with_retries(
                attempt,
                lambda e: Failure("connection", str(e)),
                max_retries=2,
                backoff=Backoff(initial=0.01),
                timeout=None,
                redact=str,
                provider="test",
                model="m",
                sleep=sleep,
            )
        )
    assert len(info.value.attempts) == 3


# -- through the handler, on each wire format --------------------------------------------------


class Ask(Algorithm):
    """One model call; the run's value is the reply's text."""

    name = "tests.llm.attempts.ask"

    async def step(self, ctx, event):
        if event.type == "aaa.input.validated":
            ctx.llm([user("Say hello.")], tag="hello")
        elif event.type in ("aaa.llm.completed", "aaa.llm.failed"):
            ctx.complete(
                "success" if event.type == "aaa.llm.completed" else "failed", {"reason": event.data.get("reason")}
            )


def ask(client, bus=None):
    async def go():
        store = InMemoryEventStore()
        engine = Engine(store=store, bus=bus or InProcessBus(), cache=FoldCache())
        LLMHandler(client).attach(engine)
        async with engine:
            run = await engine.start(Ask(), {})
            outcome = await run.result(timeout=15)
            await engine.drain(5)
            log = await store.read(run.run_id)
        await client.aclose()
        return outcome, log

    return arun(go())


def test_every_http_attempt_is_an_attempt_on_the_log(provider, server):
    server.script(
        Reply.recorded(provider.rate_limited, headers={"retry-after": "0"}),
        Reply.recorded(provider.server_error),
        Reply.recorded(provider.text),
    )
    client = provider.client(server, pricing=PRICES)
    outcome, log = ask(client)
    assert outcome.ok
    attempts = of_type(log, "aaa.llm.attempted")
    assert (
        [a.data["attempt"] for a in attempts]
        == [1, 2, 3]
        == [r["attempt"] for r in of_type(log, "aaa.llm.completed")[0].data["attempts"]]
    )
    assert len(server.requests) == len(attempts)  # what the provider received, all on the log
    (reply,) = of_type(log, "aaa.llm.completed")
    assert reply.data["attempt"] == 3
    assert [(r["attempt"], r["reason"]) for r in reply.data["attempts"]] == [
        (1, "rate_limit"),
        (2, "server_error"),
        (3, "ok"),
    ]
    # each attempt before the reply, in order; estimated from the client's price table and
    # reply limit (Anthropic's client sends max_tokens=1024; the others none: 4096 assumed)
    seqs = [a.seq for a in attempts]
    assert seqs == sorted(seqs) and seqs[-1] < reply.seq
    limit = 1024 if provider.name == "anthropic" else 4096
    price = PRICES["claude-haiku-4-5" if provider.name == "anthropic" else "gpt-4o-mini"]
    for a in attempts:
        usage = a.data["estimate"]["usage"]
        assert usage["output_tokens"] == limit and usage["input_tokens"] > 0
        assert a.data["estimate"]["cost"] == pytest.approx(
            (usage["input_tokens"] * price["input"] + limit * price["output"]) / 1e6
        )
    meta = RUNMETA.fold(log)
    assert (meta.spend.attempts, meta.spend.abandoned) == (3, 0)
    assert meta.spend.cost == reply.data["cost"]  # answered attempts cost what the reply says


class HeldOnce(InProcessBus):
    """A bus that holds its runs until the first model attempt is made, then loses them
    (another process took them over). It is asked when the attempt is recorded, with
    its request, and again before it is sent."""

    def __init__(self) -> None:
        super().__init__()
        self.asked = 0

    def holds(self, run_id: str) -> bool:
        self.asked += 1
        return self.asked <= 2


def test_a_retry_for_a_run_this_process_no_longer_holds_is_not_made(provider, server):
    server.script(Reply.recorded(provider.server_error), Reply.recorded(provider.text))
    client = provider.client(server, pricing=PRICES)
    bus = HeldOnce()

    async def go():
        store = InMemoryEventStore()
        engine = Engine(store=store, bus=bus, cache=FoldCache())
        LLMHandler(client).attach(engine)
        async with engine:
            run = await engine.start(Ask(), {})
            await engine.drain(10)  # the call stopped: no result, the run waits
            await run.cancel("taken over elsewhere")
            outcome = await run.result(timeout=15)
            await engine.drain(5)
            log = await store.read(run.run_id)
        await client.aclose()
        return outcome, log

    outcome, log = arun(go())
    assert len(server.requests) == 1 and bus.asked == 3
    assert [a.data["attempt"] for a in of_type(log, "aaa.llm.attempted")] == [1]
    assert of_type(log, "aaa.llm.completed") == []
    (cut,) = of_type(log, "aaa.llm.failed")  # recorded by the run's end, at attempt 1's estimate
    assert (cut.data["reason"], cut.data["attempt"], cut.data["cut_off"]) == ("cancelled", 1, True)
    assert outcome.outcome == "cancelled"
