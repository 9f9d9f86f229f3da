"""The example site's garbage collector, set for a process that carries many runs.

A process that carries hundreds of runs at once spends a fifth of its CPU or more in
Python's garbage collector at its default thresholds: the objects of a run waiting on its
model live long enough to reach the oldest generation, and each full collection walks
all of them and every module the process has loaded, while every run waits (docs/engine.md:
many runs in one process). The site's processes raise the first threshold and, once they
have started, freeze what they loaded: :func:`tune`, called by ``project/wsgi.py``,
``project/asgi.py`` and the Celery worker (``project/celery.py``).

This is the site's choice, not the app's: ``aaa_django`` never changes the collector of
the process it runs in. ``AAA_GC_THRESHOLD`` sets the thresholds (``G0,G1,G2``), or
``python`` leaves the collector as Python set it. The site's settings read it too, so a
wrong value stops every command with its reason; :func:`tune` reads it from the
environment, not from the settings, as the site's entry points may be served with
other settings (the test suite serves ``project/asgi.py`` with its own).
"""

from __future__ import annotations

import gc
import os

from django.core.exceptions import ImproperlyConfigured

#: the collector's thresholds for the site's processes (Python's own: 700, 10, 10; on 3.13 2000, 10, 10)
THRESHOLD = (10_000, 10, 10)


def threshold(value: str | None) -> tuple[int, int, int] | None:
    """``AAA_GC_THRESHOLD`` read: the thresholds, or None for Python's own (``python``)."""
    value = (value or "").strip()
    if not value:
        return THRESHOLD
    if value == "python":
        return None
    try:
        parts = tuple(int(part) for part in value.split(","))
    except ValueError:
        parts = ()
    if len(parts) != 3 or parts[0] < 1 or min(parts) < 0:
        raise ImproperlyConfigured(
            f"AAA_GC_THRESHOLD={value!r}: three whole numbers G0,G1,G2 (G0 at least 1), e.g. "
            f"{','.join(map(str, THRESHOLD))}; or 'python' to leave the collector as Python set it"
        )
    return parts[0], parts[1], parts[2]


def tune() -> tuple[int, int, int] | None:
    """Set this process's collector as ``AAA_GC_THRESHOLD`` says (see the module), and
    freeze what the process holds now (the collector no longer walks it): call it once
    the process has loaded the site. The thresholds set, or None."""
    chosen = threshold(os.environ.get("AAA_GC_THRESHOLD"))
    if chosen is None:
        return None
    gc.set_threshold(*chosen)
    gc.freeze()
    return chosen
