"""``Budget``: the spend limits of a run, enforced by the engine."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field


class Spend(BaseModel):
    """What a run has used so far (folded by RUNMETA from hot fields only)."""

    tokens_in: int = 0
    tokens_out: int = 0
    cost: float = 0.0
    #: model and tool *requests* (counted when asked, so a call over budget never runs)
    model_calls: int = 0
    tool_calls: int = 0
    #: attempts sent to a model provider (a call retried, or asked again after its
    #: process died, makes more than one), and of those the ones abandoned in flight
    #: (their tokens and cost counted at the attempt's estimate)
    attempts: int = 0
    abandoned: int = 0

    @property
    def tokens(self) -> int:
        return self.tokens_in + self.tokens_out


class Budget(BaseModel):
    """Limits on a run's spend; ``None`` means unlimited.

    - ``tokens`` (input + output) and ``cost`` are known only after a model call, so
      the run ends ``budget_exceeded`` as soon as the spend goes *over* the limit;
    - ``model_calls`` and ``tool_calls`` are counted when requested: the request that
      would be call number ``limit + 1`` ends the run instead of being recorded (see
      :meth:`refuses`), so the spend says the calls made, never one that was not.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    tokens: int | None = Field(default=None, ge=0)
    cost: float | None = Field(default=None, ge=0)
    model_calls: int | None = Field(default=None, ge=0)
    tool_calls: int | None = Field(default=None, ge=0)

    def exceeded(self, spend: Spend) -> dict | None:
        """The first dimension over its limit, as ``{"dimension", "limit", "spent"}``."""
        checks = (
            ("tokens", self.tokens, spend.tokens),
            ("cost", self.cost, spend.cost),
            ("model_calls", self.model_calls, spend.model_calls),
            ("tool_calls", self.tool_calls, spend.tool_calls),
        )
        for dimension, limit, spent in checks:
            if limit is not None and spent > limit:
                return {"dimension": dimension, "limit": limit, "spent": spent}
        return None

    def refuses(self, spend: Spend, *, model_calls: int = 0, tool_calls: int = 0) -> dict | None:
        """Would ``model_calls`` and ``tool_calls`` more requests take a call count over
        its limit? Then the first such dimension, as ``{"dimension", "limit", "spent"}``
        with what was spent before them (the requests are never made)."""
        checks = (
            ("model_calls", self.model_calls, spend.model_calls, model_calls),
            ("tool_calls", self.tool_calls, spend.tool_calls, tool_calls),
        )
        for dimension, limit, spent, more in checks:
            if limit is not None and more and spent + more > limit:
                return {"dimension": dimension, "limit": limit, "spent": spent}
        return None
