"""Objects a run's config names by a dotted path (``"package.module:name"`` or
``"package.module.name"``): an agent, the pydantic model of a structured result.

A config may come from a stranger (the REST API), and naming a module there must not
import it: :func:`loaded` finds only what this process has imported already (the site's
settings and code load what it serves); :func:`load` imports, for code that names what
it trusts (a class in hand, a path the process wrote itself).
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable
from functools import reduce


def split(path: str) -> tuple[str, str]:
    """``(module, attribute)`` of a dotted path; ``ValueError`` for a malformed one."""
    module, _, attr = path.partition(":") if ":" in path else path.rpartition(".")
    if not module or not attr:
        raise ValueError(f"{path!r} is not a dotted path 'package.module:name'")
    return module, attr


def loaded(path: str) -> object:
    """The object at ``path`` in a module this process has imported; ``ValueError``
    when the module is not loaded (nothing is imported) or has no such name."""
    module, attr = split(path)
    if module not in sys.modules:
        raise ValueError(f"{path!r}: its module is not loaded in this process")
    try:
        return reduce(getattr, attr.split("."), sys.modules[module])
    except AttributeError:
        raise ValueError(f"{path!r}: module {module} has no {attr}") from None


def load(path: str) -> object:
    """The object at ``path``, its module imported if need be."""
    importlib.import_module(split(path)[0])
    return loaded(path)


def path_of(obj: type | Callable[..., object]) -> str:
    """The dotted path :func:`loaded` finds ``obj`` by (a class or a function)."""
    return f"{obj.__module__}:{obj.__qualname__}"
