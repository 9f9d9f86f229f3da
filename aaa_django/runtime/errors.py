"""Exceptions of the engine's public calls that a caller can act on."""

from __future__ import annotations


class RunNotEndedError(Exception):
    """The call needs a run that has ended, and this one has not (``Engine.erase``:
    cancel it, then erase it). The REST API answers 409, the admin says so."""
