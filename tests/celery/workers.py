"""Real Celery worker processes for the tests: start, find their children, kill, stop.

Each :class:`Worker` is ``celery -A tests.celery_app worker`` (prefork) with
DJANGO_SETTINGS_MODULE=tests.celery.worker_settings, pointed at the pytest process's
test database and at this pytest-xdist worker's own Redis database (so two xdist
workers never take each other's messages). Every process is stopped by its PID.
"""

from __future__ import annotations

import itertools
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
KINDS = ("algorithms", "llm", "tools")
QUEUES = ",".join(f"aaa.{k}" for k in KINDS)
#: numbers the workers this process starts, whatever their cluster: a node name is
#: unique on the broker. (Clusters of one pytest process share its broker; a broadcast
#: such as ``inspect`` reaches every node of a name, and stops at as many replies as
#: names it asked: two ``w2`` answering hid a ``w1`` that never did.)
_NUMBERS = itertools.count(1)


def queue_names(suffix: str = "") -> dict[str, str]:
    """Kind of work -> queue name, with a test's own suffix (see worker_settings)."""
    return {k: f"aaa.{k}{suffix}" for k in KINDS}


def children(pid: int) -> list[int]:
    """The PIDs of ``pid``'s child processes (from /proc)."""
    out = []
    for task in Path(f"/proc/{pid}/task").glob("*/children"):
        try:
            out += [int(p) for p in task.read_text().split()]
        except OSError:
            pass
    return out


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except OSError:
        return False
    try:  # a zombie is dead for our purposes
        return Path(f"/proc/{pid}/stat").read_text().split(") ")[1][0] != "Z"
    except OSError:
        return False


class Worker:
    """One worker process (and its prefork children); ``queues=None``: no ``-Q`` (the
    app's default queue, as ``celery -A proj worker`` takes)."""

    def __init__(
        self,
        name: str,
        env: dict[str, str],
        tmp: Path,
        *,
        concurrency: int = 1,
        queues: str | None = QUEUES,
        pool: str = "prefork",
    ) -> None:
        self.name = name
        self.ready_file = tmp / f"{name}.ready"
        self.log_file = tmp / f"{name}.log"
        self.ready_file.unlink(missing_ok=True)
        cmd = [
            sys.executable,
            "-m",
            "celery",
            "-A",
            "tests.celery_app",
            "worker",
            "-n",
            f"{name}@%h",
            *(["-Q", queues] if queues else []),
            "-c",
            str(concurrency),
            "-P",
            pool,
            "-l",
            "warning",
            "--without-gossip",
            "--without-mingle",
            "--without-heartbeat",
        ]
        self.log = open(self.log_file, "ab")
        self.proc = subprocess.Popen(
            cmd,
            cwd=ROOT,
            stdout=self.log,
            stderr=subprocess.STDOUT,
            env={**env, "AAA_TEST_WORKER_READY": str(self.ready_file)},
        )

    @property
    def pid(self) -> int:
        return self.proc.pid

    def wait_ready(self, timeout: float = 120) -> None:
        end = time.monotonic() + timeout
        while not self.ready_file.exists():
            if self.proc.poll() is not None:
                raise RuntimeError(f"worker {self.name} exited: {self.tail()}")
            if time.monotonic() > end:
                raise RuntimeError(f"worker {self.name} not ready in {timeout} s: {self.tail()}")
            time.sleep(0.05)

    def children(self) -> list[int]:
        return [p for p in children(self.pid) if alive(p)]

    def kill(self) -> None:
        """SIGKILL the worker and its children at once (a machine lost)."""
        pids = [self.pid, *children(self.pid)]
        for p in pids:
            try:
                os.kill(p, signal.SIGKILL)
            except OSError:
                pass
        self.proc.wait(10)

    def stop(self, timeout: float = 15, *, signalled: Any = None) -> None:
        """Warm shutdown (SIGTERM), then SIGKILL what lingers; by PID only.
        ``signalled()``, if given, is called once the SIGTERM is sent."""
        if self.proc.poll() is None:
            kids = children(self.pid)
            self.proc.send_signal(signal.SIGTERM)
            if signalled is not None:
                signalled()
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.kill()
            for p in kids:
                if alive(p):
                    try:
                        os.kill(p, signal.SIGKILL)
                    except OSError:
                        pass
        self.log.close()

    def tail(self, lines: int = 40) -> str:
        try:
            return "\n".join(self.log_file.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""


class Cluster:
    """A set of workers sharing one environment."""

    def __init__(self, env: dict[str, str], tmp: Path) -> None:
        self.env = env
        #: kind -> queue name these workers consume (pass it to DistributedBus)
        self.queues = queue_names(env.get("AAA_TEST_QUEUE_SUFFIX", ""))
        self.tmp = tmp
        self.workers: list[Worker] = []

    def start(self, count: int = 1, *, ready_timeout: float = 120, **kw) -> list[Worker]:
        """Start ``count`` workers and wait for each to be ready. ``ready_timeout`` only
        catches a worker that never comes up: on a loaded 2-core machine a worker has
        been seen to need more than 30 s."""
        started = []
        for _ in range(count):
            kw.setdefault("queues", ",".join(self.queues.values()))
            w = Worker(f"w{next(_NUMBERS)}-{os.getpid()}", self.env, self.tmp, **kw)
            self.workers.append(w)
            started.append(w)
        for w in started:
            w.wait_ready(ready_timeout)
        return started

    def warm(self, spec: list, *, timeout: float = 300) -> None:
        """Have every worker process build its engine for ``spec`` (the store's
        ``store_spec``) before a test starts a clock: a worker is ready before its pool
        child has built an engine, and the first delivery builds it (WORKER_SETUP's
        imports and MCP servers: 17-20 s each on a loaded 2-core machine). Needs
        concurrency 1 per worker (one warm-up each, held until done)."""
        from tests.celery_app import warm

        done = self.tmp / f"warm-{len(self.workers)}"
        done.mkdir(exist_ok=True)
        live = self.live()
        for _ in live:
            warm.apply_async((spec, str(done)), queue=self.queues["algorithms"])
        end = time.monotonic() + timeout
        while True:
            files = list(done.iterdir())  # one a worker: empty when warm, else its error
            failed = [f.read_text() for f in files if f.stat().st_size]
            if failed:
                raise RuntimeError(f"a worker failed to warm up: {failed[0]}")
            if len(files) >= len(live):
                return
            if time.monotonic() > end:
                raise RuntimeError(f"workers not warm in {timeout} s: {self.logs()}")
            time.sleep(0.05)

    def live(self) -> list[Worker]:
        return [w for w in self.workers if w.proc.poll() is None]

    def stop(self) -> None:
        for w in self.workers:
            if w.proc.poll() is None:
                w.proc.send_signal(signal.SIGTERM)
        for w in self.workers:
            w.stop()

    def errors(self) -> list[str]:
        """Lines of the workers' logs that report an error (there should be none)."""
        out = []
        for w in self.workers:
            try:
                text = w.log_file.read_text(errors="replace")
            except OSError:
                continue
            out += [
                f"{w.name}: {line}"
                for line in text.splitlines()
                if "ERROR" in line or "Traceback" in line or "CRITICAL" in line
            ]
        return out

    def logs(self) -> str:
        return "\n".join(f"--- {w.name}\n{w.tail()}" for w in self.workers)
