"""``bin/serve``, the README's first command, as a new user runs it: on a clean copy of
the checkout (no ``.venv``, no ``var/``), so it makes its own ``.venv`` from
``requirements/base.txt``, migrates, runs the demo and serves; the admin's login page
answers, ``demo``/``demo`` logs in, and the demo run is in the admin's list of runs.
Then SIGTERM to its process group stops it and the development server's reloader, as
a supervisor (or CI) stops it. (Not SIGINT: a shell without job control starts its
background jobs with SIGINT ignored, and so would this test's server be.)"""

from __future__ import annotations

import http.cookiejar
import os
import re
import shutil
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

import pytest

from tests.field.services import free_port

from .checkout import copy_checkout

pytestmark = [pytest.mark.slow, pytest.mark.install]


def python3_is_this_python() -> bool:
    found = shutil.which("python3")
    if not found:
        return False
    version = subprocess.run(
        [found, "-c", "import sys; print(sys.version_info[:2])"], capture_output=True, text=True
    ).stdout.strip()
    return version == str(sys.version_info[:2])


def wait_until_served(url: str, server: subprocess.Popen, log: Path, timeout: float) -> None:
    """Until ``url`` answers (the first run installs the requirements: minutes)."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if server.poll() is not None:
            raise AssertionError(f"bin/serve exited ({server.returncode}):\n{log.read_text()[-4000:]}")
        try:
            urllib.request.urlopen(url, timeout=2)
            return
        except urllib.error.HTTPError:
            return
        except OSError:
            time.sleep(0.5)
    raise AssertionError(f"{url} did not answer in {timeout} s:\n{log.read_text()[-4000:]}")


def group_ended(group: int, within: float) -> bool:
    """Whether every process of the group has exited (waiting up to ``within`` s)."""
    end = time.monotonic() + within
    while time.monotonic() < end:
        try:
            os.killpg(group, 0)
        except ProcessLookupError:
            return True
        time.sleep(0.1)
    return False


def stop(server: subprocess.Popen) -> str:
    """SIGTERM to the process group; SIGKILL if it lingers. How it ended: "terminated"
    or "killed"."""
    os.killpg(server.pid, signal.SIGTERM)
    try:
        server.wait(60)
    except subprocess.TimeoutExpired:
        pass
    if server.poll() is not None and group_ended(server.pid, within=60):
        return "terminated"
    os.killpg(server.pid, signal.SIGKILL)
    server.wait(10)
    return "killed"


def test_bin_serve_on_a_clean_copy_serves_the_admin_with_the_demo_run(tmp_path: Path) -> None:
    checkout = copy_checkout(tmp_path / "checkout")
    assert not (checkout / ".venv").exists() and not (checkout / "var").exists()
    port = free_port()
    env = {
        k: v for k, v in os.environ.items() if not k.startswith(("DJANGO_", "AAA_", "PYTHON")) and k != "VIRTUAL_ENV"
    }
    env["PORT"] = str(port)
    if not python3_is_this_python():  # a leg of the matrix: its Python makes the venv
        env["PYTHON"] = sys.executable
    log = tmp_path / "serve.log"
    base = f"http://127.0.0.1:{port}"
    with log.open("w") as out:
        server = subprocess.Popen(
            ["bin/serve"],
            cwd=checkout,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
    try:
        wait_until_served(f"{base}/admin/login/", server, log, timeout=900)
        jar = http.cookiejar.CookieJar()
        browser = urllib.request.build_opener(urllib.request.HTTPCookieProcessor(jar))
        with browser.open(f"{base}/admin/login/", timeout=30) as page:
            assert page.status == 200
            form = page.read().decode()
        token = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', form).group(1)
        login = urllib.parse.urlencode(
            {"csrfmiddlewaretoken": token, "username": "demo", "password": "demo", "next": "/admin/"}
        ).encode()
        request = urllib.request.Request(
            f"{base}/admin/login/", data=login, headers={"Referer": f"{base}/admin/login/"}
        )
        with browser.open(request, timeout=30) as page:
            assert page.url == f"{base}/admin/", "the login did not take"
        with browser.open(f"{base}/admin/aaa/runrecord/", timeout=30) as page:
            assert page.status == 200
            runs = page.read().decode()
        with browser.open(f"{base}/chat/", timeout=30) as page:  # the session of the admin's login
            assert page.status == 200
            chat = page.read().decode()
    finally:
        ended = stop(server)
    said = log.read_text()
    assert f"admin:    http://127.0.0.1:{port}/admin/" in said  # it says where it serves
    assert f"chat:     http://127.0.0.1:{port}/chat/" in said
    assert 'id="chat-start"' in chat and "/static/chat/chat.js" in chat
    (run_id,) = re.findall(r"^Run (\S+): \d+ events$", said, re.M)
    assert "Outcome: success" in said
    assert run_id in runs, "the demo run is not in the admin's list of runs"
    assert ended == "terminated", "bin/serve (or its reloader's child) outlived SIGTERM"
