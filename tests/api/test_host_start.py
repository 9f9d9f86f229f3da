"""The web process's engine host starting slowly (the first request after a deploy on
a loaded machine: the model client's library to import, MCP servers to start,
``WORKER_SETUP`` to run): a request waits for it up to its bound, then gets
``EngineUnavailable`` (503) while the same host goes on starting; the next request
gets that host, never a second one built beside it."""

from __future__ import annotations

import threading

import pytest

from aaa_django.site.host import EngineHost, EngineUnavailable

GATE = threading.Event()
BUILT: list = []


def slow_setup(engine) -> None:
    """A ``WORKER_SETUP`` that finishes when the test lets it."""
    BUILT.append(engine)
    GATE.wait(120)


def test_a_host_still_starting_is_waited_for_and_never_built_twice(settings):
    settings.AAA = {**settings.AAA, "WORKER_SETUP": f"{__name__}.slow_setup"}
    GATE.clear()
    BUILT.clear()
    EngineHost.reset()
    try:
        for _ in range(2):  # two requests while it starts
            with pytest.raises(EngineUnavailable, match="still starting"):
                EngineHost.get(timeout=0.1)
        GATE.set()  # its setup is done
        host = EngineHost.get(timeout=120)
        assert host.alive and [host.engine] == BUILT  # the one host, built once
    finally:
        GATE.set()
        EngineHost.reset()
