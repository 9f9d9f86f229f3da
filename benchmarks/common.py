"""What every benchmark needs: databases, Django settings, timing and a table.

- :func:`postgres` starts a throwaway PostgreSQL 15 cluster (durable: fsync on) on a
  free loopback port, as ``bin/test`` does, or reuses one named by ``AAA_BENCH_PG_PORT``
  (``AAA_BENCH_PG_HOST``, user ``postgres``). It stops only what it started, by PID.
- :func:`setup_django` configures settings in-process (no settings module needed): the
  app, SQLite in WAL mode with ``synchronous=FULL`` in a temporary directory, and
  PostgreSQL when a port is given (``AAA_BENCH_PG_PREPARE=N``: its ``OPTIONS``
  ``prepare_threshold`` is N; without it, the store's connections prepare their
  statements when nothing pools them, as here: ``aaa_django.store.connections``);
  then migrates both. With PostgreSQL, a second alias of the same database,
  :data:`PG_UNPREPARED` (``OPTIONS`` ``prepare_threshold`` None: no prepared
  statements, as behind a transaction-mode pooler), not migrated, for the rows that
  measure what preparing buys in the same rounds.
- :func:`median_time`, :func:`table`: medians of repeats, printed as a plain table.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PG_BIN = Path(os.environ.get("AAA_PG_BIN", "/usr/lib/postgresql/15/bin"))
PG_DB = "aaa_bench"
#: the alias of the same PostgreSQL database whose connections prepare no statements
PG_UNPREPARED = "postgres_unprepared"
# The pragmas of the SQLite rows, for the ORM store and the raw driver alike.
SQLITE_PRAGMAS = "PRAGMA journal_mode=WAL; PRAGMA synchronous=FULL;"

if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def postgres(tmp: Path) -> Iterator[dict]:
    """Connection parameters of a durable PostgreSQL with an empty ``aaa_bench`` db."""
    if os.environ.get("AAA_BENCH_PG_PORT"):
        params = dict(
            host=os.environ.get("AAA_BENCH_PG_HOST", "127.0.0.1"),
            port=int(os.environ["AAA_BENCH_PG_PORT"]),
            user="postgres",
        )
        _recreate_db(params)
        yield params
        return
    as_pg: list[str] = []
    data = tmp / "pg"
    data.mkdir()
    if os.geteuid() == 0:  # initdb refuses root
        subprocess.run(["id", "-u", "postgres"], check=True, capture_output=True)
        shutil.chown(tmp, "postgres")
        shutil.chown(data, "postgres")
        as_pg = ["runuser", "-u", "postgres", "--"]
    port = free_port()
    subprocess.run(
        [*as_pg, PG_BIN / "initdb", "-D", data / "data", "--auth=trust", "-U", "postgres", "-E", "UTF8", "--no-locale"],
        check=True,
        capture_output=True,
    )
    # Durable settings (the defaults: fsync, synchronous_commit, full_page_writes on).
    subprocess.run(
        [
            *as_pg,
            PG_BIN / "pg_ctl",
            "-D",
            data / "data",
            "-l",
            data / "log",
            "-w",
            "-o",
            f"-c listen_addresses=127.0.0.1 -p {port} -k {data} -c fsync=on "
            f"-c synchronous_commit=on -c shared_buffers=128MB",
            "start",
        ],
        check=True,
        capture_output=True,
    )
    pid = int((data / "data" / "postmaster.pid").read_text().split()[0])
    params = dict(host="127.0.0.1", port=port, user="postgres")
    try:
        _recreate_db(params)
        yield params
    finally:
        stop = subprocess.run(
            [*as_pg, PG_BIN / "pg_ctl", "-D", data / "data", "-m", "fast", "-w", "stop"], capture_output=True
        )
        if stop.returncode:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, 15)


def _recreate_db(params: dict) -> None:
    import psycopg

    with psycopg.connect(**params, dbname="postgres", autocommit=True) as conn:
        conn.execute(f"DROP DATABASE IF EXISTS {PG_DB}")
        conn.execute(f"CREATE DATABASE {PG_DB}")


def setup_django(tmp: Path, pg: dict | None) -> dict[str, str]:
    """Configure Django for the app, migrate; return {backend label: alias}."""
    import django
    from django.conf import settings
    from django.core.management import call_command

    databases = {
        "default": {
            "ENGINE": "django.db.backends.sqlite3",
            "NAME": str(tmp / "bench.sqlite3"),
            "OPTIONS": {"init_command": SQLITE_PRAGMAS, "transaction_mode": "IMMEDIATE"},
        }
    }
    if pg:
        databases["postgres"] = {
            "ENGINE": "django.db.backends.postgresql",
            "HOST": pg["host"],
            "PORT": str(pg["port"]),
            "USER": pg["user"],
            "PASSWORD": "",
            "NAME": PG_DB,
        }
        if os.environ.get("AAA_BENCH_PG_PREPARE"):  # psycopg's server-side prepared statements
            databases["postgres"]["OPTIONS"] = {"prepare_threshold": int(os.environ["AAA_BENCH_PG_PREPARE"])}
        databases[PG_UNPREPARED] = {**databases["postgres"], "OPTIONS": {"prepare_threshold": None}}
    settings.configure(
        INSTALLED_APPS=["django.contrib.contenttypes", "django.contrib.auth", "aaa_django"],
        DATABASES=databases,
        USE_TZ=True,
        TIME_ZONE="UTC",
        DEFAULT_AUTO_FIELD="django.db.models.BigAutoField",
        AAA={},
        LOGGING_CONFIG=None,
    )
    django.setup()
    for alias in databases:
        if alias != PG_UNPREPARED:  # (the same database as "postgres")
            call_command("migrate", database=alias, verbosity=0)
    return {"SQLite": "default", **({"PostgreSQL": "postgres"} if pg else {})}


def median_time(fn: Callable[[], object], repeats: int, setup: Callable[[], object] | None = None) -> float:
    """Median seconds of ``fn()`` over ``repeats`` runs (``setup()`` untimed before each)."""
    times = []
    for _ in range(repeats):
        if setup is not None:
            setup()
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def table(headers: list[str], rows: list[list[object]]) -> str:
    cells = [headers] + [[str(c) for c in r] for r in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    line = lambda r: "  ".join(c.rjust(w) if i else c.ljust(w) for i, (c, w) in enumerate(zip(r, widths)))  # noqa: E731
    return "\n".join([line(cells[0]), line(["-" * w for w in widths])] + [line(r) for r in cells[1:]])


def ms(seconds: float) -> str:
    return f"{seconds * 1000:.2f} ms" if seconds < 10 else f"{seconds:.1f} s"


@contextlib.contextmanager
def workdir() -> Iterator[Path]:
    tmp = Path(tempfile.mkdtemp(prefix="aaa-bench-"))
    os.chmod(tmp, 0o755)
    try:
        yield tmp
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


class CountingStore:
    """Wraps an event store: counts its calls (by method) and the time spent in them.
    ``appends`` counts the appends that stored something: one durable commit each."""

    def __init__(self, inner) -> None:
        self.inner = inner
        self.cache_key = inner.cache_key
        self.calls = 0
        self.by_method: dict[str, int] = {}
        self.appends = 0
        self.seconds = 0.0

    def __getattr__(self, name):
        attr = getattr(self.inner, name)
        if not callable(attr) or name.startswith("_") or name.endswith("_sync"):
            return attr

        async def timed(*args, **kwargs):
            t0 = time.perf_counter()
            try:
                out = await attr(*args, **kwargs)
            finally:
                self.calls += 1
                self.by_method[name] = self.by_method.get(name, 0) + 1
                self.seconds += time.perf_counter() - t0
            if name == "append" and out:
                self.appends += 1
            return out

        return timed

    def reset(self) -> None:
        self.calls = self.appends = 0
        self.by_method = {}
        self.seconds = 0.0


def rss(pid: int | str = "self") -> int:
    """Resident set size of a process, in bytes (Linux: /proc)."""
    with open(f"/proc/{pid}/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def cpu_seconds(pids: list[int]) -> float:
    """CPU time (user + system) the processes ``pids`` have used so far, in seconds
    (Linux: /proc); a process gone meanwhile counts as 0."""
    return sum(process_seconds(pids).values())


def machine_busy() -> float:
    """Seconds of CPU the whole machine has been busy so far: every process, every CPU,
    the kernel's work for them included (Linux: the first line of /proc/stat, all but
    idle and iowait)."""
    with open("/proc/stat") as f:
        user, nice, system, idle, iowait, irq, softirq, steal = (int(x) for x in f.readline().split()[1:9])
    return (user + nice + system + irq + softirq + steal) / os.sysconf("SC_CLK_TCK")


def process_seconds(pids: list[int]) -> dict[int, float]:
    """pid -> CPU seconds (user + system) it has used so far, for those of ``pids`` alive."""
    out = {}
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except (FileNotFoundError, ProcessLookupError):
            continue
        out[pid] = (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime, stime (fields 14, 15)
    return out


def postgres_pids(pg: dict) -> list[int]:
    """The PostgreSQL server's processes (the postmaster and everything under it: the
    backends, the WAL writer, the checkpointer), found through its data directory."""
    import psycopg

    with psycopg.connect(**pg, dbname="postgres", autocommit=True) as conn:
        data = conn.execute("SHOW data_directory").fetchone()[0]
    pid = int(Path(data, "postmaster.pid").read_text().split()[0])
    return descendants(pid)


class CPUWindow:
    """The CPU spent during a window (``with``): the whole machine's (:func:`machine_busy`),
    and that of each named group of processes (``groups``: name -> a function listing
    their pids now; a process started within counts from 0, one that ended within is
    not counted). ``machine`` and ``groups`` (name -> seconds) after the window;
    ``parts()`` adds ``other`` (the machine's less the groups': whatever else ran)."""

    def __init__(self, **groups: Callable[[], list[int]]) -> None:
        self.listing = groups
        self.machine = 0.0
        self.groups: dict[str, float] = {}

    def __enter__(self) -> CPUWindow:
        self._start = {name: process_seconds(f()) for name, f in self.listing.items()}
        self._machine = machine_busy()
        return self

    def __exit__(self, *exc: object) -> None:
        self.machine = machine_busy() - self._machine
        for name, f in self.listing.items():
            before = self._start[name]
            now = process_seconds(f())
            self.groups[name] = sum(t - before.get(pid, 0.0) for pid, t in now.items())

    def parts(self) -> dict[str, float]:
        return {**self.groups, "other": max(self.machine - sum(self.groups.values()), 0.0)}


def descendants(pid: int) -> list[int]:
    """``pid`` and every process under it (Linux: /proc), e.g. a prefork worker's pool."""
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        try:
            for task in os.listdir(f"/proc/{p}/task"):
                with open(f"/proc/{p}/task/{task}/children") as f:
                    todo.extend(int(c) for c in f.read().split())
        except FileNotFoundError:
            continue
    return out


