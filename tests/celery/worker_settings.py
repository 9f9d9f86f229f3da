"""Settings of the Celery worker processes the tests start: the test settings, with the
PostgreSQL alias pointing at the pytest process's *test* database (AAA_TEST_WORKER_DB,
``test_aaa`` or ``test_aaa_gwN``) and the cluster keys of ``AAA`` set."""

import json
import os

from tests.settings import *  # noqa: F401,F403
from tests.settings import DATABASES, STORAGES

DATABASES["postgres"]["NAME"] = os.environ["AAA_TEST_WORKER_DB"]
DATABASES["postgres"]["TEST"] = {"NAME": os.environ["AAA_TEST_WORKER_DB"]}

AAA = {
    "BUS": "celery",
    "REDIS_URL": os.environ["AAA_TEST_CELERY_BROKER"],
    # one setup serves every test's runs (tests/celery and tests/scenarios); a cluster
    # with tools and models of its own names another (tests/pydantic_ai)
    "WORKER_SETUP": os.environ.get("AAA_TEST_WORKER_SETUP", "tests.celery.site.setup"),
    # Short, so a killed worker's lock and leases free themselves quickly.
    "RUN_LOCK_TTL": 3,
    "LEASE_TTL": 4,
    # The workers' periodic duty (due times, sweeps) serves the test database, often:
    # every run in it, whichever cluster started it, and the runs it moves on go to its
    # own cluster's queues. So only clusters of the shared WORKER_SETUP (which serves
    # every test's runs) run it: a cluster with a setup of its own (tests/pydantic_ai)
    # would take another test's run onto workers without its tools and models.
    "DUTY_DATABASE": "postgres",
    "DUTY_EVERY": float(
        os.environ.get("AAA_TEST_DUTY_EVERY", "0" if os.environ.get("AAA_TEST_WORKER_SETUP") else "0.5")
    ),
}
# tests/celery/test_drain.py: how long a warm shutdown waits for the calls in flight
if os.environ.get("AAA_TEST_DRAIN_SECONDS"):
    AAA["WORKER_DRAIN_SECONDS"] = float(os.environ["AAA_TEST_DRAIN_SECONDS"])
# Claim-checked payloads in a directory the tests' engines share (celery_env).
STORAGES = {
    **STORAGES,
    "aaa-test-blobs": {
        "BACKEND": "django.core.files.storage.FileSystemStorage",
        "OPTIONS": {"location": os.environ["AAA_TEST_BLOB_DIR"]},
    },
}
AAA["BLOB_STORAGE"] = "aaa-test-blobs"
if os.environ.get("AAA_TEST_STALL_AFTER"):
    AAA["STALL_AFTER"] = float(os.environ["AAA_TEST_STALL_AFTER"])
if os.environ.get("AAA_TEST_MAX_ABANDONED"):
    AAA["MAX_ABANDONED_ATTEMPTS"] = int(os.environ["AAA_TEST_MAX_ABANDONED"])
# Queues per kind of work (workers take them with -Q); a test with workers of its own
# uses queues of its own (AAA_TEST_QUEUE_SUFFIX), so the shared workers never take its
# messages. AAA_TEST_DEFAULT_QUEUE=1: none named (the app's default queue).
if not os.environ.get("AAA_TEST_DEFAULT_QUEUE"):
    AAA["CELERY_QUEUES"] = {
        k: f"aaa.{k}{os.environ.get('AAA_TEST_QUEUE_SUFFIX', '')}" for k in ("algorithms", "llm", "tools")
    }
# Workers of tests/celery/test_tokens.py: the model is the OpenAI-compatible client on
# the test's local streaming server, and its replies stream to the site's live tokens.
if os.environ.get("AAA_TEST_MODEL_URL"):
    AAA["STREAM_TOKENS"] = True
    AAA["LLM_CLIENT"] = "tests.celery.site.local_model"
# Pydantic AI agents whose tools the workers run (tests/pydantic_ai/test_agent_crash.py)
if os.environ.get("AAA_TEST_AGENTS"):
    AAA["AGENTS"] = os.environ["AAA_TEST_AGENTS"].split(",")
# Workers of tests/celery/test_observe.py log JSON lines with each delivery's context
# (the README's LOGGING, to a file).
if os.environ.get("AAA_TEST_LOG_FILE"):
    LOGGING = {
        "version": 1,
        "disable_existing_loggers": False,
        "filters": {"aaa": {"()": "aaa_django.runtime.logcontext.DeliveryContext"}},
        "formatters": {"json": {"()": "aaa_django.runtime.logcontext.JsonFormatter"}},
        "handlers": {
            "file": {
                "class": "logging.FileHandler",
                "filename": os.environ["AAA_TEST_LOG_FILE"],
                "filters": ["aaa"],
                "formatter": "json",
            }
        },
        "root": {"handlers": ["file"], "level": "WARNING"},
        "loggers": {"celery.app.trace": {"level": "INFO"}},  # Celery's "Task ... succeeded"
    }
# Workers of tests/celery/test_observe.py's tracing test: OpenTelemetry on, every span
# written as a JSON line to a file, with the process that wrote it.
if os.environ.get("AAA_TEST_OTEL_FILE"):
    AAA["OTEL"] = True
    from opentelemetry import trace
    from opentelemetry.sdk.trace import SpanProcessor, TracerProvider
    from opentelemetry.sdk.trace.export import ConsoleSpanExporter, SimpleSpanProcessor

    class _Pid(SpanProcessor):
        def on_start(self, span, parent_context=None):
            span.set_attribute("test.pid", os.getpid())

    _provider = TracerProvider()
    _provider.add_span_processor(_Pid())
    _provider.add_span_processor(
        SimpleSpanProcessor(
            ConsoleSpanExporter(
                out=open(os.environ["AAA_TEST_OTEL_FILE"], "a"), formatter=lambda s: s.to_json(indent=None) + "\n"
            )
        )
    )
    trace.set_tracer_provider(_provider)
# Workers whose blobs are in S3 (AAA_TEST_WORKER_S3: the S3Storage OPTIONS, as JSON).
if os.environ.get("AAA_TEST_WORKER_S3"):
    STORAGES = {
        **STORAGES,
        "blobs": {"BACKEND": "storages.backends.s3.S3Storage", "OPTIONS": json.loads(os.environ["AAA_TEST_WORKER_S3"])},
    }
    AAA["BLOB_STORAGE"] = "blobs"
