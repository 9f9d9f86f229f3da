"""System checks for the cluster settings (aaa_django.checks: aaa.W101, aaa.E101-E105).

No services needed: the checks read settings only.
"""

from __future__ import annotations

import pytest
from django.test import override_settings

from aaa_django.checks import check_celery_bus, check_cluster_settings

SQLITE = {"default": {"ENGINE": "django.db.backends.sqlite3", "NAME": ":memory:"}}
POSTGRES = {"default": {"ENGINE": "django.db.backends.postgresql", "NAME": "aaa"}}


def ids(messages) -> list[str]:
    return sorted(m.id for m in messages)


pytestmark = pytest.mark.filterwarnings("ignore:Overriding setting DATABASES")


@pytest.fixture(autouse=True)
def broker_from_settings_only(monkeypatch):
    # A Celery app another test configured (or the environment) must not supply a
    # broker here: the broker is CELERY_BROKER_URL, as each test sets it.
    import aaa_django.conf as conf

    monkeypatch.setattr(conf, "_broker", None)  # no Celery app registered: the settings' URL


def test_the_in_process_bus_needs_nothing():
    with override_settings(AAA={"BUS": "inprocess"}, DATABASES=SQLITE):
        assert check_celery_bus() == []


def test_the_celery_bus_on_sqlite_is_a_warning():
    with override_settings(AAA={"BUS": "celery"}, DATABASES=SQLITE, CELERY_BROKER_URL="redis://h:6379/0"):
        assert ids(check_celery_bus()) == ["aaa.W101"]


def test_the_celery_bus_on_postgres_with_a_redis_broker_is_fine():
    with override_settings(AAA={"BUS": "celery"}, DATABASES=POSTGRES, CELERY_BROKER_URL="redis://h:6379/0"):
        assert check_celery_bus() == []


def test_no_broker_is_an_error():
    with override_settings(AAA={"BUS": "celery"}, DATABASES=POSTGRES):
        assert ids(check_celery_bus()) == ["aaa.E102", "aaa.E103"]


def test_a_non_redis_broker_needs_a_redis_url():
    with override_settings(AAA={"BUS": "celery"}, DATABASES=POSTGRES, CELERY_BROKER_URL="amqp://h//"):
        assert ids(check_celery_bus()) == ["aaa.E103"]
    with override_settings(
        AAA={"BUS": "celery", "REDIS_URL": "redis://h/0"}, DATABASES=POSTGRES, CELERY_BROKER_URL="amqp://h//"
    ):
        assert check_celery_bus() == []


@pytest.mark.parametrize(
    "aaa, problem",
    [
        ({"REDIS_URL": 6379}, "aaa.E104"),
        ({"CELERY_QUEUES": ["aaa.tools"]}, "aaa.E104"),
        ({"CELERY_QUEUES": {"gpu": "aaa.gpu"}}, "aaa.E104"),
        ({"CELERY_QUEUES": {"tools": ""}}, "aaa.E104"),
        ({"CELERY_FAST_PUBLISH": "yes"}, "aaa.E104"),
        ({"RUN_LOCK_TTL": 0}, "aaa.E104"),
        ({"LEASE_TTL": "30"}, "aaa.E104"),
        ({"STALL_AFTER": True}, "aaa.E104"),
        ({"WORKER_IN_FLIGHT": 0}, "aaa.E104"),
        ({"WORKER_IN_FLIGHT": 2.5}, "aaa.E104"),
        ({"WORKER_DRAIN_SECONDS": -1}, "aaa.E104"),
        ({"WORKER_DRAIN_SECONDS": "30"}, "aaa.E104"),
        ({"WORKER_SETUP": 42}, "aaa.E104"),
        ({"WORKER_SETUP": "no.such.module.setup"}, "aaa.E105"),
        ({"DUTY_EVERY": -1}, "aaa.E104"),
        ({"DUTY_DATABASE": "nowhere"}, "aaa.E104"),
    ],
    ids=lambda v: str(v) if isinstance(v, str) else "-".join(map(str, v.items())),
)
def test_bad_cluster_settings_are_errors(aaa, problem):
    with override_settings(AAA=aaa):
        assert ids(check_cluster_settings()) == [problem]


def test_good_cluster_settings_pass():
    good = {
        "REDIS_URL": "redis://h/0",
        "CELERY_QUEUES": {"tools": "acme.tools"},
        "RUN_LOCK_TTL": 5,
        "LEASE_TTL": 12.5,
        "STALL_AFTER": 120,
        "WORKER_SETUP": "tests.celery.site.setup",
        "WORKER_DRAIN_SECONDS": 0,
        "DUTY_EVERY": 0,
        "DUTY_DATABASE": "default",
    }
    with override_settings(AAA=good):
        assert check_cluster_settings() == []


def test_the_setting_chooses_the_bus():
    from aaa_django.celery.bus import DistributedBus
    from aaa_django.runtime import InProcessBus
    from aaa_django.site.engines import build_engine

    with override_settings(AAA={"BUS": "celery"}):
        assert isinstance(build_engine().bus, DistributedBus)
    with override_settings(AAA={"BUS": "inprocess"}):
        assert isinstance(build_engine().bus, InProcessBus)
