"""The example site (project/) started as it is deployed, for the field tests.

Its own PostgreSQL cluster (or, ``db="sqlite"``, a SQLite file: the embedded default)
and (on the Celery bus) Redis server, so a test can restart them; S3 for blobs (moto,
from bin/test); the database migrated and an API key made with the site's own
commands; its web server (gunicorn), which a test may kill and start again
(:meth:`Site.kill_web`, :meth:`Site.start_web`); on the Celery bus, Celery workers
started the usual way (``celery -A project worker``); and, when asked, the model
server of tests/field/model_server.py (else the site's scripted model), which counts
the calls it is paid for (:meth:`Site.model_calls`). Every process is stopped by its
PID at the end.
"""

from __future__ import annotations

import http.client
import json
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from .services import Postgres, Process, Redis, free_port, wait_port

ROOT = Path(__file__).resolve().parents[2]


class Site:
    """``with Site(tmp, s3_endpoint, bus="celery", workers=2, model=True) as site:``"""

    def __init__(
        self,
        tmp: Path,
        s3_endpoint: str,
        *,
        bus: str = "inprocess",
        workers: int = 0,
        model: bool = False,
        web_workers: int = 1,
        stall_after: float | None = None,
        model_latency: tuple[float, float] | None = None,
        provider: str = "openai",
        stream_tokens: bool = False,
        db: str = "postgres",
        env: dict[str, str] | None = None,
        listen: str | None = None,
        model_pids: bool = False,
    ) -> None:
        self.tmp = tmp
        #: the model server notes each caller's PID (``--pids``: slow under a large load)
        self.model_pids = model_pids
        #: AAA["LLM"]["PROVIDER"] when ``model``: the model server speaks each one's format
        self.provider = provider
        self.stream_tokens = stream_tokens
        #: what the model server was asked, a JSON line a request (see model_requests)
        self.model_log = tmp / "model-requests.jsonl"
        #: an address the site's services listen on besides 127.0.0.1 (a test's network
        #: namespace reaches them there; see :meth:`start_worker`)
        self.listen = listen
        #: "postgres" (a cluster of the test's own) or "sqlite" (a file: the embedded default)
        self.db = db
        #: more of the site's environment (settings the test changes)
        self.extra_env = dict(env or {})
        #: the model server's seconds per call (min, max; its default: 0.3 to 1.0)
        self.model_latency = model_latency
        self.stall_after = stall_after
        self.s3_endpoint = s3_endpoint
        self.bus = bus
        self.n_workers = workers
        self.with_model = model
        self.web_workers = web_workers
        #: while this file exists, the model server answers no call (see hold_model)
        self.model_hold = tmp / "model-hold"
        self.procs: dict[str, Process] = {}
        self.workers: list[Process] = []
        self._stops: list[Any] = []
        self._n = 0

    # -- starting -------------------------------------------------------------------------

    def __enter__(self) -> "Site":
        try:
            self._start()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def _start(self) -> None:
        import boto3

        if self.db == "postgres":
            self.pg = Postgres(listen=self.listen)
            self._stops.append(self.pg.close)
        bucket = f"aaa-field-{time.time_ns()}"
        boto3.client(
            "s3",
            endpoint_url=self.s3_endpoint,
            aws_access_key_id="testing",
            aws_secret_access_key="testing",
            region_name="us-east-1",
        ).create_bucket(Bucket=bucket)
        self.web_port = free_port()
        self.env = {
            "PATH": "/usr/bin:/bin",
            "HOME": str(self.tmp),
            "PYTHONUNBUFFERED": "1",
            "DJANGO_SETTINGS_MODULE": "project.settings",
            "AAA_DEBUG": "0",
            "AAA_SECRET_KEY": "field-test-secret-key-not-for-production",
            "AAA_ALLOWED_HOSTS": "127.0.0.1,localhost",
            **(
                {
                    "AAA_DB": "postgres",
                    "AAA_PG_HOST": "127.0.0.1",
                    "AAA_PG_PORT": str(self.pg.port),
                    "AAA_PG_NAME": "aaa",
                    "AAA_PG_USER": "postgres",
                }
                if self.db == "postgres"
                else {"AAA_DB": "sqlite", "AAA_SQLITE_PATH": str(self.tmp / "db.sqlite3")}
            ),
            "AAA_BUS": self.bus,
            "AAA_S3_BUCKET": bucket,
            "AAA_S3_ENDPOINT": self.s3_endpoint,
            "AAA_S3_ACCESS_KEY": "testing",
            "AAA_S3_SECRET_KEY": "testing",
            "AAA_S3_REGION": "us-east-1",
        }
        if self.stall_after is not None:
            self.env["AAA_STALL_AFTER"] = str(self.stall_after)
        if self.bus == "celery":
            self.redis = Redis(self.tmp, listen=self.listen)
            self._stops.append(self.redis.close)
            self.env["AAA_REDIS_URL"] = self.redis.url
        self.env.update(self.extra_env)
        if self.with_model:
            port = self.model_port = free_port()
            url = f"http://127.0.0.1:{port}" + ("" if self.provider == "anthropic" else "/v1")
            # (a call the test holds in flight must not time out meanwhile: a loaded
            # machine has taken more than the default 60 s to get every run there)
            self.env.update(
                {
                    "AAA_LLM_PROVIDER": self.provider,
                    "AAA_LLM_BASE_URL": url,
                    "AAA_LLM_API_KEY": "field-test-key",
                    "AAA_LLM_MODEL": "field-model",
                    "AAA_LLM_TIMEOUT": "600",
                }
            )
            latency = [] if self.model_latency is None else ["--latency", *map(str, self.model_latency)]
            host = ["--host", "0.0.0.0"] if self.listen else []
            model = self._process(
                "model",
                sys.executable,
                "-m",
                "tests.field.model_server",
                str(port),
                "--hold",
                str(self.model_hold),
                "--log",
                str(self.model_log),
                *latency,
                *host,
                *(["--pids"] if self.model_pids else []),
            )
        if self.stream_tokens:
            self.env["AAA_STREAM_TOKENS"] = "1"
        self.manage("migrate", "--noinput")
        self.manage("demo_user", "--username", "field", "--password", "field-pass-1")
        self.key = self.manage("aaa_apikey", "create", "--user", "field", "--name", "field").split()[-1]
        web = self.start_web(wait=False)
        for _ in range(self.n_workers):
            self.start_worker()
        for w in self.workers:
            self.wait_ready(w)
        if self.with_model:
            wait_port(port, proc=model.proc)
        wait_port(self.web_port, proc=web.proc)
        self.client = Client(self.web_port, self.key)

    def start_web(self, *, wait: bool = True) -> Process:
        """The web server, as the site deploys it: gunicorn (``web_workers`` processes).
        Its log accumulates in ``web.log`` across restarts."""
        self._webs = getattr(self, "_webs", 0) + 1
        name = "web" if self._webs == 1 else f"web{self._webs}"
        web = self._process(
            name,
            sys.executable,
            "-m",
            "gunicorn",
            "project.wsgi:application",
            "-b",
            f"127.0.0.1:{self.web_port}",
            "-w",
            str(self.web_workers),
            "-k",
            "gthread",
            "--threads",
            "16",
            "--timeout",
            "120",
            "--graceful-timeout",
            "5",
        )
        self.web = web
        if wait:
            wait_port(self.web_port, proc=web.proc)
        return web

    def kill_web(self) -> list[int]:
        """SIGKILL the web server and its worker processes at once (a crash, an OOM kill,
        a deploy that does not drain); returns the PIDs of its worker processes."""
        pids = self.web.descendants()
        self.web.kill()
        return pids

    def start_runs(self, tasks: list[str], config: dict[str, Any], key: str) -> list[str]:
        """Start a ToolLoop run of each task over the REST API (8 at a time, as clients
        do; each with an ``Idempotency-Key`` of ``key`` and its index); their ids."""

        def start(i: int) -> str:
            status, body = self.client.call(
                "POST",
                "/runs",
                {
                    "algorithm": "aaa.algos.ToolLoop",
                    "input": {"task": tasks[i]},
                    "config": config,
                },
                headers={"Idempotency-Key": f"{key}-{i}"},
            )
            assert status in (200, 201), (status, body)
            return body["id"]

        with ThreadPoolExecutor(8) as pool:
            return list(pool.map(start, range(len(tasks))))

    def until_ended(self, ids: list[str], timeout: float, ended: dict[str, dict] | None = None) -> dict[str, dict]:
        """Run id -> the run as the API says, once every run of ``ids`` has ended (fails
        after ``timeout`` seconds, with the processes' logs)."""
        ended = {} if ended is None else ended
        end = time.monotonic() + timeout
        while True:
            for run_id in ids:
                if run_id not in ended:
                    status, run = self.client.call("GET", f"/runs/{run_id}")
                    assert status == 200, run
                    if run["status"] == "completed":
                        ended[run_id] = run
            if len(ended) == len(ids):
                return ended
            assert time.monotonic() < end, f"{len(ids) - len(ended)} runs never ended\n{self.logs()}"
            time.sleep(0.1)

    def model_calls(self) -> list[dict]:
        """The calls the model server has received, in order (see model_server.py)."""
        conn = http.client.HTTPConnection("127.0.0.1", self.model_port, timeout=30)
        try:
            conn.request("GET", "/calls")
            return json.loads(conn.getresponse().read())["calls"]
        finally:
            conn.close()

    def _process(self, name: str, *cmd: str) -> Process:
        p = self.procs[name] = Process(name, list(cmd), env=self.env, cwd=ROOT, log=self.tmp / f"{name}.log")
        return p

    def model_requests(self) -> list[dict[str, Any]]:
        """What the model server was asked so far: per request its path, model, whether
        it streamed and the tools offered (``tests.field.model_server.seen``)."""
        if not self.model_log.exists():
            return []
        return [json.loads(line) for line in self.model_log.read_text().splitlines() if line]

    def hold_model(self, hold: bool = True) -> None:
        """Hold every model call until ``hold_model(False)`` (they wait, unanswered)."""
        if hold:
            self.model_hold.touch()
        else:
            self.model_hold.unlink(missing_ok=True)

    def start_worker(self, *, netns: list[str] | None = None) -> Process:
        """One more Celery worker, started the usual way; ``netns``: the command that
        runs it in a network namespace (``Namespace.prefix()``), where it reaches the
        site's services at :attr:`listen`."""
        self._n += 1
        env = self.env
        if netns is not None:
            assert self.listen, "a worker in a network namespace reaches the services at Site(listen=...)"
            env = {k: v.replace("127.0.0.1", self.listen) if k in _ADDRESSES else v for k, v in env.items()}
        w = Process(
            f"worker{self._n}",
            [
                *(netns or []),
                sys.executable,
                "-m",
                "celery",
                "-A",
                "project",
                "worker",
                "-n",
                f"field{self._n}@%h",
                "-c",
                "2",
                "-l",
                "info",
            ],
            env=env,
            cwd=ROOT,
            log=self.tmp / f"worker{self._n}.log",
        )
        self.procs[w.name] = w
        self.workers.append(w)
        return w

    def wait_ready(self, worker: Process, timeout: float = 120) -> None:
        """Until Celery says the worker is ready (its log's "ready." line). The timeout
        only catches a worker that never is: on a loaded 2-core machine one has needed
        more than 30 s."""
        end = time.monotonic() + timeout
        while " ready." not in worker.text():
            assert worker.proc.poll() is None, f"{worker.name} exited:\n{worker.text()[-3000:]}"
            assert time.monotonic() < end, f"{worker.name} not ready:\n{worker.text()[-3000:]}"
            time.sleep(0.1)

    def manage(self, *args: str) -> str:
        out = subprocess.run(
            [sys.executable, "manage.py", *args], cwd=ROOT, env=self.env, capture_output=True, text=True, timeout=120
        )
        assert out.returncode == 0, out.stderr
        return out.stdout

    def close(self) -> None:
        for p in reversed(list(self.procs.values())):
            p.stop()
        for stop in reversed(self._stops):
            try:
                stop()
            except Exception:  # best effort: the rest must still stop
                pass

    def logs(self, lines: int = 30) -> str:
        return "\n".join(f"--- {name}\n" + "\n".join(p.text().splitlines()[-lines:]) for name, p in self.procs.items())


