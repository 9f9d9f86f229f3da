"""The README and the docs as a new user reads them: their commands run as written,
their tables are whole.

- Every environment variable the example site reads is in the table of
  ``docs/settings.md`` ("The example site's environment variables").
- The REST walkthrough of ``docs/tutorial.md`` ("2. Drive a run over the REST API"),
  then the README's first run over the REST API ("A first run"), run, as written, in
  bash with ``set -euo pipefail``, against the example site started as ``bin/serve``
  starts it (migrate, the demo user, the development server), on a scratch SQLite file.
"""

from __future__ import annotations

import os
import re
import sqlite3
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from tests.field.services import free_port

from ..project.test_site import manage
from .pages import blocks, section

ROOT = Path(__file__).resolve().parents[2]


def test_every_variable_the_example_site_reads_is_in_the_settings_table():
    read = {
        name
        for p in (ROOT / "project").rglob("*.py")
        for name in re.findall(r"""\b(?:env|env_flag|getenv|environ\.get)\(\s*["'](AAA_[A-Z0-9_]+)""", p.read_text())
    }
    assert {"AAA_DEBUG", "AAA_LLM_BASE_URL", "AAA_S3_BUCKET"} <= read  # the scan sees them
    table = section("docs/settings.md", "The example site's environment variables")
    rows = [line for line in table.splitlines() if line.startswith("| `AAA_")]
    documented = {name for row in rows for name in re.findall(r"`(AAA_[A-Z0-9_]+)`", row.split(" | ")[0])}
    assert read - documented == set(), "read by project/ but not in the table of docs/settings.md"


def walkthrough() -> str:
    (script,) = blocks(section("docs/tutorial.md", "2. Drive a run over the REST API"), "sh")
    return script


def first_run_over_rest() -> str:
    (script,) = blocks(section("README.md", "A first run"), "sh")
    return script


def wait_http(url: str, proc: subprocess.Popen, timeout: float = 60) -> None:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if proc.poll() is not None:
            raise AssertionError(f"the server exited: {proc.stdout.read() if proc.stdout else ''}")
        try:
            urllib.request.urlopen(url, timeout=1)
            return
        except urllib.error.HTTPError:
            return
        except OSError:
            time.sleep(0.1)
    raise AssertionError(f"{url} did not answer in {timeout} s")


@pytest.mark.slow
def test_the_rest_walkthrough_runs_as_written(tmp_path):
    db = tmp_path / "site.sqlite3"
    env = {"AAA_SQLITE_PATH": str(db)}
    for step in (("migrate", "--noinput"), ("demo_user", "--username", "demo", "--password", "demo")):
        done = manage(*step, **env)
        assert done.returncode == 0, done.stderr
    port = free_port()
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("DJANGO_", "AAA_"))}
    server = subprocess.Popen(
        [sys.executable, "manage.py", "runserver", "--noreload", f"127.0.0.1:{port}"],
        cwd=ROOT,
        env={**clean, **env},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        wait_http(f"http://127.0.0.1:{port}/api/aaa/openapi.json", server)
        script = (
            "set -euo pipefail\n"
            + walkthrough()
            + '\necho; echo "RUNS $RUN $RUN2"\n'
            + first_run_over_rest()
            + '\necho; echo "FIRST RUN DONE"\n'
        )
        # the venv the README names is this one (bin/test and bin/serve make .venv)
        assert Path(ROOT / ".venv/bin/python").exists()
        result = subprocess.run(
            ["bash", "-c", script],
            cwd=ROOT,
            capture_output=True,
            text=True,
            env={**clean, **env, "PORT": str(port)},
            timeout=180,
        )
    finally:
        server.terminate()
        server.wait(10)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    out = result.stdout
    run, run2 = re.search(r"^RUNS (\S+) (\S+)$", out, re.M).groups()
    assert '"decision": "granted"' in out and "checked the numbers" in out
    assert '"type":"aaa.run.completed"' in out  # the stream ran to the run's end
    assert f'"id": "{run}"' in out and '"outcome": "success"' in out
    assert '"cancel_requested": true' in out
    first = out[out.index(f"RUNS {run} {run2}") :]  # the README's run, started over the API
    assert '"algorithm": "aaa.algos.ToolLoop"' in first and "FIRST RUN DONE" in first
    con = sqlite3.connect(db)
    try:
        rows = dict(con.execute("SELECT run_id, outcome FROM aaa_run").fetchall())
        assert rows.get(run) == "success"
        assert run2 not in rows  # erased
        assert con.execute("SELECT count(*) FROM aaa_event WHERE stream = ?", (run2,)).fetchone() == (0,)
    finally:
        con.close()
