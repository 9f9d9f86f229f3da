"""The two buses a scenario runs on, behind one small interface.

A scenario gets a :class:`Harness` and uses only this:

  ``h.engine()``         ``async with``: an engine whose events are delivered by the bus
  ``h.run_id()``         a fresh run id (ids of one length: token counts stay the same)
  ``h.probe``            what the tools and models observed (see ``site.py``)
  ``h.until(check)``     poll ``check()`` (sync or async) until it is true
  ``h.finish(engine, run_ids)``  wait for the first run's end and for its log to settle;
                         returns a :class:`Result`

``inprocess``: an :class:`~aaa_django.events.InMemoryEventStore` and the asyncio bus in
the pytest process (blobs in memory); the handlers are attached to the test's engine. ``celery``: the
Django store on PostgreSQL and the Celery bus (blobs in a directory the workers share); the test's engine only starts runs and
asks for things (cancel, approve), every delivery happens in real worker processes
(``tests.celery.site.setup`` attaches their handlers).
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import time
import uuid
from dataclasses import dataclass, field
from typing import Any, AsyncIterator, Callable

from aaa_django.data import InMemoryBlobStore
from aaa_django.events import Event, FoldCache, InMemoryEventStore
from aaa_django.runtime import Engine, InProcessBus, Outcome

from . import site


@dataclass
class Result:
    outcome: Outcome
    log: list[Event]
    seen: dict[str, Any] = field(default_factory=dict)
    errors: list[Any] = field(default_factory=list)


class Harness:
    name = "?"
    #: seconds a run may take (the Celery leg shares two cores with everything else)
    patience = 10.0

    def __init__(self) -> None:
        #: events the scenario's log should reach (its expected types); see ``finish``
        self.expected_events: int | None = None
        self.probe: Any = None

    def run_id(self) -> str:
        return f"run-{uuid.uuid4().hex[:12]}"

    def engine(self) -> Any:
        raise NotImplementedError

    async def settle(self, engine: Engine, run_ids: list[str]) -> None:
        raise NotImplementedError

    def errors(self, engine: Engine) -> list[Any]:
        return list(engine.errors) + list(getattr(engine.bus, "errors", []))

    async def until(self, check: Callable[[], Any], timeout: float | None = None, every: float = 0.01) -> None:
        end = time.monotonic() + (timeout or self.patience)
        while True:
            value = check()
            if inspect.isawaitable(value):
                value = await value
            if value:
                return
            if time.monotonic() > end:
                raise AssertionError(f"condition not met in time: {check}")
            await asyncio.sleep(every)

    async def finish(self, engine: Engine, run_ids: list[str], seen: dict | None = None) -> Result:
        """Wait for the first run to end and the bus to settle; collect the logs."""
        outcome = await engine.run(run_ids[0]).result(timeout=self.patience)
        await self.settle(engine, run_ids)
        return Result(outcome, await read_logs(engine, run_ids), seen or {}, self.errors(engine))


async def read_logs(engine: Engine, run_ids: list[str]) -> list[Event]:
    log: list[Event] = []
    for rid in run_ids:
        log.extend(await engine.store.read(rid))
    return log


class InProcess(Harness):
    """The embedded bus: asyncio tasks in this process, a memory store."""

    name = "inprocess"

    def __init__(self) -> None:
        super().__init__()
        self.probe = site.PROBE = site.MemoryProbe()

    @contextlib.asynccontextmanager
    async def engine(self) -> AsyncIterator[Engine]:
        engine = Engine(store=InMemoryEventStore(), bus=InProcessBus(), cache=FoldCache(), blobs=InMemoryBlobStore())
        site.attach(engine)
        async with engine:
            yield engine

    async def settle(self, engine: Engine, run_ids: list[str]) -> None:
        await engine.drain(self.patience)


class Celery(Harness):
    """The distributed bus: PostgreSQL, a Redis broker, real Celery workers."""

    name = "celery"
    patience = 30.0
    #: after the log has as many events as expected, how long to watch for more
    grace = 0.3

    def __init__(self, cluster: Any, broker: str) -> None:
        super().__init__()
        self.cluster = cluster
        self.probe = site.RedisProbe(broker)
        self._errors_before = len(cluster.errors())

    @contextlib.asynccontextmanager
    async def engine(self) -> AsyncIterator[Engine]:
        from tests.celery.conftest import make_engine

        async with make_engine(self.cluster.queues) as engine:
            yield engine

    async def settle(self, engine: Engine, run_ids: list[str]) -> None:
        # Deliveries run elsewhere: other runs' events may follow the first run's end,
        # and late results (a tool cancelled at the end) are tried, and refused, then.
        if self.expected_events is not None:

            async def enough() -> bool:
                return len(await read_logs(engine, run_ids)) >= self.expected_events

            await self.until(enough)
        await asyncio.sleep(self.grace)

    def errors(self, engine: Engine) -> list[Any]:
        return super().errors(engine) + self.cluster.errors()[self._errors_before :]
