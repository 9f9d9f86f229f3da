"""The agents a caller may name in a run's config: those of ``AAA["AGENTS"]``, by name.

A ``PydanticAIAgent`` run's ``config.agent`` is a dotted path, and the algorithm's own
check resolves it in the process's loaded modules. A path from a stranger is compared
with the site's list first, as text, so nothing is looked up (let alone imported) for a
path the site does not serve, and the answer names the agents it does, nothing about
the process. A config may name an agent run further down too (a workflow's child node,
a plan's executor: ``{"algorithm": ..., "config": {...}}``): each is checked the same way.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from aaa_django.algos import PydanticAIAgent
from aaa_django.conf import aaa_settings
from aaa_django.runtime import UnknownAlgorithmError, dotted, registry

from .errors import ApiError, Loc

#: how deep a config's nested algorithm references are followed
MAX_NESTING = 16


def served() -> list[str]:
    """The dotted paths of ``AAA["AGENTS"]``."""
    paths = aaa_settings().get("AGENTS") or ()
    return [p for p in paths if isinstance(p, str)] if isinstance(paths, (list, tuple)) else []


def check(algorithm: object, config: object, loc: Loc) -> None:
    """Raise a 422 :class:`ApiError` naming the served agents when ``config`` (of a run
    of ``algorithm``, at ``loc`` in the request) names an agent the site does not serve."""
    allowed = served()
    keys = {_key(p) for p in allowed}
    for where, agent in _agents(algorithm, config, list(loc), 0):
        if not isinstance(agent, str) or _key(agent) not in keys:
            names = ", ".join(allowed) if allowed else "none (AAA['AGENTS'] is empty)"
            raise ApiError(
                422, [*where, "agent"], f"not an agent this site serves; it serves: {names}", "unknown_agent"
            )


def _key(path: str) -> tuple[str, str] | None:
    """``(module, name)`` of a dotted path (``"m:a"`` and ``"m.a"`` are one agent)."""
    try:
        return dotted.split(path)
    except ValueError:
        return None


def _is_agent(algorithm: object) -> bool:
    if not isinstance(algorithm, str):
        return False
    try:
        cls = registry.get(algorithm)
    except UnknownAlgorithmError:
        return False
    return isinstance(cls, type) and issubclass(cls, PydanticAIAgent)


def _agents(
    algorithm: object, config: object, loc: list[str | int], depth: int
) -> Iterator[tuple[list[str | int], object]]:
    """``(loc, agent)`` of every agent the config names: its own, if ``algorithm`` runs
    an agent, and those of the algorithm references nested in it."""
    if not isinstance(config, dict) or depth > MAX_NESTING:
        return
    if _is_agent(algorithm) and "agent" in config:
        yield loc, config["agent"]
    yield from _nested(config, loc, depth)


def _nested(value: object, loc: list[str | int], depth: int) -> Iterator[tuple[list[str | int], object]]:
    if depth > MAX_NESTING:
        return
    items: Any = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, list) else ()
    for k, v in items:
        if isinstance(v, dict) and "algorithm" in v and isinstance(v.get("config"), dict):
            yield from _agents(v["algorithm"], v["config"], [*loc, k, "config"], depth + 1)
        elif isinstance(v, (dict, list)):
            yield from _nested(v, [*loc, k], depth + 1)
