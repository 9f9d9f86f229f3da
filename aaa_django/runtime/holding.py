"""Whether this process still holds a run: what a handler asks before it calls out.

A process that drives runs (the web process's engine host, a Celery worker, a
command) holds a lease on each (``aaa_django.store.leases``), renewed while it lives.
One that cannot renew them (its database is out of reach, it is cut off from the
network) stops calling models and tools for its runs before its leases can lapse
(it *stands down*), and one whose runs another process adopted meanwhile does not call
out for those runs again: that process drives them now, and a call made here as well
would be paid, or would act on the world, twice.

The bus offers the question (:class:`HoldsRuns`: the Celery bus in a worker, the
engine host's bus), detected once where a handler is attached::

    self._holds = engine.bus if isinstance(engine.bus, HoldsRuns) else None
    ...
    if self._holds is not None and not self._holds.holds(request.stream):
        return  # another process drives the run (or this one has stood down): no call

A bus without it (a test's engine, a process that only starts runs) answers nothing:
the handler calls as ever. The answer is this process's view, kept in memory: asking
costs no I/O, so ask right before each call, retries included.
"""

from __future__ import annotations

import os
import socket
from typing import Protocol, runtime_checkable


@runtime_checkable
class HoldsRuns(Protocol):
    """A bus that knows which runs this process may still call out for."""

    def holds(self, run_id: str) -> bool:
        """May this process make a model or tool call for ``run_id`` now? False once
        it has stood down (its leases not renewed for half their time to live) or
        when another process has taken the run from it."""
        ...


# -- which process: a holder's id, and whether the process it names has ended ------------------


def _pid_namespace() -> str:
    try:
        return os.readlink("/proc/self/ns/pid").rsplit("[", 1)[-1].rstrip("]")
    except OSError:
        return "-"


def _start_time(pid: int) -> str | None:
    """The start time of process ``pid`` (clock ticks after boot, /proc), or None when
    there is no such process here."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            stat = f.read()
    except OSError:
        return None
    fields = stat.rsplit(")", 1)[-1].split()
    return fields[19] if len(fields) > 19 else None


def holder_id(name: str = "") -> str:
    """This process's holder id: ``name|host|pid namespace|pid|start time|random``."""
    pid = os.getpid()
    return "|".join(
        [
            name or "aaa",
            socket.gethostname()[:64],
            _pid_namespace(),
            str(pid),
            _start_time(pid) or "-",
            os.urandom(3).hex(),
        ]
    )


def process_gone(holder: str) -> bool:
    """Is ``holder`` a process of this machine (and pid namespace) that has ended? Its
    pid is gone, or now another process's (another start time). A holder of another
    machine, or an id of another form, is not known to be gone."""
    parts = holder.split("|")
    if len(parts) != 6:
        return False
    _, host, namespace, pid, started, _ = parts
    if host != socket.gethostname()[:64] or namespace != _pid_namespace() or started == "-":
        return False
    try:
        return _start_time(int(pid)) != started
    except ValueError:
        return False
