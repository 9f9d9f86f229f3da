"""The engine: runs, contexts, budgets, outcomes and the in-process bus (pure core).

``async with Engine(...) as engine``; ``run = await engine.start(algorithm, input)``;
``outcome = await run.result()``. See :mod:`aaa_django.runtime.engine`.
"""

from . import event_types
from .budget import Budget, Spend
from .bus import Bus, ExclusiveLeases, InProcessBus
from .ctx import Ctx
from .engine import Engine
from .engine_api import Stored
from .errors import RunNotEndedError
from .meta import RUNMETA, RunMeta
from .outcome import (
    BUDGET_EXCEEDED,
    CANCELLED,
    FAILED,
    INVALID_INPUT,
    NO_SOLUTION,
    OUTCOMES,
    SUCCESS,
    TIMEOUT,
    Outcome,
)
from .registry import UnknownAlgorithmError, register
from .retry import Backoff, Redelivery
from .run import Run
from .view import StoreUnavailable

__all__ = [
    "BUDGET_EXCEEDED",
    "CANCELLED",
    "FAILED",
    "INVALID_INPUT",
    "NO_SOLUTION",
    "OUTCOMES",
    "RUNMETA",
    "SUCCESS",
    "TIMEOUT",
    "Backoff",
    "Budget",
    "Bus",
    "Ctx",
    "Engine",
    "ExclusiveLeases",
    "InProcessBus",
    "Outcome",
    "Redelivery",
    "Run",
    "RunMeta",
    "RunNotEndedError",
    "Spend",
    "StoreUnavailable",
    "Stored",
    "UnknownAlgorithmError",
    "event_types",
    "register",
]
