"""The site ``bench_celery.py`` runs: Django settings, the Celery app, a bare no-op
task, and the workers' handlers. One module, so the workers need only

    DJANGO_SETTINGS_MODULE=celery_site celery -A celery_site worker

with this directory on PYTHONPATH. Configured from the environment the driver sets:
AAA_BENCH_PG_HOST/PORT/NAME (PostgreSQL, durable) and AAA_BENCH_REDIS (broker and
coordination).

With AAA_BENCH_OTLP (an OTLP/HTTP endpoint) the site has tracing on: ``AAA["OTEL"]``,
and each worker process sets up the OpenTelemetry SDK as a deployment would
(:func:`trace_exports`) when Celery's pool starts it; its deliveries go to queues of
their own (``OTEL_QUEUES``), so a second set of workers with tracing on can serve the
same broker and database beside the first.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable

# -- Django settings ---------------------------------------------------------------------

SECRET_KEY = "bench-only"
INSTALLED_APPS = ["django.contrib.contenttypes", "django.contrib.auth", "aaa_django"]
DATABASES = {
    "default": {
        "ENGINE": "django.db.backends.postgresql",
        "HOST": os.environ.get("AAA_BENCH_PG_HOST", "127.0.0.1"),
        "PORT": os.environ.get("AAA_BENCH_PG_PORT", "5432"),
        "USER": "postgres",
        "PASSWORD": "",
        "NAME": os.environ.get("AAA_BENCH_PG_NAME", "aaa_bench"),
    }
}
USE_TZ = True
TIME_ZONE = "UTC"
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
LOGGING_CONFIG = None
BROKER = os.environ.get("AAA_BENCH_REDIS", "redis://127.0.0.1:6379/0")
OTLP = os.environ.get("AAA_BENCH_OTLP")  # tracing on, exported there
# a queue per kind of work, as the bench's workers take them (-Q)
QUEUES = {k: f"aaa.{k}" for k in ("algorithms", "llm", "tools")}
OTEL_QUEUES = {k: f"aaa.otel.{k}" for k in ("algorithms", "llm", "tools")}
AAA = {
    "BUS": "celery",
    "REDIS_URL": BROKER,
    "WORKER_SETUP": "celery_site.setup",
    "OTEL": bool(OTLP),
    "CELERY_QUEUES": OTEL_QUEUES if OTLP else QUEUES,
}

# -- the Celery app --------------------------------------------------------------------------

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "celery_site")

from celery import Celery  # noqa: E402
from celery.signals import worker_process_init, worker_process_shutdown, worker_ready  # noqa: E402

app = Celery("aaa_bench")
app.conf.update(
    broker_url=BROKER,
    broker_connection_retry_on_startup=True,
    task_ignore_result=True,
    worker_prefetch_multiplier=1,
    worker_hijack_root_logger=False,
)
app.autodiscover_tasks(["aaa_django"])
app.set_default()

HOP_QUEUE = "bench.hop"


@app.task(name="bench.hop", ignore_result=True, acks_late=True)
def hop(left: int, key: str, fast: bool | str = True) -> None:
    """The bare hop: a no-op task that enqueues the next one; the last records when.
    ``fast``: sent as the engine sends its deliveries (``FastPublisher``, the bus's
    publisher, one per sending thread); False: by ``app.send_task``."""
    if left > 0:
        args = [left - 1, key, fast]
        if not fast or not _publisher(fast).send("bench.hop", args, HOP_QUEUE, repr(args)):
            app.send_task("bench.hop", args, queue=HOP_QUEUE)
    else:
        _redis().set(key, repr(time.time()))


_publishers: dict = {}


def _publisher(kind: bool | str):
    if kind not in _publishers:
        from aaa_django.celery.publish import FastPublisher

        _publishers[kind] = FastPublisher(app)
    return _publishers[kind]


@app.task(name="bench.noop", ignore_result=True, acks_late=True)
def noop(key: str) -> None:
    """A bare no-op task for the throughput baseline: counts itself."""
    r = _redis()
    r.incr(key)


_client = None


def _redis():
    global _client
    if _client is None:
        import redis

        _client = redis.Redis.from_url(BROKER)
    return _client


@worker_ready.connect
def _ready(**kwargs):
    path = os.environ.get("AAA_BENCH_READY")
    if path:
        open(path, "w").write(str(os.getpid()))


def trace_exports(endpoint: str) -> Callable[[], None]:
    """Tracing on, as a site sets it up in each process before its engines are built:
    the SDK's tracer and meter providers made the process's own, spans exported by a
    ``BatchSpanProcessor`` (its own thread: batches of up to 512 spans, at least every
    5 s) and metrics by a ``PeriodicExportingMetricReader`` (every 60 s), both with the
    OTLP/HTTP exporters (protobuf, no compression: the SDK's defaults) to ``endpoint``.
    Returns what flushes and stops them (else they do at the process's exit)."""
    from opentelemetry import metrics, trace
    from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import PeriodicExportingMetricReader
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    resource = Resource.create({"service.name": "aaa-bench"})
    tracer_provider = TracerProvider(resource=resource)
    tracer_provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter(endpoint=f"{endpoint}/v1/traces")))
    trace.set_tracer_provider(tracer_provider)
    reader = PeriodicExportingMetricReader(OTLPMetricExporter(endpoint=f"{endpoint}/v1/metrics"))
    meter_provider = MeterProvider(resource=resource, metric_readers=[reader])
    metrics.set_meter_provider(meter_provider)

    def shutdown() -> None:
        tracer_provider.shutdown()
        meter_provider.shutdown()

    return shutdown


