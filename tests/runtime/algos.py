"""Small algorithms the engine tests run (registered at import, like any worker's)."""

from __future__ import annotations

from pydantic import BaseModel, Field

from aaa_django.algos import LOOP, Algorithm
from aaa_django.events import Projection
from aaa_django.runtime.event_types import CHILD_COMPLETED, CHILD_REQUESTED


class Boom(Algorithm):
    """Raises inside its step: the run must end ``failed`` with the traceback."""

    name = "tests.boom"

    async def step(self, ctx, event):
        raise RuntimeError("the algorithm blew up")


class FanOutConfig(BaseModel):
    tool: str
    n: int = 10


class FanOut(Algorithm):
    """Requests ``n`` calls of one tool at once; succeeds when all have answered."""

    name = "tests.fanout"
    Config = FanOutConfig

    async def step(self, ctx, event):
        s = await ctx.project(LOOP)
        if not s.calls:
            for i in range(self.cfg.n):
                ctx.tool(self.cfg.tool, {"i": i}, call_id=f"c{i}")
        elif not s.waiting_for_tools:
            ctx.complete("success", {"ok": sum(r.ok for r in s.results.values())})


class ChildResults(BaseModel):
    requested: list[str] = Field(default_factory=list)
    done: dict[str, dict] = Field(default_factory=dict)


def _children(s: ChildResults, e) -> ChildResults:
    if e.type == CHILD_REQUESTED:
        s.requested.append(e.data["key"])
    elif e.type == CHILD_COMPLETED:
        s.done[e.data["key"]] = {"outcome": e.data["outcome"], "value": e.data["value"]}
    return s


CHILDREN = Projection(ChildResults, _children, name="tests.CHILDREN", version=1, state_type=ChildResults)


class ParentConfig(BaseModel):
    child: dict  # {"algorithm": name, "config": {...}}
    key: str | None = "only"  # None: let ctx.child derive the key


class Parent(Algorithm):
    """Starts one child run and ends with the child's outcome and value."""

    name = "tests.parent"
    Config = ParentConfig

    async def step(self, ctx, event):
        s = await ctx.project(CHILDREN)
        if not s.requested:
            from aaa_django.runtime import registry

            child = registry.build(self.cfg.child["algorithm"], self.cfg.child.get("config", {}))
            ctx.child(child, ctx.raw_input, key=self.cfg.key)
        elif s.done:
            (got,) = s.done.values()
            ctx.complete(got["outcome"], {"child": got["value"]})


class BadOutput(Algorithm):
    """Emits an event whose data is not JSON: its own failure, not the bus's."""

    name = "tests.bad_output"

    async def step(self, ctx, event):
        ctx.emit("tests.thing.happened", {"when": object()}, key="x")


def _count(n: int, e) -> int:
    return n + 1


#: no snapshots and first read in a step: a whole-stream read (no ``after``)
COUNT = Projection(lambda: 0, _count, name="tests.COUNT")


class Reader(Algorithm):
    """On ``tests.go.given`` reads a projection in its step, then finishes."""

    name = "tests.reader"

    async def step(self, ctx, event):
        if event.type == "tests.go.given":
            ctx.complete("success", {"events": await ctx.project(COUNT)})


class ExplodesOnResult(Algorithm):
    """Asks the model once; raises in its step on the model's reply."""

    name = "tests.explodes_on_result"

    async def step(self, ctx, event):
        if event.type == "aaa.llm.completed":
            raise RuntimeError(f"boom on {event.type}")
        if event.type == "aaa.input.validated":
            ctx.llm([{"role": "user", "content": "add 1 and 2"}], key="ask")
