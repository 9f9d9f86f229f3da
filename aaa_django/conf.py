"""The app's settings: one ``AAA = {...}`` dict in the site's settings.

Every key is optional; a site sets only what it changes, and the rest comes from
``DEFAULTS``. Read the merged dict with :func:`aaa_settings` (read on every call, so
``override_settings(AAA=...)`` in tests is seen at once). The system checks in
``aaa_django.checks`` validate the dict at start-up.

==================  ===============  ============  ==========================================
Key                 Type             Default       Meaning
==================  ===============  ============  ==========================================
BUS                 str              "inprocess"   How appended events are delivered:
                                                   "inprocess" (asyncio, in the web or
                                                   command process) or "celery" (workers).
CLAIM_THRESHOLD     int >= 0         16384         An event whose JSON ``data`` is larger
                                                   than this many bytes is claim-checked:
                                                   its payload moves to the blob store.
BLOB_STORAGE        str or None      None          An alias in the site's ``STORAGES`` that
                                                   holds claim-checked blobs (e.g. an S3
                                                   bucket via django-storages). None: no
                                                   blob store, nothing is claim-checked.
FOLD_CHECK_EVERY    int >= 0         100           Every this many incremental folds, check
                                                   the cached state against a whole-log fold,
                                                   once the process is idle (15 s without a
                                                   read); 0 never checks.
MAX_ABANDONED_ATTEMPTS int >= 1      3             A run one of whose model calls has this
                                                   many attempts abandoned (their process
                                                   died with them in flight) ends "failed":
                                                   a crash loop cannot spend without limit.
-- cluster mode (``BUS = "celery"``; see ``aaa_django.celery.bus``) ------------------------------
REDIS_URL           str or None      None          Redis for the Celery bus's coordination:
                                                   locks of contended steps, shared pools,
                                                   cancel notices, delivery leases. None:
                                                   the Celery broker URL when it is Redis.
CELERY_QUEUES       dict             {}            Queue per kind of work ("algorithms",
                                                   "llm", "tools"), for workers sized per
                                                   kind; a kind not given goes to the
                                                   Celery app's default queue (so the
                                                   usual ``celery -A proj worker`` takes
                                                   everything).
CELERY_FAST_PUBLISH bool             True          Deliveries are sent through
                                                   ``aaa_django.celery.publish.FastPublisher`` (the
                                                   message ``send_task`` sends, with less CPU;
                                                   it falls back to ``send_task`` where the
                                                   two could differ). False: ``send_task``.
WORKER_SETUP        str or None      None          Dotted path of ``setup(engine)``, called on
                                                   every engine a worker builds: attach the
                                                   site's LLMHandler and ToolHandler there.
RUN_LOCK_TTL        number > 0       10            Seconds the lock a step takes after it
                                                   lost a race on its run's stream lives
                                                   unless renewed (a killed worker's lock
                                                   frees itself after this).
LEASE_TTL           number > 0       30            Seconds a tool-pool lease, a delivery's
                                                   busy mark or a guarded tool call's
                                                   lease lives unless renewed.
RUN_LEASE_TTL       number > 0       6             Seconds a process's lease on a run it
                                                   drives lives unless renewed (every
                                                   quarter of it, one statement for all
                                                   its runs; ``aaa_django.site.holding``).
                                                   Once it lapses another process adopts
                                                   the run; one that cannot renew stands
                                                   down (no model or tool call) at half.
ADOPT               bool             True          The web process's engine host (in-process
                                                   bus) starts with its first request and
                                                   adopts the runs whose holder is gone.
UNCERTAIN           str              "reconcile"   A side-effecting tool call that may have
                                                   run (its intent logged, no result, its
                                                   holder gone): "reconcile" (the run
                                                   waits for a person to say it ran / it
                                                   did not / run it again) or "fail" (the
                                                   run ends ``failed``, reason
                                                   ``uncertain_tool_call``).
STALL_AFTER         number > 0       60            The sweeper re-drives an unfinished run
                                                   with no new event and no live delivery
                                                   for this many seconds; the workers'
                                                   duty sweeps every STALL_AFTER / 2. A run
                                                   re-driven waits at least as long again
                                                   (at most 8x) before the next re-drive.
DUTY_EVERY          number >= 0      1             Seconds between turns of the workers'
                                                   periodic duty (``aaa_django.celery.duty``):
                                                   due deadlines and approval expiries
                                                   fired, stalled runs swept. 0: off.
DUTY_DATABASE       str              "default"     The database alias whose runs the duty
                                                   serves.
WORKER_IN_FLIGHT    int >= 1         1000          Deliveries one worker process carries at
                                                   once on its loop (model and tool calls
                                                   waiting); past it, the next task waits.
WORKER_DRAIN_SECONDS number >= 0     30            On a warm shutdown (SIGTERM), how long a
                                                   worker process waits for the calls its
                                                   loop holds; it then releases their runs'
                                                   busy leases (the sweeper re-drives them).
-- the web process's engine (``aaa_django.site.host``) and the REST API (``aaa_django.api``) --
LLM_CLIENT          str or None      None          Dotted path of a factory returning the
                                                   LLMClient the web process's engine uses.
                                                   None: model requests fail with a clear
                                                   "no model client configured" reason.
TOOLS               list of str      []            Dotted paths of the @tool functions the
                                                   web process's engine may run.
PROJECTIONS         list of str      []            Dotted paths of named Projections the API
                                                   and admin may show, besides the built-in
                                                   RUNMETA, LOOP and CONVERSATION.
API_MAX_BODY        int >= 1         1048576       Largest request body the API reads, in
                                                   bytes; larger ones get 413.
API_RATE            str or None      "600/min"     Requests per user and period ("N/s",
                                                   "N/min", "N/hour", "N/day"); over it: 429.
                                                   None: no limit.
API_KEY_FAILURES    str or None      "20/min"      Failed API-key attempts per client address
                                                   and period (same form); past it every key
                                                   attempt from that address gets 429 until
                                                   the period ends. None: no limit.
API_STREAMS_PER_USER int >= 1        10            Streams (SSE: a run's events, the runs'
                                                   changes) one user may hold open at once
                                                   (counted in the default cache, across
                                                   processes when it is shared); past it: 429.
API_STREAM_SECONDS  int >= 1         300           A stream (SSE) closes after this long; the
                                                   client resumes with Last-Event-ID.
CONVERSATION_IDLE   number > 0 or    3600          Seconds a conversation started over the
                    None                           API waits for its next message before it
                                                   ends ``timeout`` (a run's own
                                                   ``{"idle": seconds}`` wins). None: it
                                                   waits until closed, cancelled or its
                                                   deadline.
LLM                 dict or None     None          The model provider of the web process and
                                                   the demo: {"PROVIDER": "openai" |
                                                   "anthropic" | "pydantic-ai", "BASE_URL",
                                                   "API_KEY",
                                                   "MODEL", "TIMEOUT", "MAX_RETRIES",
                                                   "PRICING"} (docs/models.md). None: no
                                                   provider (the demo's model is scripted).
MCP_SERVERS         dict             {}            MCP servers whose tools every engine the
                                                   settings wire may run: {name: {"command",
                                                   "args"... or "url", "prefix", "pool"...}}
                                                   (aaa_django.site.mcp_settings).
AGENTS              list of str      []            Dotted paths of the pydantic_ai Agents
                                                   whose runs (PydanticAIAgent) this site
                                                   serves: every engine the settings wire
                                                   runs their tools; a run's config may
                                                   name only these (docs/agents.md).
-- retention (``aaa_django.site.retention``, ``manage.py aaa_retain``, task ``aaa.retain``) ----
RETENTION           dict             {}            Days an ended run is kept, by outcome:
                                                   {"success": 30, "failed": 90, "*": 365};
                                                   "*" is every outcome not named; an
                                                   outcome with no entry is kept forever.
RETENTION_BATCH     int >= 1         500           Run trees erased per transaction.
ORPHAN_GRACE        number >= 0      86400         A blob no event refers to is removed by
                                                   the orphan sweep once it is this many
                                                   seconds old (its event may be on its way).
OTEL                bool             False         OpenTelemetry spans and metrics of runs
                                                   from every engine the settings build
                                                   (the ``otel`` extra;
                                                   aaa_django.observe.otel, docs/observe.md).
STREAM_TOKENS       bool             False         Live tokens: the model clients stream and
                                                   each reply's text reaches the event
                                                   streams (SSE ``token`` messages) and the
                                                   admin's run page as it comes, never the
                                                   log (Redis pub/sub on the Celery bus).
==================  ===============  ============  ==========================================
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from django.conf import settings

DEFAULTS: dict[str, Any] = {
    "BUS": "inprocess",
    "CLAIM_THRESHOLD": 16384,
    "BLOB_STORAGE": None,
    "FOLD_CHECK_EVERY": 100,
    "MAX_ABANDONED_ATTEMPTS": 3,
    # cluster mode (aaa_django.celery.bus)
    "REDIS_URL": None,
    "CELERY_QUEUES": {},
    "CELERY_FAST_PUBLISH": True,
    "WORKER_SETUP": None,
    "RUN_LOCK_TTL": 10,
    "LEASE_TTL": 30,
    "STALL_AFTER": 60,
    "RUN_LEASE_TTL": 6,
    "ADOPT": True,
    "UNCERTAIN": "reconcile",
    "WORKER_IN_FLIGHT": 1000,
    "WORKER_DRAIN_SECONDS": 30,
    "DUTY_EVERY": 1,
    "DUTY_DATABASE": "default",
    # the web process's engine (aaa_django.site.host) and the REST API (aaa_django.api)
    "LLM_CLIENT": None,
    "TOOLS": [],
    "PROJECTIONS": [],
    "API_MAX_BODY": 1024 * 1024,
    "API_RATE": "600/min",
    "API_KEY_FAILURES": "20/min",
    "API_STREAM_SECONDS": 300,
    "API_STREAMS_PER_USER": 10,
    "CONVERSATION_IDLE": 3600,
    # the model provider (aaa_django.site.llm_settings; docs/models.md)
    "LLM": None,
    # MCP servers whose tools the site's engines may run (aaa_django.site.mcp_settings)
    "MCP_SERVERS": {},
    # Pydantic AI agents the site's engines serve (aaa_django.algos.pydantic_agent; docs/agents.md)
    "AGENTS": [],
    # retention (aaa_django.site.retention; docs/retention.md)
    "RETENTION": {},
    "RETENTION_BATCH": 500,
    "ORPHAN_GRACE": 86400,
    # OpenTelemetry spans and metrics of runs (aaa_django.observe.otel; docs/observe.md)
    "OTEL": False,
    # live tokens: streamed replies' text to the event streams (aaa_django.site.tokens)
    "STREAM_TOKENS": False,
}

BUSES = frozenset({"inprocess", "celery"})


def site_aaa() -> Any:
    """The raw ``settings.AAA`` value as the site wrote it (``{}`` when unset)."""
    return getattr(settings, "AAA", {})


def aaa_settings() -> dict[str, Any]:
    """The site's ``AAA`` dict merged over ``DEFAULTS``."""
    site = site_aaa()
    return {**DEFAULTS, **(site if isinstance(site, dict) else {})}


