"""The validation handler (pure core): bad input ends a run ``invalid_input``."""

from .handler import ValidationHandler, validate

__all__ = ["ValidationHandler", "validate"]
