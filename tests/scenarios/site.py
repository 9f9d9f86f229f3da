"""What the scenarios run, importable by any process: tools, scripted models,
algorithms, and what Celery workers attach (``tests.celery.site.setup``, their ``AAA["WORKER_SETUP"]``).

Nothing here keeps state of its own, and nothing waits on an in-memory event: a
process may be the pytest process (in-process bus) or a Celery worker. What the tests
observe (a tool ran, how many ran at once, a model was called) goes to the *probe*:
a dict in the pytest process, Redis in the workers (``AAA_TEST_CELERY_BROKER``). Keys
start with the run id, so runs never read each other's observations.

Which model a run talks to is its ToolLoop's ``model`` setting: ``scripted_model``
looks the script up by that name (``loop("add_then_answer", ...)``), so one
LLMHandler per process serves every scenario.
"""

from __future__ import annotations

import asyncio
import json
import os
import threading
from typing import Any, Callable

from pydantic import BaseModel

from aaa_django.algos import LOOP, Algorithm, ToolLoop
from aaa_django.llm import FakeLLMClient, LLMHandler
from aaa_django.llm.fake import text, tool_call
from aaa_django.tools import ToolHandler, ToolRegistry, tool
from tests.runtime import algos as engine_algos  # noqa: F401  (registers tests.boom, tests.parent)

POOLS = {"db": 2}

# -- the probe ----------------------------------------------------------------------------


class MemoryProbe:
    """Observations of one process (the in-process bus)."""

    def __init__(self) -> None:
        self._values: dict[str, Any] = {}
        self._lock = threading.Lock()

    def incr(self, key: str, by: int = 1) -> int:
        with self._lock:
            self._values[key] = int(self._values.get(key, 0)) + by
            return self._values[key]

    def high(self, key: str, value: int) -> None:
        """Keep the highest ``value`` seen under ``key``."""
        with self._lock:
            self._values[key] = max(int(self._values.get(key, 0)), value)

    def set(self, key: str, value: Any) -> None:
        with self._lock:
            self._values[key] = value

    def get(self, key: str) -> Any:
        return self._values.get(key)

    def count(self, key: str) -> int:
        return int(self.get(key) or 0)


class RedisProbe:
    """Observations shared by every process of a cluster."""

    _HIGH = (
        "if tonumber(redis.call('GET', KEYS[1]) or '0') < tonumber(ARGV[1]) then "
        "redis.call('SET', KEYS[1], ARGV[1]) end"
    )

    def __init__(self, url: str) -> None:
        import redis

        self.client = redis.Redis.from_url(url, decode_responses=True)

    def _key(self, key: str) -> str:
        return f"aaa-scenario:{key}"

    def incr(self, key: str, by: int = 1) -> int:
        return int(self.client.incrby(self._key(key), by))

    def high(self, key: str, value: int) -> None:
        self.client.eval(self._HIGH, 1, self._key(key), value)

    def set(self, key: str, value: Any) -> None:
        self.client.set(self._key(key), value)

    def get(self, key: str) -> Any:
        return self.client.get(self._key(key))

    def count(self, key: str) -> int:
        return int(self.get(key) or 0)


#: this process's probe: set by the test harness (in-process) or by ``use_redis_probe`` (workers)
PROBE: Any = MemoryProbe()


def probe() -> Any:
    return PROBE


# -- tools ----------------------------------------------------------------------------------


@tool
def add(a: int, b: int, tag: str = "") -> int:
    """Adds two numbers (and counts its calls under ``tag``).

    Args:
        a: the first number
        b: the second number
    """
    probe().incr(f"{tag}:add")
    return a + b


# (Names the shared Celery workers' own tools do not take: every test worker serves
# every test's runs, tests/celery/site.py's ``setup``.)
@tool(name="lingering")
async def slow(tag: str = "", seconds: float = 30.0) -> str:
    """Says that it started, then takes its time; says so if it is cancelled."""
    probe().set(f"{tag}:slow:started", os.getpid())
    try:
        await asyncio.sleep(seconds)
    except asyncio.CancelledError:
        probe().set(f"{tag}:slow:cancelled", os.getpid())
        raise
    return "finally"


@tool(requires_approval=True)
def deploy(env: str, tag: str = "") -> str:
    """Deploys to an environment (after a person's approval)."""
    probe().incr(f"{tag}:deployed")
    return f"deployed to {env}"


@tool(name="deploy_soon", requires_approval=True, approval_expires=0.2)
def deploy_soon(env: str, tag: str = "") -> str:
    """Deploys to an environment; its approval expires after 0.2 s."""
    probe().incr(f"{tag}:deployed")
    return f"deployed to {env}"


@tool(timeout=0.05)
async def sluggish(tag: str = "") -> str:
    """Never answers in time."""
    await asyncio.sleep(5)
    return "too late"


