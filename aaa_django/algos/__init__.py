"""Agent algorithms built on the engine (pure core)."""

from .base import Algorithm, NoConfig
from .loops import LOOP, LoopState, ReAct, ToolLoop

__all__ = ["LOOP", "Algorithm", "LoopState", "NoConfig", "ReAct", "ToolLoop"]
