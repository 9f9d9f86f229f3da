"""Algorithms by stable name: how any process rebuilds a run's algorithm.

``aaa.run.started`` records ``{"algorithm": name, "config": {...}}``; the engine
rebuilds the algorithm with ``get(name).from_config(config)``. A class is registered
when it is defined (``Algorithm`` subclasses with a ``name``) or with ``@register``,
so a worker only has to import the module that defines it.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any, TypeVar, overload

from aaa_django.events import EventError

A = TypeVar("A", bound=type)

_registry: dict[str, type] = {}
_lock = threading.Lock()


class UnknownAlgorithmError(EventError, LookupError):
    """No algorithm is registered under a name (import the module that defines it)."""


@overload
def register(cls: A, *, name: str | None = None) -> A: ...


@overload
def register(cls: None = None, *, name: str | None = None) -> Callable[[A], A]: ...


def register(cls: A | None = None, *, name: str | None = None) -> A | Callable[[A], A]:
    """Register an algorithm class under ``name`` (default: its ``name`` attribute).

    Usable bare (``@register``) or with a name (``@register(name="acme.summarise")``).
    Registering the same class again is a no-op; another class under a taken name is
    an error (two workers would rebuild different algorithms from one log).
    """

    def deco(c: A) -> A:
        key = name or getattr(c, "name", None)
        if not isinstance(key, str) or not key:
            raise ValueError(f"{c.__qualname__} needs a non-empty string `name` to be registered")
        with _lock:
            old = _registry.get(key)
            if old is not None and _qualname(old) != _qualname(c):
                raise ValueError(f"algorithm name {key!r} is taken by {_qualname(old)}; cannot register {_qualname(c)}")
            _registry[key] = c
        if getattr(c, "name", None) != key:
            setattr(c, "name", key)  # noqa: B010  (``A`` is any class: it may declare no name)
        return c

    return deco(cls) if cls is not None else deco


def get(name: str) -> type:
    """The class registered under ``name``."""
    try:
        return _registry[name]
    except KeyError:
        raise UnknownAlgorithmError(
            f"no algorithm is registered as {name!r}; import the module that defines it"
        ) from None


def known(name: str) -> bool:
    """Whether ``name`` is registered in this process."""
    return name in _registry


def names() -> list[str]:
    """Every registered name, sorted."""
    return sorted(_registry)


def build(name: str, config: dict[str, Any]) -> Any:
    """A fresh algorithm instance from its registered name and JSON config."""
    cls = get(name)
    factory: Callable[[dict[str, Any]], Any] = getattr(cls, "from_config")
    return factory(config or {})


def _qualname(c: type) -> str:
    return f"{c.__module__}.{c.__qualname__}"