# -- the broker and Redis of the cluster -------------------------------------------------

#: URL schemes of a Redis server (a Celery broker of that kind doubles as the bus's Redis)
REDIS_SCHEMES = ("redis", "rediss", "unix")

#: the site's Celery broker URL, as the Celery app the bus publishes to has it: set by
#: the Celery adapter when the app is ready (``aaa_django.celery.wiring``); None while
#: no bus registered one (then ``settings.CELERY_BROKER_URL``)
_broker: Callable[[], str | None] | None = None


def set_broker(url: Callable[[], str | None] | None) -> None:
    """Name where the site's Celery broker URL is read (the Celery adapter does, from
    ``AppConfig.ready``); None forgets it."""
    global _broker
    _broker = url


def broker_url() -> str:
    """The site's Celery broker URL: the registered Celery app's, else
    ``settings.CELERY_BROKER_URL``; "" when there is none."""
    url = _broker() if _broker is not None else None
    return url or getattr(settings, "CELERY_BROKER_URL", None) or ""


def is_redis(url: str | None) -> bool:
    """Does ``url`` name a Redis server?"""
    return bool(url) and str(url).split(":", 1)[0] in REDIS_SCHEMES


def redis_url() -> str | None:
    """The Redis of the Celery bus (locks, leases, notices, live tokens):
    ``AAA["REDIS_URL"]``, else the Celery broker's URL when it is Redis; None when
    there is none."""
    url = aaa_settings()["REDIS_URL"]
    if url:
        return str(url)
    broker = broker_url()
    return broker if is_redis(broker) else None
