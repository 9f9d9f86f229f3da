"""``ToolRegistry``: the tools a handler may run and a model may be offered."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from typing import Any

from aaa_django.data.jsonvalue import JSONObject

from .tool import Tool, tool


class ToolRegistry:
    """Tools by name. ``ToolRegistry([fetch_report, search])``; plain functions are
    wrapped with :func:`~aaa_django.tools.tool`."""

    def __init__(self, tools: Iterable[Tool | Callable[..., Any]] = ()) -> None:
        self._tools: dict[str, Tool] = {}
        for t in tools:
            self.add(t)

    def add(self, t: Tool | Callable[..., Any]) -> Tool:
        """Register a tool (a name can be registered once)."""
        t = t if isinstance(t, Tool) else tool(t)
        if t.name in self._tools and self._tools[t.name] is not t:
            raise ValueError(f"a tool named {t.name!r} is registered already")
        self._tools[t.name] = t
        return t

    def get(self, name: str) -> Tool | None:
        return self._tools.get(name)

    def __getitem__(self, name: str) -> Tool:
        return self._tools[name]

    def __contains__(self, name: object) -> bool:
        return name in self._tools

    def __iter__(self) -> Iterator[Tool]:
        return iter(self._tools.values())

    def __len__(self) -> int:
        return len(self._tools)

    def names(self) -> list[str]:
        return sorted(self._tools)

    def specs(self, names: Iterable[str] | None = None) -> list[JSONObject]:
        """The JSON specs of the tools (all, or the named ones), sorted by name."""
        chosen = sorted(names) if names is not None else self.names()
        return [self._tools[n].spec() for n in chosen]
