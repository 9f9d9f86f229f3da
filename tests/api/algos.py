"""Algorithms and tools the API tests start through the REST API (registered at import)."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from aaa_django.algos import LOOP, Algorithm
from aaa_django.runtime.event_types import INPUT_VALIDATED
from aaa_django.tools import tool


class EchoIn(BaseModel):
    model_config = ConfigDict(extra="forbid")

    text: str = Field(min_length=1)


class Echo(Algorithm):
    """Ends ``success`` with ``{"echo": text}`` as soon as its input is validated."""

    name = "tests.api.echo"
    Input = EchoIn

    async def step(self, ctx, event):
        if event.type == INPUT_VALIDATED:
            ctx.complete("success", {"echo": ctx.input.text})


class Idle(Algorithm):
    """Never ends by itself: only a limit or a cancellation ends it."""

    name = "tests.api.idle"

    async def step(self, ctx, event):
        return None


class GatedConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    tool: str = "guarded"
    calls: int = Field(default=1, ge=1, le=5)


class Gated(Algorithm):
    """Calls a tool (``guarded`` needs an approval) and ends with what it returned:
    ``success`` if every call succeeded, else ``no_solution``."""

    name = "tests.api.gated"
    Config = GatedConfig

    async def step(self, ctx, event):
        s = await ctx.project(LOOP)
        if not s.calls:
            if event.type == INPUT_VALIDATED:
                for i in range(self.cfg.calls):
                    ctx.tool(self.cfg.tool, {"x": i + 1}, call_id=f"c{i + 1}")
        elif not s.waiting_for_tools:
            ok = all(r.ok for r in s.results.values())
            ctx.complete("success" if ok else "no_solution", {c: r.content for c, r in sorted(s.results.items())})


def _double(x: int) -> int:
    """Double a number (only once someone with the right approved it)."""
    return 2 * x


guarded = tool(_double, name="guarded", requires_approval=True, inline=True)


def fake_model():
    """An LLM_CLIENT factory: a scripted model that answers at once."""
    from aaa_django.llm import FakeLLMClient
    from aaa_django.llm.fake import text

    return FakeLLMClient(lambda request: text("scripted answer"))
