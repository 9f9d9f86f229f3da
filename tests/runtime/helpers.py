"""Helpers for the engine tests: run coroutines, build engines, read logs.

No pytest-asyncio: each test drives its coroutine with ``asyncio.run``. Each engine
gets its own fold holder, so tests never share in-process state.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any, Awaitable, Callable

from aaa_django.events import Event, FoldCache, InMemoryEventStore
from aaa_django.llm import FakeLLMClient, LLMHandler
from aaa_django.runtime import Engine, InProcessBus
from aaa_django.tools import ToolHandler, ToolRegistry


class ReadCountingStore(InMemoryEventStore):
    """The in-memory store, counting the reads made of it (``reads``)."""

    def __init__(self) -> None:
        super().__init__()
        self.reads = 0

    async def read(self, *args: Any, **kwargs: Any) -> list[Event]:
        self.reads += 1
        return await super().read(*args, **kwargs)


def arun(coro: Awaitable[Any], timeout: float = 30) -> Any:
    """Run ``coro`` on a fresh loop, failing the test if it hangs."""

    async def bounded() -> Any:
        return await asyncio.wait_for(coro, timeout)

    return asyncio.run(bounded())


def make_engine(
    model: Callable | None = None,
    registry: ToolRegistry | None = None,
    *,
    duplicate: bool = False,
    store: Any = None,
    pools: dict[str, int] | None = None,
    tool_timeout: float | None = None,
    client: Any = None,
    bus: Any = None,
    **kwargs: Any,
) -> Engine:
    """An engine on a fresh memory store (unless given) with the handlers attached."""
    engine = Engine(
        store=store if store is not None else InMemoryEventStore(),
        bus=bus if bus is not None else InProcessBus(duplicate=duplicate),
        cache=FoldCache(),
        **kwargs,
    )
    if client is not None or model is not None:
        LLMHandler(client or FakeLLMClient(model)).attach(engine)
    if registry is not None:
        ToolHandler(registry, pools=pools, timeout=tool_timeout).attach(engine)
    return engine


def types(events: list[Event]) -> list[str]:
    return [e.type for e in events]


def trace(events: list[Event]) -> list[tuple[str, str]]:
    """(type, id) of each event, in log order: what double delivery must not change."""
    return [(e.type, e.id) for e in events]


def of_type(events: list[Event], type: str) -> list[Event]:
    return [e for e in events if e.type == type]


def in_flight(log: list[Event]) -> int:
    """Model attempts on ``log`` without a result (a crash cut them off)."""
    answered = {e.data.get("request_id") for e in log if e.type in ("aaa.llm.completed", "aaa.llm.failed")}
    return sum(1 for e in log if e.type == "aaa.llm.attempted" and e.data["request_id"] not in answered)


def check_resumed(log: list[Event], cut: list[Event], reference: list[Event], *, ordered: bool = False) -> None:
    """``log``, of a run resumed after a crash left ``cut``, is ``reference`` (the run
    uninterrupted) event for event, but for the model attempts the crash cut off: each
    is recorded abandoned and its call made again as attempt 2. Where calls go on in
    parallel (a fan-out, a workflow's branches), the resumed run may interleave them
    otherwise: the same events, each after the one it was derived from (``ordered``: a
    run of one call at a time, in the very same order)."""
    abandoned = of_type(log, "aaa.llm.abandoned")
    assert len(abandoned) == in_flight(cut)
    retried = [e for e in log if e.type == "aaa.llm.attempted" and e.data["attempt"] > 1]
    assert sorted((e.data["request_id"], e.data["attempt"]) for e in retried) == sorted(
        (e.data["request_id"], 2) for e in abandoned
    )
    first_tries = [e for e in log if e not in abandoned and e not in retried]
    assert sorted(trace(first_tries)) == sorted(trace(reference))  # the very same events, id for id
    if ordered:
        assert trace(first_tries) == trace(reference)
    seqs = {e.id: e.seq for e in log}
    assert all(seqs[e.causation] < e.seq for e in log if e.causation in seqs)


async def until(check: Callable[[], Awaitable[bool]], timeout: float = 5.0, every: float = 0.005) -> None:
    """Poll ``check`` until it is true (fails after ``timeout`` seconds)."""
    end = time.monotonic() + timeout
    while not await check():
        if time.monotonic() > end:
            raise AssertionError("condition not met in time")
        await asyncio.sleep(every)


#: a deadline no test run reaches by the clock: the test passes it (:func:`pass_deadline`)
FAR_DEADLINE = 3600.0


async def pass_deadline(engine: Engine, run_id: str) -> list[Event]:
    """Pass ``run_id``'s deadline now, through the engine's timer API (what its loop
    timer, or the workers' duty, calls when the time comes): the test decides when
    the deadline falls, not the machine's load. Returns the events appended."""
    deadline = (await engine.meta(run_id, fresh=True)).deadline
    assert deadline is not None, f"run {run_id} has no deadline"
    return await engine.fire_due(run_id, now=deadline)


class Crash(Exception):
    """The process died."""


class CrashingStore:
    """A store that dies once ``limit`` events have been appended (batches are atomic:
    a batch that would go past the limit is not written)."""

    def __init__(self, inner: InMemoryEventStore, limit: int) -> None:
        self.inner = inner
        self.limit = limit
        self.appended = 0
        self.crashed = asyncio.Event()
        self.cache_key = inner.cache_key

    async def append(self, events, **kwargs):
        if self.crashed.is_set() or self.appended + len(events) > self.limit:
            self.crashed.set()
            raise Crash(f"crashed after {self.appended} events")
        stored = await self.inner.append(events, **kwargs)
        self.appended += len(stored)
        return stored

    def __getattr__(self, name):
        return getattr(self.inner, name)


def tool_messages(request: Any) -> int:
    return sum(1 for m in request.messages if m.role == "tool")
