"""Agent algorithms built on the engine (pure core).

Importing this package registers every built-in algorithm under its stable name
(``aaa.algos.ToolLoop``, ``aaa.algos.GeneratorCritic``...), so a worker can rebuild
any run's algorithm from its ``aaa.run.started``. See ``docs/algorithms.md``
(``PydanticAIAgent``, a Pydantic AI agent run durably: ``docs/agents.md``; it needs
``pydantic-ai-slim`` only when a run of it steps).
"""

from .base import Algorithm, NoConfig
from .control import FSM, FSM_STATE, WF, FsmRun, WorkflowGraph, WorkflowState
from .ensemble import SAMPLES, SamplesState, SelfConsistency
from .loops import LOOP, LoopState, ReAct, ToolLoop
from .plan import PLAN, PlanAndExecute, PlanState
from .pydantic_agent import PydanticAIAgent
from .refine import REFINE, GenerateTestRepair, GeneratorCritic, RefineState

__all__ = [
    "FSM",
    "FSM_STATE",
    "LOOP",
    "PLAN",
    "REFINE",
    "SAMPLES",
    "WF",
    "Algorithm",
    "FsmRun",
    "GenerateTestRepair",
    "GeneratorCritic",
    "LoopState",
    "NoConfig",
    "PlanAndExecute",
    "PlanState",
    "PydanticAIAgent",
    "ReAct",
    "RefineState",
    "SamplesState",
    "SelfConsistency",
    "ToolLoop",
    "WorkflowGraph",
    "WorkflowState",
]
