"""Tools: the @tool decorator, the registry, the tool handler and its execution guard (pure core).
A tool asks a person by raising :class:`Ask` (the answer is its result)."""

from aaa_django.runtime.conversation import Ask

from .handler import ToolHandler
from .registry import ToolRegistry
from .tool import GuardConfig, SchemaTool, Tool, tool

__all__ = ["Ask", "GuardConfig", "SchemaTool", "Tool", "ToolHandler", "ToolRegistry", "tool"]
