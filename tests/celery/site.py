"""The "site" the Celery tests run: a scripted model, tools, an algorithm, and the
``WORKER_SETUP`` hook (``setup(engine)``) that attaches them in every worker.

Everything here must behave the same in every process, so it keeps no state of its
own: what the tests observe (tool executions, concurrency, steps overlapping) goes to
PostgreSQL or Redis, where the pytest process reads it.
"""

from __future__ import annotations

import asyncio
import json
import os
import time

from pydantic import BaseModel

from aaa_django.algos import Algorithm, ToolLoop
from aaa_django.conf import aaa_settings
from aaa_django.events import Projection
from aaa_django.llm import FakeLLMClient, LLMHandler
from aaa_django.llm.fake import text, tool_calls
from aaa_django.runtime.event_types import (
    RUN_COMPLETED,
    TOOL_COMPLETED,
    TOOL_FAILED,
    TOOL_REQUESTED,
)
from aaa_django.tools import ToolHandler, ToolRegistry, tool

#: the table the guarded tool records each execution in (created by the fixture)
EXEC_TABLE = "celery_tool_exec"
POOL_SIZE = 2


def _redis():
    import redis

    return redis.Redis.from_url(os.environ["AAA_TEST_CELERY_BROKER"])


# -- the scripted model -------------------------------------------------------------------


def script(
    turns: int,
    tool: str = "noop",
    args: dict | None = None,
    parallel: int = 1,
    latency: float = 0.0,
    hold: str | None = None,
) -> str:
    """A task text the model below follows: ``turns`` model calls, the first
    ``turns - 1`` asking for ``parallel`` calls of ``tool`` each, the last answering;
    each call answers after ``latency`` seconds, and not before the Redis key ``hold``
    is gone (a test holds calls in flight for as long as it needs them there)."""
    return json.dumps(
        {"turns": turns, "tool": tool, "args": args or {}, "parallel": parallel, "latency": latency, "hold": hold}
    )


async def scripted_model(request):
    """Follows the JSON script in the user message (see :func:`script`)."""
    plan = json.loads(next(m.content for m in request.messages if m.role == "user"))
    if plan.get("latency"):
        await asyncio.sleep(plan["latency"])
    if plan.get("hold"):
        r = _redis()
        while r.exists(plan["hold"]):
            await asyncio.sleep(0.05)
    done = sum(1 for m in request.messages if m.role == "tool") // plan["parallel"]
    if done >= plan["turns"] - 1:
        return text(f"done after {done} tool turns")
    calls = [(plan["tool"], {**plan["args"], "n": done * plan["parallel"] + i}) for i in range(plan["parallel"])]
    return tool_calls(*calls)


def local_model():
    """``AAA["LLM_CLIENT"]`` of workers whose model is the test's local server
    (``AAA_TEST_MODEL_URL``, see worker_settings): the OpenAI-compatible client."""
    from aaa_django.llm.openai_client import OpenAICompatibleClient

    return OpenAICompatibleClient(
        os.environ["AAA_TEST_MODEL_URL"] + "/v1", "sk-test", "gpt-4o-mini", timeout=15, max_retries=0
    )


# -- tools ----------------------------------------------------------------------------------


@tool(inline=True)
def noop(n: int = 0) -> int:
    """Does nothing (the benchmark's tool)."""
    return n


@tool(inline=True)
def where(n: int = 0, tag: str = "where") -> int:
    """Says in Redis which thread of the worker ran it, how many messages the worker's
    engines have sent through the fast publisher so far, and how many deliveries its
    loop took without a message."""
    import threading

    from aaa_django.celery.worker import runtimes

    fast = [p.sent for rt in runtimes() for e in rt.engines.values() for p in e.bus._publishers]
    _redis().rpush(
        f"aaa-test:{tag}",
        json.dumps(
            {"thread": threading.current_thread().name, "fast": sum(fast), "taken": sum(rt.taken for rt in runtimes())}
        ),
    )
    return n


