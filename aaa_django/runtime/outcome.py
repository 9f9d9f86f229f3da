"""``Outcome``: how a run ended (one of seven, distinct on purpose)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

SUCCESS = "success"
NO_SOLUTION = "no_solution"
TIMEOUT = "timeout"
BUDGET_EXCEEDED = "budget_exceeded"
INVALID_INPUT = "invalid_input"
CANCELLED = "cancelled"
FAILED = "failed"

OUTCOMES: tuple[str, ...] = (
    SUCCESS,
    NO_SOLUTION,
    TIMEOUT,
    BUDGET_EXCEEDED,
    INVALID_INPUT,
    CANCELLED,
    FAILED,
)


@dataclass(frozen=True, slots=True)
class Outcome:
    """The end of a run: ``outcome`` (one of :data:`OUTCOMES`) and a JSON ``value``.

    ``value`` is the algorithm's answer on success (ToolLoop: ``{"text": ...}``) and
    the reason otherwise (``{"dimension": "tokens", ...}``, ``{"errors": [...]}``,
    ``{"error": ..., "traceback": ...}``).
    """

    outcome: str
    value: Any = None

    def __post_init__(self) -> None:
        if self.outcome not in OUTCOMES:
            raise ValueError(f"outcome must be one of {OUTCOMES}, got {self.outcome!r}")

    @property
    def ok(self) -> bool:
        """True only for ``success``."""
        return self.outcome == SUCCESS

    def to_dict(self) -> dict[str, Any]:
        """The data of the ``aaa.run.completed`` event."""
        return {"outcome": self.outcome, "value": self.value}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Outcome:
        return cls(data["outcome"], data.get("value"))
