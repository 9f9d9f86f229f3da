"""What a model call cost, from its token usage and a pricing table.

A table maps a model name to dollars per *million* tokens, the way providers publish
their prices::

    Pricing({"gpt-4o-mini": {"input": 0.15, "output": 0.60},
             "claude-sonnet-4-5": {"input": 3.0, "output": 15.0}})

A model is looked up by the name the provider answered with first (e.g.
``gpt-4o-mini-2024-07-18``), then by the name that was asked for (``gpt-4o-mini``):
exact names only, so one model is never priced as another that shares a prefix. A
model in neither is *unpriced*: its cost is 0 and :attr:`Cost.priced` is False (the
client logs a warning once per model, the event says ``"priced": false``, and a run
with a cost budget over an unpriced model is refused at its start), so a budget on
cost never silently passes for a model nobody priced.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

from .messages import Usage

PER = 1_000_000


@dataclass(frozen=True, slots=True)
class Price:
    """Dollars per million input and output tokens."""

    input: float
    output: float


@dataclass(frozen=True, slots=True)
class Cost:
    """A call's cost in dollars; ``priced`` is False when the model had no price."""

    usd: float
    priced: bool
    #: the table entry used (None when unpriced)
    model: str | None = None


class Pricing:
    """A pricing table; raises ``ValueError`` for a malformed one (at start-up)."""

    def __init__(self, table: Mapping[str, Mapping[str, object]] | None = None) -> None:
        self.prices: dict[str, Price] = {}
        for model, entry in (table or {}).items():
            if not isinstance(model, str) or not isinstance(entry, Mapping):
                raise ValueError(f"pricing: {model!r} must map a model name to {{'input': ..., 'output': ...}}")
            unknown = set(entry) - {"input", "output"}
            if unknown:
                raise ValueError(f"pricing[{model!r}]: unknown keys {sorted(unknown)} (only 'input' and 'output')")
            values = []
            for key in ("input", "output"):
                v = entry.get(key)
                if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v < 0:
                    raise ValueError(f"pricing[{model!r}][{key!r}] must be a number >= 0 ($ per 1M tokens), got {v!r}")
                values.append(float(v))
            self.prices[model] = Price(*values)

    def __bool__(self) -> bool:
        return bool(self.prices)

    def __repr__(self) -> str:
        return f"Pricing({len(self.prices)} models)"

    def price(self, *models: str | None) -> tuple[str, Price] | None:
        """The first of ``models`` that has a price, with it."""
        for m in models:
            if m and m in self.prices:
                return m, self.prices[m]
        return None

    def cost(self, usage: Usage, *models: str | None) -> Cost:
        """The cost of ``usage`` for the first of ``models`` that has a price."""
        found = self.price(*models)
        if found is None:
            return Cost(0.0, False)
        name, p = found
        usd = (usage.input_tokens * p.input + usage.output_tokens * p.output) / PER
        return Cost(round(usd, 12), True, name)


def as_pricing(pricing: Pricing | Mapping[str, Mapping[str, object]] | None) -> Pricing:
    """A :class:`Pricing` from a table, a ``Pricing`` or None (an empty table)."""
    return pricing if isinstance(pricing, Pricing) else Pricing(pricing)