_stop_tracing: list[Callable[[], None]] = []


@worker_process_init.connect
def _trace_in_pool_process(**kwargs):
    # in the pool's process, after the fork: the exporters' threads and connections are its own
    if OTLP:
        _stop_tracing.append(trace_exports(OTLP))
    # bench_concurrency.py --gc-threshold (and --gc site): the collector as a site carrying
    # many runs a worker process may set it (docs/engine.md, many runs in one process;
    # project/collector.py)
    import gc

    if os.environ.get("AAA_BENCH_GC_THRESHOLD"):
        gc.set_threshold(*map(int, os.environ["AAA_BENCH_GC_THRESHOLD"].split(",")))
    if os.environ.get("AAA_BENCH_GC") == "freeze":
        gc.freeze()


@worker_process_shutdown.connect
def _flush_traces(**kwargs):
    # a prefork child leaves by os._exit: the SDK's atexit flush would not run
    for stop in _stop_tracing:
        stop()


# -- the workers' handlers -------------------------------------------------------------------


def script(turns: int, latency: float = 0.0) -> str:
    """A run's task: how many model calls, and how long each takes (seconds)."""
    return json.dumps({"turns": turns, "latency": latency})


async def scripted_model(request):
    """``turns`` model calls, each answered after ``latency`` seconds: a no-op tool
    call each, then an answer."""
    import asyncio

    from aaa_django.llm.fake import text, tool_call

    plan = json.loads(next(m.content for m in request.messages if m.role == "user"))
    if plan.get("latency"):
        await asyncio.sleep(plan["latency"])
    done = sum(1 for m in request.messages if m.role == "tool")
    return text("done") if done >= plan["turns"] - 1 else tool_call("noop", n=done)


def registry():
    from aaa_django.tools import ToolRegistry, tool

    @tool(name="noop", inline=True)
    def noop_tool(n: int = 0) -> int:
        """Does nothing."""
        return n

    return ToolRegistry([noop_tool])


def setup(engine) -> None:
    import switches

    from aaa_django.llm import FakeLLMClient, LLMHandler
    from aaa_django.tools import ToolHandler

    switches.apply()  # bench_concurrency.py --without: before the worker's first delivery

    LLMHandler(FakeLLMClient(scripted_model)).attach(engine)
    ToolHandler(registry()).attach(engine)


if os.environ.get("AAA_BENCH_TRACE"):  # bench_celery.py --trace: timestamps in the workers
    import trace_hops

    trace_hops.connect()
