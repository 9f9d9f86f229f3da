"""The example site in project/: its settings load, its admin answers, its demo user."""

import ast
import os
import subprocess
import sys
from pathlib import Path

import pytest
from django.contrib.auth import get_user_model
from django.test import override_settings

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.django_db
@override_settings(ROOT_URLCONF="project.urls")
def test_admin_login_page_answers_and_staff_get_in(client):
    assert client.get("/admin/login/").status_code == 200

    get_user_model().objects.create_superuser("staff", password="pw")
    client.login(username="staff", password="pw")
    assert client.get("/admin/").status_code == 200


def manage(*args: str, **env: str) -> subprocess.CompletedProcess:
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("DJANGO_", "AAA_"))}
    return subprocess.run(
        [sys.executable, "manage.py", *args],
        cwd=ROOT,
        env={**clean, **env},
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_example_settings_pass_checks_on_the_cluster_settings():
    result = manage(
        "check",
        AAA_DB="postgres",
        AAA_BUS="celery",
        AAA_REDIS_URL="redis://127.0.0.1:1/0",
        AAA_S3_BUCKET="aaa-blobs",
        AAA_S3_ENDPOINT="http://127.0.0.1:1",
    )
    assert result.returncode == 0, result.stderr


@pytest.mark.slow
def test_serve_setup_migrates_and_makes_the_demo_user_idempotently(tmp_path):
    """What bin/serve does before runserver, on a scratch SQLite file."""
    db = {"AAA_SQLITE_PATH": str(tmp_path / "site.sqlite3")}
    migrate = manage("migrate", "--noinput", **db)
    assert migrate.returncode == 0, migrate.stderr

    first = manage("demo_user", **db)
    second = manage("demo_user", **db)
    assert first.returncode == second.returncode == 0, first.stderr + second.stderr
    assert "created" in first.stdout
    assert "already present" in second.stdout

    login = manage(
        "shell",
        "-c",
        "from django.contrib.auth import authenticate;"
        "u = authenticate(username='demo', password='demo');"
        "print(u.is_staff and u.is_superuser)",
        **db,
    )
    assert login.stdout.strip().splitlines()[-1:] == ["True"], login.stdout + login.stderr


def collector_after(code: str, **env: str) -> tuple[tuple[int, ...], tuple[int, ...], bool]:
    """What a fresh process of the example site reports of its collector after ``code``:
    its thresholds before and after, and whether it froze objects (more in the permanent
    generation than at its start: Python 3.12+ starts with some there)."""
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("DJANGO_", "AAA_"))}
    script = (
        "import gc\ninitial, before = gc.get_threshold(), gc.get_freeze_count()\n"
        f"{code}\nprint(repr((initial, gc.get_threshold(), gc.get_freeze_count() > before)))"
    )
    result = subprocess.run(
        [sys.executable, "-c", script],
        cwd=ROOT,
        env={**clean, "DJANGO_SETTINGS_MODULE": "project.settings", **env},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    return ast.literal_eval(result.stdout.strip().splitlines()[-1])


ENTRY_POINTS = {
    "wsgi": "import project.wsgi",
    "asgi": "import project.asgi",
    # served with other settings than the site's (as the suite serves it)
    "asgi, the suite's settings": "import os\n"
    "os.environ['DJANGO_SETTINGS_MODULE'] = 'tests.settings'\n"
    "import project.asgi",
    # Celery's worker, in its main process and in each pool process as it starts
    "celery worker": "from project.celery import app\n"
    "from celery.signals import worker_init\n"
    "assert gc.get_threshold() == initial, 'set before the worker starts'\n"
    "worker_init.send(sender=None)",
    "celery pool process": "from project.celery import app\n"
    "from celery.signals import worker_process_init\n"
    "worker_process_init.send(sender=None)",
}


@pytest.mark.parametrize("entry", ENTRY_POINTS)
def test_the_site_processes_raise_the_collectors_threshold_and_freeze_what_they_loaded(entry):
    initial, tuned, frozen = collector_after(ENTRY_POINTS[entry])
    assert (tuned, frozen) == ((10000, 10, 10), True)

    _, chosen, frozen = collector_after(ENTRY_POINTS[entry], AAA_GC_THRESHOLD="5000,20,5")
    assert (chosen, frozen) == ((5000, 20, 5), True)

    # Python's own: 700, 10, 10 up to 3.12, 2,000, 10, 10 on 3.13
    _, left, frozen = collector_after(ENTRY_POINTS[entry], AAA_GC_THRESHOLD="python")
    assert (left, frozen) == (initial, False)
    assert initial != (10000, 10, 10)


@pytest.mark.parametrize("value", ["10000,10", "many", "0,10,10", "10000,-1,10"])
def test_a_wrong_collector_threshold_stops_every_command_with_its_reason(value):
    result = manage("check", AAA_GC_THRESHOLD=value)
    assert result.returncode != 0
    assert f"AAA_GC_THRESHOLD={value!r}: three whole numbers G0,G1,G2" in result.stderr
