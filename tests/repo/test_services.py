"""The services bin/test starts are reachable through the fixtures in conftest."""

import pytest
from django.contrib.auth import get_user_model
from django.core.files.base import ContentFile
from django.db import connections


@pytest.mark.django_db(databases="__all__")
def test_each_database_alias_answers_and_isolates_tests(db_alias):
    vendor = {"default": "sqlite", "postgres": "postgresql"}[db_alias]
    assert connections[db_alias].vendor == vendor
    User = get_user_model()
    User.objects.db_manager(db_alias).create_user("someone")
    assert User.objects.using(db_alias).count() == 1  # rolled back after each test


@pytest.mark.django_db(databases="__all__", transaction=True)
def test_postgres_test_database_is_the_one_pytest_django_made(pg_alias):
    with connections[pg_alias].cursor() as cursor:
        cursor.execute("select current_database()")
        (name,) = cursor.fetchone()
    assert name.startswith("test_aaa")


def test_s3_round_trip_through_django_storages(s3_bucket):
    from storages.backends.s3 import S3Storage

    storage = S3Storage(**s3_bucket)
    name = storage.save("blobs/hello.txt", ContentFile(b"hello"))
    with storage.open(name) as f:
        assert f.read() == b"hello"
    assert storage.exists(name)


@pytest.mark.parametrize(
    "env, outcome",
    [
        ({"CI": "true"}, pytest.fail.Exception),
        ({"AAA_REQUIRE_SERVICES": "1"}, pytest.fail.Exception),
        ({}, pytest.skip.Exception),
    ],
)
def test_a_missing_service_fails_in_ci_and_skips_only_on_a_plain_developer_run(monkeypatch, env, outcome):
    from tests.conftest import require_service

    for name in ("CI", "AAA_REQUIRE_SERVICES"):
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    require_service("postgres", True)  # present: nothing happens
    with pytest.raises(outcome, match="'postgres' is not available"):
        require_service("postgres", False)


@pytest.mark.slow
@pytest.mark.parametrize("env, ends", [({}, "skipped"), ({"CI": "true"}, "error")])
def test_plain_pytest_without_services_skips_what_needs_them_and_ci_fails(env, ends, tmp_path):
    """A developer's plain ``pytest`` (no bin/test: no PostgreSQL alias) skips the tests
    whose django_db marker names the PostgreSQL database, and errors nowhere; under CI
    the same tests fail."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("AAA_", "DJANGO_", "PYTEST_")) and k != "CI"}
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:xdist", "tests/store/test_runindex_statement.py"],
        cwd=root,
        env={**clean, **env, "AAA_TEST_TMPDIR": str(tmp_path)},
        capture_output=True,
        text=True,
        timeout=120,
    )
    summary = result.stdout.strip().splitlines()[-1]
    if ends == "skipped":
        assert result.returncode == 0, result.stdout[-3000:]
        assert "skipped" in summary and "error" not in summary and "failed" not in summary
    else:
        assert result.returncode != 0 and "error" in summary, summary
