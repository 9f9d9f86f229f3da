"""Shared fixtures: the database aliases and the services bin/test starts.

A test that needs a service asks for it through a fixture here. Without the service it
is skipped on a developer's `pytest`, but fails under bin/test and CI
(AAA_REQUIRE_SERVICES=1 or CI set), so a broken service never hides as a skip.

Fixtures:
  db_alias     "default" (SQLite) and "postgres", parametrised (ids sqlite, postgres);
               mark the test @pytest.mark.django_db(databases="__all__") (or list it).
  pg_alias     "postgres"; the PostgreSQL alias alone.
  s3_endpoint  the S3-compatible endpoint URL (moto under bin/test).
  s3_bucket    a fresh bucket on it: a dict of django-storages S3Storage OPTIONS.
  redis_url    the Redis server's URL (bin/test starts one: AAA_TEST_REDIS_URL).
  amqp_url     (session) RabbitMQ's URL (bin/test boots one: AAA_TEST_AMQP_URL), once
               it answers.
  celery_env   (session) the environment of Celery worker processes (tests/celery,
               tests/scenarios): this xdist worker's Redis database as the broker
               (gw0 -> db 1, gw1 -> db 2, ...), the PostgreSQL test database's name,
               the worker settings. Creates the table the guarded tool of
               tests/celery/site.py records executions in.
"""

from __future__ import annotations

import os
import re
import uuid

import pytest
from django.conf import settings

S3_ACCESS_KEY = "testing"
S3_SECRET_KEY = "testing"
S3_REGION = "us-east-1"


def _truthy(value: str | None) -> bool:
    return (value or "").strip().lower() not in ("", "0", "false", "no", "off")


def services_required() -> bool:
    return _truthy(os.environ.get("CI")) or os.environ.get("AAA_REQUIRE_SERVICES") == "1"


def require_service(name: str, available: bool) -> None:
    """Skip (developer run) or fail (bin/test, CI) when service `name` is missing."""
    if available:
        return
    message = f"service {name!r} is not available (bin/test starts it)"
    if services_required():
        pytest.fail(message, pytrace=False)
    pytest.skip(message)


@pytest.fixture(scope="session")
def django_db_setup(django_db_setup):
    """pytest-django's, and before its test databases are dropped: the async store's
    own PostgreSQL connections closed (:mod:`aaa_django.store.connections`) and its
    SQLite ones (:mod:`aaa_django.store.sqlite`), and the
    wake-ups' listening and notifying ones (:mod:`aaa_django.store.wakeups`): an open one
    would keep its database."""
    yield
    from asgiref.sync import async_to_sync

    from aaa_django.site.host import EngineHost
    from aaa_django.store import sqlite, wakeups
    from aaa_django.store.connections import close_all

    EngineHost.reset()  # (a web request's test may have started it: its connections go too)

    async_to_sync(close_all)()
    sqlite.close_all()
    wakeups.stop_all()
    _close_executor_connections()


def _close_executor_connections() -> None:
    """Close the Django connections of asgiref's thread for thread-sensitive sync code
    called from a loop no ``async_to_sync`` started (a test's ``asyncio.run``: the
    Django store's async path runs its queries there): the thread outlives the tests,
    and its connections would keep the test databases from being dropped."""
    import asyncio

    from asgiref.sync import sync_to_async
    from django.db import connections

    asyncio.run(sync_to_async(connections.close_all, thread_sensitive=True)())


@pytest.fixture
def pg_alias() -> str:
    require_service("postgres", "postgres" in settings.DATABASES)
    return "postgres"


@pytest.fixture(params=["default", "postgres"], ids=["sqlite", "postgres"])
def db_alias(request: pytest.FixtureRequest) -> str:
    if request.param == "postgres":
        require_service("postgres", "postgres" in settings.DATABASES)
    return request.param


@pytest.fixture
def s3_endpoint() -> str:
    endpoint = os.environ.get("AAA_TEST_S3_ENDPOINT", "")
    require_service("s3", bool(endpoint))
    return endpoint


@pytest.fixture
def s3_bucket(s3_endpoint: str) -> dict:
    import boto3

    name = f"aaa-test-{uuid.uuid4().hex[:12]}"
    client = boto3.client(
        "s3",
        endpoint_url=s3_endpoint,
        aws_access_key_id=S3_ACCESS_KEY,
        aws_secret_access_key=S3_SECRET_KEY,
        region_name=S3_REGION,
    )
    client.create_bucket(Bucket=name)
    return {
        "bucket_name": name,
        "endpoint_url": s3_endpoint,
        "access_key": S3_ACCESS_KEY,
        "secret_key": S3_SECRET_KEY,
        "region_name": S3_REGION,
    }


@pytest.fixture
def redis_url() -> str:
    url = os.environ.get("AAA_TEST_REDIS_URL", "")
    require_service("redis", bool(url))
    return url


#: seconds RabbitMQ may take to boot (bin/test starts it in the background)
AMQP_BOOT = 180


@pytest.fixture(scope="session")
def amqp_url() -> str:
    url = os.environ.get("AAA_TEST_AMQP_URL", "")
    require_service("rabbitmq", bool(url))
    from kombu import Connection

    with Connection(url, connect_timeout=2) as conn:
        try:
            conn.ensure_connection(max_retries=AMQP_BOOT, interval_start=1, interval_step=0, interval_max=1)
        except Exception as exc:  # noqa: BLE001 (any way it failed: the service is not there)
            pytest.fail(f"RabbitMQ at {url} did not answer in {AMQP_BOOT} s: {exc}", pytrace=False)
    return url