@tool(inline=True)
def chatty(n: int = 0) -> int:
    """Writes a log line (tests/celery/test_observe.py reads the worker's log)."""
    import logging

    logging.getLogger("tests.celery.site").warning("chatty tool ran with n=%s", n)
    return n


@tool(side_effects=True)
def record(n: int = 0, idempotency_key: str = "") -> str:
    """A side effect that must happen at most once per call: one row per execution."""
    from django.db import connections

    with connections["postgres"].cursor() as cur:
        cur.execute(f"INSERT INTO {EXEC_TABLE} (key, n, pid) VALUES (%s, %s, %s)", [idempotency_key, n, os.getpid()])
    return f"recorded {n}"


@tool(side_effects=True)
def slow_record(n: int = 0, tag: str = "slow-record", seconds: float = 3.0, idempotency_key: str = "") -> str:
    """``record``, slowly: one row per execution, a word in Redis once it is written,
    then ``seconds`` of work before it returns."""
    record.fn(n=n, idempotency_key=idempotency_key)
    _redis().set(f"aaa-test:{tag}:started", os.getpid())
    time.sleep(seconds)
    return f"recorded {n} slowly"


@tool(pool="shared")
def pooled(n: int = 0, ms: int = 100, tag: str = "pool") -> int:
    """Holds a slot of the cluster-wide pool ``shared`` for ``ms`` milliseconds; keeps
    the highest number of calls seen running at once in Redis."""
    r = _redis()
    now = r.incr(f"aaa-test:{tag}:active")
    try:
        r.eval(
            "if tonumber(redis.call('GET', KEYS[1]) or '0') < tonumber(ARGV[1]) then "
            "redis.call('SET', KEYS[1], ARGV[1]) end",
            1,
            f"aaa-test:{tag}:max",
            now,
        )
        time.sleep(ms / 1000)
    finally:
        r.decr(f"aaa-test:{tag}:active")
    return n


@tool
async def slow(n: int = 0, tag: str = "slow", seconds: float = 30.0) -> str:
    """Says in Redis that it started, then sleeps; says so if it is cancelled."""
    r = _redis()
    r.set(f"aaa-test:{tag}:started", os.getpid())
    try:
        await asyncio.sleep(seconds)
    except asyncio.CancelledError:
        r.set(f"aaa-test:{tag}:cancelled", os.getpid())
        raise
    return "finally"


@tool(inline=True)
def big(n: int = 0, size: int = 20_000) -> str:
    """A result above the claim threshold: it goes to the blob store."""
    return "y" * size


@tool(requires_approval=True)
def gated(n: int = 0) -> str:
    """Waits for a person's approval (none comes in the deadline test)."""
    return "approved"


@tool(requires_approval=True, approval_expires=1.0)
def gated_briefly(n: int = 0) -> str:
    """Its approval expires after a second."""
    return "approved"


@tool(requires_approval=True, approval_expires=24.0)
def gated_for_a_while(n: int = 0) -> str:
    """Its approval expires after 24 s: longer than the test broker's consumer_timeout
    (tests/celery/test_brokers.py: LONG)."""
    return "approved"


TOOLS = [noop, where, chatty, record, slow_record, pooled, slow, big, gated, gated_briefly, gated_for_a_while]
REGISTRY = ToolRegistry(TOOLS)


def loop(max_turns: int = 50) -> ToolLoop:
    return ToolLoop(REGISTRY, max_turns=max_turns)


# -- an algorithm that shows whether steps of one run overlap --------------------------------


class Tally(BaseModel):
    requested: int = 0
    results: int = 0
    decisions: int = 0


def _tally(s: Tally, e) -> Tally:
    if e.type == TOOL_REQUESTED:
        s.requested += 1
    elif e.type in (TOOL_COMPLETED, TOOL_FAILED):
        s.results += 1
    elif e.type == "test.step.decided":
        s.decisions += 1
    return s


TALLY = Projection(Tally, _tally, name="tests.celery.TALLY", version=1, state_type=Tally)


class SerialConfig(BaseModel):
    n: int = 8
    #: seconds each step holds on (widens the window in which steps could overlap)
    hold: float = 0.02


