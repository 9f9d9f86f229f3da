"""The validation handler (pure core): bad input ends a run ``invalid_input``.

The engine attaches it to every engine by default, so it lives beside the engine
(:mod:`aaa_django.runtime.validation`); this is its name in the spec (``aaa.validate``).
"""

from aaa_django.runtime.validation import ValidationHandler, validate

__all__ = ["ValidationHandler", "validate"]