#: the environment variables that name where the site's services are
_ADDRESSES = ("AAA_PG_HOST", "AAA_REDIS_URL", "AAA_LLM_BASE_URL")


class Client:
    """A REST client as a user's program is: sends a request again after a 503 (once
    its ``Retry-After`` has passed) or a dropped connection; records every answer's
    status (and ``Retry-After``)."""

    def __init__(self, port: int, key: str) -> None:
        self.port = port
        self.key = key
        #: (status, Retry-After, "METHOD path") of every answer, in order
        self.answers: list[tuple[int, str | None, str]] = []
        self._lock = threading.Lock()

    def call(
        self,
        method: str,
        path: str,
        body: Any = None,
        headers: dict | None = None,
        *,
        retry: bool = True,
        give_up: float = 90,
    ) -> tuple[int, Any]:
        data = json.dumps(body).encode() if body is not None else None
        hdrs = {"Authorization": f"Bearer {self.key}", **(headers or {})}
        if data is not None:
            hdrs["Content-Type"] = "application/json"
        end = time.monotonic() + give_up
        while True:
            conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=120)
            try:
                conn.request(method, f"/api/aaa{path}", body=data, headers=hdrs)
                r = conn.getresponse()
                payload, status, retry_after = r.read(), r.status, r.getheader("Retry-After")
            except OSError:
                status = None
            finally:
                conn.close()
            if status is None:
                assert time.monotonic() < end, f"{method} {path}: the server never answered"
                time.sleep(0.2)
                continue
            with self._lock:
                self.answers.append((status, retry_after, f"{method} {path}"))
            if retry and status == 503 and time.monotonic() < end:
                time.sleep(float(retry_after or 1))
                continue
            return status, json.loads(payload) if payload else None

    def bad_answers(self) -> list[tuple[int, str | None, str]]:
        """Answers that are neither 2xx nor a 503 with ``Retry-After``."""
        return [a for a in self.answers if not (200 <= a[0] < 300 or (a[0] == 503 and a[1]))]