def _broker_url(base: str) -> str:
    gw = os.environ.get("PYTEST_XDIST_WORKER", "gw0")
    index = int(re.sub(r"\D", "", gw) or 0) + 1
    return re.sub(r"/\d*$", "", base.rstrip("/")) + f"/{index}"


@pytest.fixture(scope="session")
def celery_env(django_db_setup, django_db_blocker, tmp_path_factory) -> dict[str, str]:
    from django.db import connections

    from tests.celery.site import EXEC_TABLE

    base = os.environ.get("AAA_TEST_REDIS_URL", "")
    require_service("redis", bool(base))
    require_service("postgres", "postgres" in settings.DATABASES)
    broker = _broker_url(base)
    os.environ["AAA_TEST_CELERY_BROKER"] = broker
    from tests.celery_app import app

    app.conf.broker_url = broker
    import redis

    redis.Redis.from_url(broker).flushdb()
    with django_db_blocker.unblock():
        with connections["postgres"].cursor() as cur:
            cur.execute(
                f"CREATE TABLE IF NOT EXISTS {EXEC_TABLE} "
                "(key text NOT NULL, n int, pid int, at timestamptz DEFAULT now())"
            )
        db_name = connections["postgres"].settings_dict["NAME"]
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "tests.celery.worker_settings",
        "AAA_TEST_WORKER_DB": db_name,
        "AAA_TEST_CELERY_BROKER": broker,
        # claim-checked payloads: a directory the workers and the tests share
        "AAA_TEST_BLOB_DIR": str(tmp_path_factory.mktemp("blobs")),
        "PYTHONUNBUFFERED": "1",
    }
    os.environ["AAA_TEST_BLOB_DIR"] = env["AAA_TEST_BLOB_DIR"]
    env.pop("PYTEST_XDIST_WORKER", None)
    return env


def _named_databases(item: pytest.Item) -> set[str]:
    """The database aliases a test's django_db marker names ("__all__": none by name)."""
    marker = item.get_closest_marker("django_db")
    if marker is None:
        return set()
    names = marker.kwargs.get("databases", marker.args[1] if len(marker.args) > 1 else None)
    return set() if names in (None, "__all__") else set(names)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Mark tests by the services they use, so `-m "not postgres"` works; a test whose
    django_db marker names a database that is not configured (PostgreSQL without
    bin/test) is skipped on a developer's run, and fails under bin/test and CI."""
    for item in items:
        names = getattr(item, "fixturenames", ())
        callspec = getattr(item, "callspec", None)
        params = callspec.params if callspec else {}
        if "pg_alias" in names or params.get("db_alias") == "postgres" or "postgres" in _named_databases(item):
            item.add_marker(pytest.mark.postgres)
        missing = _named_databases(item) - set(settings.DATABASES)
        if missing and not services_required():
            item.add_marker(
                pytest.mark.skip(
                    reason=f"service 'postgres' is not available (bin/test starts it): "
                    f"database {sorted(missing)} is not configured"
                )
            )
        if "s3_endpoint" in names:
            item.add_marker(pytest.mark.s3)
        if "redis_url" in names:
            item.add_marker(pytest.mark.redis)
        # the amqp_url fixture, or a broker parametrised by name (tests/celery)
        if "amqp_url" in names or (callspec and "rabbitmq" in callspec.id.split("-")):
            item.add_marker(pytest.mark.rabbitmq)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None):
    """A test's teardown (pytest-django's flush of a ``transaction=True`` test among
    it) with :class:`tests.flush.LockFirst` on every PostgreSQL connection of this
    thread: the flush cannot deadlock with the workers still reading the database."""
    from contextlib import ExitStack

    from django.db import connections

    from tests.flush import LockFirst

    with ExitStack() as stack:
        for alias in settings.DATABASES:
            if connections[alias].vendor == "postgresql":
                stack.enter_context(connections[alias].execute_wrapper(LockFirst()))
        return (yield)


#: lines of a failed test's captured output the digest keeps (its head and its tail)
DIGEST_HEAD, DIGEST_TAIL = 30, 10


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    """A failed test's digest for bin/test (AAA_TEST_FAILURES: a file it prints after
    every leg has run): the test, the error's message and its captured output's head
    and tail. CI keeps the head and the tail of the whole output, so a failure in the
    first leg was cut to its traceback's first lines and what the test printed (a hung
    run's last events, say) was lost. Written by the process that reports (xdist's
    controller, not its workers)."""
    path = os.environ.get("AAA_TEST_FAILURES")
    if not path or not report.failed or os.environ.get("PYTEST_XDIST_WORKER"):
        return
    crash = getattr(report.longrepr, "reprcrash", None)
    lines = [f"=== {report.nodeid} ({report.when})", (crash.message if crash else str(report.longrepr))[-3000:]]
    for title, text in report.sections:
        out = text.splitlines()
        if len(out) > DIGEST_HEAD + DIGEST_TAIL:
            out = [*out[:DIGEST_HEAD], f"[... {len(out) - DIGEST_HEAD - DIGEST_TAIL} lines ...]", *out[-DIGEST_TAIL:]]
        lines += [f"--- {title}", *out]
    with open(path, "a", encoding="utf-8") as f:
        f.write("\n".join(lines) + "\n")
