"""Services a field test starts, owns and breaks: its own PostgreSQL cluster and Redis
server (so restarting them disturbs no other test), and processes run as a site runs
them (stopped by their PID, never by name).

The commands are NOTES.md's: PostgreSQL 15's ``initdb`` and ``pg_ctl`` as the
``postgres`` user when root; ``redis-server`` without persistence.
"""

from __future__ import annotations

import os
import random
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

PG_BIN = Path(os.environ.get("AAA_PG_BIN", "/usr/lib/postgresql/15/bin"))


def free_port() -> int:
    """A free port below the kernel's range of ephemeral ports: the port ``bind(0)``
    gives is in that range, where any process's outgoing connection can take it before
    the server started on it binds it (a gunicorn that then retries while the test talks
    to whatever holds the port); below it, only a listener could."""
    low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    rng = random.SystemRandom()
    while True:
        port = rng.randrange(max(1024, low - 12_000), low)
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port


def wait_port(port: int, timeout: float = 120, proc: subprocess.Popen | None = None) -> None:
    """Until something accepts connections on ``port`` (while ``proc`` lives). The
    timeout only catches a process that never listens: on a loaded 2-core machine
    gunicorn has been seen to need more than 30 s to start."""
    end = time.monotonic() + timeout
    while True:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                return
        except OSError:
            if proc is not None and proc.poll() is not None:
                raise RuntimeError(f"process {proc.args!r} exited ({proc.returncode})") from None
            if time.monotonic() > end:
                raise RuntimeError(f"nothing listens on port {port} after {timeout} s") from None
            time.sleep(0.05)


class Postgres:
    """A PostgreSQL cluster of the test's own, on a free port; ``restart()`` it. Its
    directory is one of its own under the system's temporary directory (the
    ``postgres`` user must reach it; pytest's are private to root), removed by
    :meth:`close`."""

    def __init__(self, listen: str | None = None) -> None:
        #: an address to listen on besides 127.0.0.1 (a test's network namespace reaches
        #: the server there), trusted as the loopback is
        self.listen = listen
        self.dir = Path(tempfile.mkdtemp(prefix="aaa-field-pg-"))
        os.chmod(self.dir, 0o755)
        self.data = self.dir / "data"
        self.port = free_port()
        self.as_pg: list[str] = []
        if os.geteuid() == 0:  # initdb refuses root
            if subprocess.run(["id", "-u", "postgres"], capture_output=True).returncode != 0:
                subprocess.run(
                    ["useradd", "--system", "--no-create-home", "--shell", "/usr/sbin/nologin", "postgres"], check=True
                )
            subprocess.run(["chown", "postgres", str(self.dir)], check=True)
            self.as_pg = ["runuser", "-u", "postgres", "--"]
        self._run("initdb", "-D", self.data, "--auth=trust", "-U", "postgres", "-E", "UTF8", "--no-locale", "--no-sync")
        if listen is not None:
            with open(self.data / "pg_hba.conf", "a") as hba:
                hba.write(f"host all all {listen}/24 trust\n")
        self.start()
        self._run("createdb", "-h", "127.0.0.1", "-p", str(self.port), "-U", "postgres", "aaa")

    def _run(self, tool: str, *args: Any) -> None:
        subprocess.run([*self.as_pg, PG_BIN / tool, *map(str, args)], check=True, capture_output=True)

    def _ctl(self, action: str, *extra: str) -> None:
        self._run("pg_ctl", "-D", self.data, "-l", self.dir / "postgres.log", "-w", "-t", "60", *extra, action)

    def start(self) -> None:
        addresses = "127.0.0.1" + (f",{self.listen}" if self.listen else "")
        self._ctl(
            "start",
            "-o",
            f"-c listen_addresses={addresses} -p {self.port} -k {self.dir} -c fsync=off -c max_connections=200",
        )

    def stop(self) -> None:
        self._ctl("stop", "-m", "fast")

    def restart(self) -> None:
        """Stop (every client's connection is cut), then start again."""
        self.stop()
        self.start()

    def close(self) -> None:
        try:
            self.stop()
        except subprocess.CalledProcessError:
            pass  # not running
        shutil.rmtree(self.dir, ignore_errors=True)


class Redis:
    """A Redis server of the test's own, without persistence: a restart loses every
    message queued in it, as a Redis without AOF does."""

    def __init__(self, tmp: Path, listen: str | None = None) -> None:
        self.dir = tmp
        self.listen = listen
        self.port = free_port()
        self.proc: subprocess.Popen | None = None
        self.start()

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        self.proc = subprocess.Popen(
            [
                "redis-server",
                "--port",
                str(self.port),
                "--bind",
                "127.0.0.1",
                *([self.listen] if self.listen else []),
                "--protected-mode",
                "no",
                "--save",
                "",
                "--appendonly",
                "no",
                "--dir",
                str(self.dir),
            ],
            stdout=open(self.dir / "redis.log", "ab"),
            stderr=subprocess.STDOUT,
        )
        wait_port(self.port, proc=self.proc)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()  # SIGTERM: no save (--save "")
            self.proc.wait(10)

    def restart(self) -> None:
        self.stop()
        self.start()

    close = stop


class Process:
    """A process of the site (web server, worker, model server), logged to a file."""

    def __init__(self, name: str, cmd: list[str], *, env: dict[str, str], cwd: Path, log: Path) -> None:
        self.name = name
        self.log_path = log
        self._log = open(log, "ab")
        self.proc = subprocess.Popen(
            cmd, cwd=cwd, env=env, stdout=self._log, stderr=subprocess.STDOUT, start_new_session=True
        )

    @property
    def pid(self) -> int:
        return self.proc.pid

    def descendants(self) -> list[int]:
        """The PIDs under this process (prefork children, gunicorn workers)."""
        found, todo = [], [self.pid]
        while todo:
            pid = todo.pop()
            for task in Path(f"/proc/{pid}/task").glob("*/children"):
                try:
                    kids = [int(p) for p in task.read_text().split()]
                except OSError:
                    continue
                found += kids
                todo += kids
        return found

    def kill(self) -> None:
        """SIGKILL the process and everything under it at once (a machine lost)."""
        for pid in [self.pid, *self.descendants()]:
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        self.proc.wait(10)

    def stop(self, timeout: float = 15) -> None:
        """SIGTERM, then SIGKILL what lingers; by PID only."""
        if self.proc.poll() is None:
            kids = self.descendants()
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.kill()
            for pid in kids:
                try:
                    os.kill(pid, signal.SIGKILL)
                except OSError:
                    pass
        self._log.close()

    def text(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except OSError:
            return ""
