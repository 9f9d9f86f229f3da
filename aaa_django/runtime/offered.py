"""The tools a run's model is offered, settled when the run starts.

An algorithm whose model is offered tools (:class:`ChoosesTools`: ``ToolLoop``,
``ReAct``) says in its config which: none named (the default) offers every tool the
engine runs, names (``["lookup", "mcp_calc_multiply"]``) offer those, and JSON specs
stay possible for tools served elsewhere. The engine resolves the choice against its
tool handlers (:class:`~aaa_django.runtime.engine_api.ServesTools`: the
``ToolHandler``) when it writes the run's ``aaa.run.started`` (:func:`resolve`, from
``Engine.start`` and a child run's start), so the log holds the specs the model is
offered, whichever process runs the run and however it was started. A name no
handler serves stays a name: the validation of the run's start refuses it
(:func:`tool_errors`, ``invalid_input``), and the REST API asks the same before it
starts a run (422).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol, runtime_checkable

from . import registry
from .engine_api import EngineAPI


@runtime_checkable
class ChoosesTools(Protocol):
    """An algorithm class whose config chooses the tools its model is offered."""

    @classmethod
    def chosen_tools(cls, config: Mapping[str, Any]) -> object:
        """The config's choice: None (every tool the engine runs) or a list of tool
        names and JSON specs."""
        ...

    @classmethod
    def with_tools(cls, config: Mapping[str, Any], tools: list[Any]) -> dict[str, Any]:
        """``config`` offering exactly ``tools`` (specs; a name no handler serves)."""
        ...


def served(engine: EngineAPI) -> dict[str, dict[str, Any]]:
    """The JSON spec of every tool the engine's tool handlers run, by name, sorted."""
    specs: dict[str, dict[str, Any]] = {}
    for server in engine.tool_servers:
        for spec in server.tool_specs():
            specs.setdefault(spec["name"], spec)
    return dict(sorted(specs.items()))


def _choice(algorithm: str, config: Mapping[str, Any]) -> tuple[ChoosesTools | None, object]:
    """(the algorithm class if it chooses tools, its config's choice)."""
    if not registry.known(algorithm):
        return None, None
    cls = registry.get(algorithm)
    if not isinstance(cls, ChoosesTools):
        return None, None
    return cls, cls.chosen_tools(config)


def resolve(engine: EngineAPI, algorithm: str, config: dict[str, Any]) -> dict[str, Any]:
    """``config`` with its tools settled: every tool the engine runs when it names
    none, each name replaced by its spec; specs and unknown names stay as given. Any
    other algorithm's config is returned as it is."""
    cls, chosen = _choice(algorithm, config)
    if cls is None or not (chosen is None or isinstance(chosen, list)):
        return config  # not a choice of tools (a config the algorithm will refuse)
    specs = served(engine)
    if chosen is None:
        return cls.with_tools(config, list(specs.values()))
    return cls.with_tools(config, [specs.get(t, t) if isinstance(t, str) else t for t in chosen])


def tool_errors(engine: EngineAPI, algorithm: str, config: object, *, resolved: bool = False) -> list[dict[str, Any]]:
    """Tool names in ``config`` that no tool handler of the engine serves, in
    pydantic's error shape (``loc`` ``["config", "tools", i]``, type ``unknown_tool``,
    a message naming the tools there are). ``resolved``: ``config`` is a started
    run's, whose names were resolved where it started, so any name left is one."""
    if not isinstance(config, Mapping):
        return []
    cls, chosen = _choice(algorithm, config)
    if cls is None or not isinstance(chosen, list):
        return []
    specs = served(engine)
    where = "where the run started" if resolved else "here"
    there = ", ".join(specs) or "none"
    return [
        {
            "loc": ["config", "tools", i],
            "type": "unknown_tool",
            "input": name,
            "msg": f"no tool named {name!r} is served {where} (the tools: {there})",
        }
        for i, name in enumerate(chosen)
        if isinstance(name, str) and (resolved or name not in specs)
    ]


def names_chosen(algorithm: str, config: object) -> list[str]:
    """The tool names ``config`` gives (none for an algorithm that offers no tools)."""
    if not isinstance(config, Mapping):
        return []
    _, chosen = _choice(algorithm, config)
    return [t for t in chosen if isinstance(t, str)] if isinstance(chosen, list) else []