def busy(seconds: float) -> None:
    """Keep this thread's CPU busy for ``seconds`` (an engine's work between two commits)."""
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


def raw_commit_sqlite(path: str, count: int, gap: float = 0.0) -> float:
    """Median seconds of a durable one-row transaction on SQLite (WAL, synchronous=FULL):
    BEGIN IMMEDIATE, an event-sized INSERT, COMMIT; the raw driver, nothing else.
    ``gap``: seconds of CPU work before each (:func:`busy`; see :func:`raw_commit_postgres`)."""
    import sqlite3

    conn = sqlite3.connect(path, isolation_level=None)
    conn.executescript(SQLITE_PRAGMAS)
    conn.execute("CREATE TABLE IF NOT EXISTS bench_commit (at TEXT, data TEXT)")
    times = []
    for _ in range(count):
        busy(gap)
        t0 = time.perf_counter()
        conn.execute("BEGIN IMMEDIATE")
        conn.execute("INSERT INTO bench_commit VALUES (datetime('now'), ?)", ["x" * 320])
        conn.execute("COMMIT")
        times.append(time.perf_counter() - t0)
    conn.close()
    return statistics.median(times)


def wal_lsn(conn) -> int:
    """The server's WAL insert position in bytes (``pg_current_wal_insert_lsn``) on a
    psycopg connection in autocommit: two readings bracket what was written between."""
    high, low = conn.execute("SELECT pg_current_wal_insert_lsn()").fetchone()[0].split("/")
    return (int(high, 16) << 32) + int(low, 16)


def raw_commit_postgres(pg: dict, count: int, gap: float = 0.0) -> float:
    """Median seconds of a durable one-row commit on PostgreSQL: an event-sized INSERT
    in autocommit (one round trip, one fsync), raw psycopg.

    ``gap``: seconds of CPU work before each commit (:func:`busy`), as a program that
    does something between its commits (an engine deciding its next step) makes them.
    On this VM that costs the commit more than the work: back to back a commit took
    0.11 ms, after 0.3 ms of work 0.20 ms, after 1 ms 0.38 ms (the server's processes
    had gone idle meanwhile and woke again; the same after a 1 ms sleep)."""
    import psycopg

    with psycopg.connect(**pg, dbname=PG_DB, autocommit=True) as conn:
        conn.execute("CREATE TABLE IF NOT EXISTS bench_commit (at timestamptz, data text)")
        times = []
        for _ in range(count):
            busy(gap)
            t0 = time.perf_counter()
            conn.execute("INSERT INTO bench_commit VALUES (now(), %s)", ["x" * 320])
            times.append(time.perf_counter() - t0)
    return statistics.median(times)