@tool
def broken(x: int, tag: str = "") -> int:
    """Always raises."""
    raise ValueError(f"cannot handle {x}")


@tool(pool="db")
async def query(i: int, tag: str = "") -> int:
    """A query in pool ``db``: keeps how many run at once (the highest count too)."""
    p = probe()
    p.incr(f"{tag}:query:calls")
    now = p.incr(f"{tag}:query:now")
    try:
        p.high(f"{tag}:query:max", now)
        await asyncio.sleep(0.005 * (i + 1))
    finally:
        p.incr(f"{tag}:query:now", -1)
    return i


@tool(name="nothing", inline=True)
def noop(i: int = 0, tag: str = "") -> int:
    """Does nothing, fast."""
    return i


TOOLS = [add, slow, deploy, deploy_soon, sluggish, broken, query, noop]
REGISTRY = ToolRegistry(TOOLS)


def loop(model: str, *, max_turns: int = 10) -> ToolLoop:
    """A ToolLoop over every tool here, talking to the script named ``model``."""
    return ToolLoop(REGISTRY, max_turns=max_turns, model=model)


# -- scripted models -------------------------------------------------------------------------


def tool_messages(request: Any) -> int:
    return sum(1 for m in request.messages if m.role == "tool")


def add_then_answer(request):
    if tool_messages(request) == 0:
        return tool_call("add", a=1, b=2, tag=request.run_id)
    return text("1 + 2 = 3")


def always_add(request):
    return tool_call("add", a=1, b=tool_messages(request), tag=request.run_id)


def provider_down(request):
    raise ConnectionError("the provider is down")


async def thinks_for_a_second(request):
    probe().set(f"{request.run_id}:model:called", os.getpid())
    try:
        await asyncio.sleep(1.0)
    except asyncio.CancelledError:  # the run ended, in the process making the call
        probe().set(f"{request.run_id}:model:cancelled", os.getpid())
        raise
    probe().set(f"{request.run_id}:model:answered", os.getpid())
    return text("an answer nobody waits for")


def echo_size(request):
    """Says how long the task it was given is (it saw all of it)."""
    task = next(m.content for m in request.messages if m.role == "user")
    return text(f"{len(task)} chars")


def call_once_then_report(name: str, args: dict[str, Any], request):
    """Call tool ``name`` once, then report what it said."""
    if tool_messages(request) == 0:
        return tool_call(name, **args, tag=request.run_id)
    return text(f"tool said: {request.messages[-1].content}")


def turns(n: int, request):
    """``n`` model calls: a ``nothing`` call each, then an answer."""
    done = tool_messages(request)
    return tool_call("nothing", i=done, tag=request.run_id) if done < n - 1 else text(f"done after {done} tools")


SCRIPTS: dict[str, Callable[[Any], Any]] = {
    "add_then_answer": add_then_answer,
    "always_add": always_add,
    "provider_down": provider_down,
    "thinks_for_a_second": thinks_for_a_second,
    "echo_size": echo_size,
}


def scripted_model(request):
    """The script named by the request's ``model``: one of ``SCRIPTS``, ``once:<tool>``
    or ``once:<tool>:<JSON args>`` (call it, then report), or ``turns:<n>``."""
    name = request.model or ""
    probe().incr(f"{request.run_id}:model:calls")
    if name.startswith("once:"):
        _, tool_name, *rest = name.split(":", 2)
        return call_once_then_report(tool_name, json.loads(rest[0]) if rest else {}, request)
    if name.startswith("turns:"):
        return turns(int(name.split(":", 1)[1]), request)
    return SCRIPTS[name](request)


# -- algorithms ------------------------------------------------------------------------------


class FanOutConfig(BaseModel):
    tool: str
    n: int = 10


class FanOut(Algorithm):
    """Requests ``n`` calls of one tool at once (tagged with the run id); succeeds when
    all have answered."""

    name = "tests.scenarios.fanout"
    Config = FanOutConfig

    async def step(self, ctx, event):
        s = await ctx.project(LOOP)
        if not s.calls:
            for i in range(self.cfg.n):
                ctx.tool(self.cfg.tool, {"i": i, "tag": ctx.run_id}, call_id=f"c{i}")
        elif not s.waiting_for_tools:
            ctx.complete("success", {"ok": sum(r.ok for r in s.results.values())})


# -- wiring ----------------------------------------------------------------------------------


def attach(engine) -> None:
    """The handlers every process that delivers events needs."""
    LLMHandler(FakeLLMClient(scripted_model)).attach(engine)
    ToolHandler(REGISTRY, pools=POOLS).attach(engine)


def use_redis_probe() -> None:
    """In a worker: observations go to Redis, where the pytest process reads them."""
    global PROBE
    if not isinstance(PROBE, RedisProbe):
        PROBE = RedisProbe(os.environ["AAA_TEST_CELERY_BROKER"])
