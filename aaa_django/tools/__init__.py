"""Tools: the @tool decorator, the registry, the tool handler and its execution guard (pure core)."""

from .handler import ToolHandler
from .registry import ToolRegistry
from .tool import GuardConfig, SchemaTool, Tool, tool

__all__ = ["GuardConfig", "SchemaTool", "Tool", "ToolHandler", "ToolRegistry", "tool"]
