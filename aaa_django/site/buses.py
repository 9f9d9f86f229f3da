"""The buses a site may name in ``AAA["BUS"]``, registered by the adapters that bring them.

``"inprocess"`` is the engine's own (:class:`~aaa_django.runtime.InProcessBus`). The
Celery adapter registers ``"celery"`` when the app is ready
(:mod:`aaa_django.celery.wiring`, from ``AaaConfig.ready``, where Celery is installed),
so the site's wiring names no bus of a layer above it and a site with only the base
requirements never imports Celery.
"""

from __future__ import annotations

from collections.abc import Callable

from django.core.exceptions import ImproperlyConfigured

from aaa_django.runtime import Bus

#: the bus the engine makes itself when given none
INPROCESS = "inprocess"

#: AAA["BUS"] -> a factory of that bus, as the adapters registered them
_FACTORIES: dict[str, Callable[[], Bus]] = {}


def register_bus(name: str, factory: Callable[[], Bus]) -> None:
    """Make ``AAA["BUS"] = name`` build its engines' bus with ``factory()``."""
    _FACTORIES[name] = factory


def site_bus(name: str) -> Bus | None:
    """A new bus for ``AAA["BUS"] = name``; None for the in-process bus (the engine
    makes its own). A name no adapter registered: ``ImproperlyConfigured`` saying
    what to install (the system check ``aaa.E101`` says so at start-up)."""
    if name == INPROCESS:
        return None
    factory = _FACTORIES.get(name)
    if factory is None:
        hint = " (pip install 'aaa_django[celery]')" if name == "celery" else ""
        raise ImproperlyConfigured(f"AAA['BUS'] is {name!r}, but no such bus is installed{hint}")
    return factory()
