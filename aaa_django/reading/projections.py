"""Projections by name: the ones the REST API and the admin may fold and show.

Built in: the engine's ``RUNMETA``, the loops' ``LOOP``, the model handler's
``CONVERSATION``, a conversation's ``TALK``, and the other algorithms' own; a site adds its own named projections with ``AAA["PROJECTIONS"]``
(dotted paths) or :func:`register`. A name is the projection's own ``name`` (its
snapshot key), e.g. ``aaa.runtime.engine.RUNMETA``; the short alias is the last
dotted part (``RUNMETA``) when no other projection has the same one.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable
from dataclasses import asdict, is_dataclass
from typing import Any

from django.utils.module_loading import import_string
from pydantic import TypeAdapter

from aaa_django.conf import aaa_settings
from aaa_django.events import Projection

_BUILT_IN = (
    "aaa_django.runtime.meta.RUNMETA",
    "aaa_django.algos.loops.LOOP",
    "aaa_django.llm.conversation.CONVERSATION",
    "aaa_django.runtime.conversation.TALK",
    "aaa_django.algos.refine.REFINE",
    "aaa_django.algos.plan.PLAN",
    "aaa_django.algos.control.WF",
    "aaa_django.algos.control.FSM_STATE",
    "aaa_django.algos.ensemble.SAMPLES",
)

_registered: dict[str, Projection] = {}
_lock = threading.Lock()


def register(projection: Projection) -> Projection:
    """Make a named projection readable by the API and the admin."""
    if not isinstance(projection, Projection) or not projection.name:
        raise ValueError("only a Projection with a name can be registered")
    with _lock:
        _registered[projection.name] = projection
    return projection


def _load(paths: Iterable[str]) -> dict[str, Projection]:
    """The named projections at ``paths`` (dotted), by name; paths that do not import
    are skipped (a built-in whose module is not there: checks report settings)."""
    found: dict[str, Projection] = {}
    for path in paths:
        try:
            p = import_string(path)
        except ImportError:
            continue
        if isinstance(p, Projection) and p.name:
            found[p.name] = p
    return found


def all_projections() -> dict[str, Projection]:
    """Every readable projection by full name (built-in, settings, registered)."""
    found = _load((*_BUILT_IN, *aaa_settings()["PROJECTIONS"]))
    with _lock:
        found.update(_registered)
    return found


def site_names() -> set[str]:
    """Names of the projections the site added (``AAA["PROJECTIONS"]`` and
    :func:`register`), as opposed to the library's built-ins."""
    names = set(_load(aaa_settings()["PROJECTIONS"]))
    with _lock:
        names.update(_registered)
    return names


def get(name: str) -> Projection | None:
    """The projection called ``name`` (full name or unambiguous short alias)."""
    every = all_projections()
    if name in every:
        return every[name]
    matches = [p for full, p in every.items() if full.rsplit(".", 1)[-1] == name]
    return matches[0] if len(matches) == 1 else None


def names() -> list[str]:
    return sorted(all_projections())


def state_json(state: Any) -> Any:
    """A folded state as JSON-ready data (pydantic models, dataclasses, plain values)."""
    if hasattr(state, "model_dump"):
        return state.model_dump(mode="json")
    if is_dataclass(state) and not isinstance(state, type):
        return asdict(state)
    return TypeAdapter(Any).dump_python(state, mode="json")