class SerialProbe(Algorithm):
    """Fans out ``n`` tool calls at once; then every step after a result writes one
    decision "k" (k = the number of decisions it saw), with an id of its own (derived
    from k and the event it handles). Each step marks itself "inside" in Redis for its
    duration: a step that finds another one inside counts an overlap.

    Steps that each decide from the whole log as it is give exactly one decision per
    result, numbered 0..n-1, each seeing all earlier ones. Two steps that decided from
    the same log would both write "decision k": a fork.
    """

    name = "tests.celery.SerialProbe"
    Config = SerialConfig

    async def step(self, ctx, event):
        r = _redis()
        inside = f"aaa-test:inside:{ctx.run_id}"
        if not r.set(inside, os.getpid(), nx=True, px=5000):
            r.incr(f"aaa-test:overlaps:{ctx.run_id}")
        try:
            await asyncio.sleep(self.cfg.hold)
            s = await ctx.project(TALLY)
            if s.requested == 0:
                for i in range(self.cfg.n):
                    ctx.tool("noop", {"n": i}, call_id=f"c{i}")
            elif s.decisions < s.results:
                ctx.emit(
                    "test.step.decided", {"k": s.decisions, "results_seen": s.results}, key=(s.decisions, ctx.event.id)
                )
            elif s.decisions >= self.cfg.n:
                ctx.complete("success", {"decisions": s.decisions})
        finally:
            r.delete(inside)


class Idle(Algorithm):
    """Waits: it asks for nothing (a run that waits for its deadline, or for someone)."""

    name = "tests.celery.Idle"

    async def step(self, ctx, event):
        return None


# -- signals: every process records what it sent, in Redis ------------------------------------

SIGNAL_NAMES = ("run_started", "run_ended", "approval_requested", "event_appended")


def _recorder(name: str):
    def receive(sender, run_id, event, **kw):
        entry = {"signal": name, "pid": os.getpid(), "event": event.id}
        if name == "run_ended":
            entry["outcome"] = kw["outcome"].outcome
        r = _redis()
        r.rpush(f"aaa-test:signals:{run_id}", json.dumps(entry))
        if name == "approval_requested":
            r.rpush(f"aaa-test:approval:{run_id}", kw["request_id"])
        elif name == "event_appended" and event.type == RUN_COMPLETED:  # the last signal of a run
            r.rpush(f"aaa-test:ended:{run_id}", event.id)

    return receive


def connect_signals(connect: bool = True) -> None:
    """Record every aaa_django signal this process sends (under ``aaa-test:signals:<run>``)."""
    from aaa_django import signals

    for name in SIGNAL_NAMES:
        signal, uid = getattr(signals, name), f"tests.celery.site.{name}"
        if connect:
            signal.connect(_recorder(name), weak=False, dispatch_uid=uid)
        else:
            signal.disconnect(dispatch_uid=uid)


# -- WORKER_SETUP ---------------------------------------------------------------------------


def setup(engine) -> None:
    """Attach the handlers every test worker needs (AAA["WORKER_SETUP"]): the tools and
    models of these tests and of tests/scenarios. Any worker serves any run (the
    workers' periodic duty fires whichever run's due time comes, in whichever cluster
    of the test process takes its turn)."""
    from tests.scenarios import site as scenarios

    scenarios.use_redis_probe()
    # Only the negative control of the serialisation test turns the step's guard off.
    engine.bus.serialize = engine.guard_steps = os.environ.get("AAA_TEST_SERIALIZE", "1") == "1"
    if not aaa_settings().get("LLM_CLIENT"):  # else the site's model is attached already
        LLMHandler(FakeLLMClient(any_model)).attach(engine)
    ToolHandler(ToolRegistry([*TOOLS, *scenarios.TOOLS]), pools={"shared": POOL_SIZE, **scenarios.POOLS}).attach(engine)
    connect_signals()


def any_model(request):
    """A scenario's script (named by the request's model), else this site's."""
    if request.model:
        from tests.scenarios.site import scripted_model as scenario_model

        return scenario_model(request)
    return scripted_model(request)
