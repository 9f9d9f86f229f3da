"""System checks for the ``AAA`` settings dict (registered in ``AaaConfig.ready``).

=========  =====================================================================
Id         Problem
=========  =====================================================================
aaa.E001   ``AAA`` is not a dict.
aaa.E002   ``AAA`` has a key this app does not know (a typo, usually).
aaa.E003   A value has the wrong type.
aaa.E004   ``BUS`` is not one of "inprocess", "celery".
aaa.E005   A number is out of range (negative).
aaa.E006   ``BLOB_STORAGE`` names no alias in ``STORAGES``.
aaa.E007   ``BLOB_STORAGE``'s storage backend cannot be imported (an S3 storage without
           the ``s3`` extra: django-storages and boto3).
aaa.E008   ``MAX_ABANDONED_ATTEMPTS`` is below 1.
aaa.E020   ``LLM_CLIENT``, a ``TOOLS``, ``PROJECTIONS`` or ``AGENTS`` entry is not an
           importable dotted path to the right kind of object (a factory, a tool, a
           named Projection, a ``pydantic_ai.Agent``); ``AGENTS`` without the
           ``pydantic-ai`` extra.
aaa.E021   ``API_RATE`` or ``API_KEY_FAILURES`` is not "N/period" (period: s, sec, m,
           min, h, hour, d, day).
aaa.E022   ``API_MAX_BODY``, ``API_STREAM_SECONDS`` or ``API_STREAMS_PER_USER`` is below 1.
aaa.E023   ``CONVERSATION_IDLE`` is not a number above 0, nor None.
aaa.E050   ``OTEL`` is not a bool, or it is True and the ``otel`` extra
           (``opentelemetry-api``) is not installed.
aaa.E061   A model the site's runs would be sent to cannot be built: ``LLM`` with
           ``PROVIDER`` "pydantic-ai", or an ``AGENTS`` agent's own model named by a
           string, names a provider Pydantic AI does not know, whose package is not
           installed, or whose key is nowhere (every model call would fail).
aaa.E062   An ``AGENTS`` agent has no model of its own, and the site configures no
           model client (``LLM``, ``LLM_CLIENT`` or ``WORKER_SETUP``): every model
           call of its runs would fail.
aaa.W001   A SQLite database without ``transaction_mode: IMMEDIATE`` (appends inside
           a caller's transaction may fail with "database is locked").
aaa.W020   The API's limits (``API_RATE``, ``API_KEY_FAILURES``,
           ``API_STREAMS_PER_USER``) count in the default
           cache, and it is per process (local memory) or stores nothing (dummy),
           outside DEBUG: each process counts alone.
=========  =====================================================================
"""

from __future__ import annotations

import importlib.util
from collections.abc import Callable, Sequence

from django.apps import AppConfig
from django.conf import settings
from django.core.checks import Error, Warning, register
from django.core.exceptions import ImproperlyConfigured
from django.utils.module_loading import import_string

from .conf import BUSES, DEFAULTS, aaa_settings, broker_url, redis_url, site_aaa
from .events import Projection
from .runtime.outcome import OUTCOMES
from .tools import Tool

# key -> (accepted types, readable name). bool (an int to isinstance) is refused where an
# int is wanted.
_TYPES: dict[str, tuple[tuple[type, ...], str]] = {
    "BUS": ((str,), "a str"),
    "CLAIM_THRESHOLD": ((int,), "an int"),
    "BLOB_STORAGE": ((str, type(None)), "a str (a STORAGES alias) or None"),
    "FOLD_CHECK_EVERY": ((int,), "an int"),
    "STREAM_TOKENS": ((bool,), "True or False"),
    "MAX_ABANDONED_ATTEMPTS": ((int,), "an int"),
}
_NON_NEGATIVE = ("CLAIM_THRESHOLD", "FOLD_CHECK_EVERY")

#: the extra that installs each optional package (pyproject.toml's optional-dependencies),
#: for the hint of a check whose import failed for want of it
_EXTRA_OF = {
    "celery": "celery",
    "kombu": "celery",
    "redis": "celery",
    "psycopg": "postgres",
    "storages": "s3",
    "boto3": "s3",
    "botocore": "s3",
    "openai": "openai",
    "anthropic": "anthropic",
    "pydantic_ai": "pydantic-ai",
    "mcp": "mcp",
    "opentelemetry": "otel",
}


def _install_hint(missing: str | None) -> str | None:
    """``pip install 'aaa_django[extra]'`` when ``missing`` (an ImportError's ``name``)
    is in a package one of the extras installs, and that package is not installed."""
    top = (missing or "").partition(".")[0]
    extra = _EXTRA_OF.get(top)
    if extra is None or importlib.util.find_spec(top) is not None:
        return None
    return f"pip install 'aaa_django[{extra}]'"


def check_aaa_settings(app_configs: Sequence[AppConfig] | None = None, **kwargs: object) -> list[Error]:
    site = site_aaa()
    if not isinstance(site, dict):
        return [
            Error(
                f"AAA must be a dict, not {type(site).__name__}.",
                hint="Set AAA = {...} in your settings, or leave it out.",
                id="aaa.E001",
            )
        ]
    errors: list[Error] = []
    for key in sorted(set(site) - set(DEFAULTS), key=str):
        errors.append(
            Error(
                f"AAA has an unknown key {key!r}.",
                hint="Known keys: " + ", ".join(DEFAULTS) + ".",
                id="aaa.E002",
            )
        )
    badly_typed = set()
    for key, (types, readable) in _TYPES.items():
        if key not in site:
            continue
        value = site[key]
        if (isinstance(value, bool) and bool not in types) or not isinstance(value, types):
            badly_typed.add(key)
            errors.append(
                Error(
                    f"AAA[{key!r}] must be {readable}, not {type(value).__name__}.",
                    id="aaa.E003",
                )
            )
    if "BUS" in site and "BUS" not in badly_typed and site["BUS"] not in BUSES:
        errors.append(
            Error(
                f"AAA['BUS'] is {site['BUS']!r}.",
                hint="Use one of: " + ", ".join(sorted(BUSES)) + ".",
                id="aaa.E004",
            )
        )
    for key in _NON_NEGATIVE:
        if key in site and key not in badly_typed and site[key] < 0:
            errors.append(Error(f"AAA[{key!r}] must be >= 0, not {site[key]}.", id="aaa.E005"))
    if (
        "MAX_ABANDONED_ATTEMPTS" in site
        and "MAX_ABANDONED_ATTEMPTS" not in badly_typed
        and site["MAX_ABANDONED_ATTEMPTS"] < 1
    ):
        errors.append(
            Error(
                f"AAA['MAX_ABANDONED_ATTEMPTS'] must be >= 1, not {site['MAX_ABANDONED_ATTEMPTS']}.",
                hint="The abandoned attempts of one model call that end its run failed.",
                id="aaa.E008",
            )
        )
    alias = site.get("BLOB_STORAGE")
    if isinstance(alias, str) and alias not in getattr(settings, "STORAGES", {}):
        errors.append(
            Error(
                f"AAA['BLOB_STORAGE'] is {alias!r}, which is not an alias in STORAGES.",
                hint="Add STORAGES[" + repr(alias) + "] or set BLOB_STORAGE to None.",
                id="aaa.E006",
            )
        )
    elif isinstance(alias, str):
        errors.extend(_storage_backend(alias))
    return errors


def _storage_backend(alias: str) -> list[Error]:
    """``aaa.E007``: the backend of ``STORAGES[alias]`` imports (django-storages' S3
    backend raises ``ImproperlyConfigured`` without boto3, an ``ImportError`` names a
    missing django-storages)."""
    entry = settings.STORAGES[alias]
    backend = entry.get("BACKEND") if isinstance(entry, dict) else None
    if not isinstance(backend, str):
        return []  # Django's storage handler says so when the alias is used
    try:
        import_string(backend)
        return []
    except ImportError as exc:
        problem, missing = exc, exc.name
    except ImproperlyConfigured as exc:
        problem, missing = exc, "boto3" if "boto3" in str(exc).lower() else None
    return [
        Error(
            f"AAA['BLOB_STORAGE'] is {alias!r}, whose storage backend {backend!r} cannot be imported: {problem}",
            hint=_install_hint(missing) or "Install the package that provides the backend, or correct its dotted path.",
            id="aaa.E007",
        )
    ]


def check_otel_settings(app_configs: Sequence[AppConfig] | None = None, **kwargs: object) -> list[Error]:
    """``aaa.E050``: ``AAA["OTEL"]`` is a bool, and True only with OpenTelemetry installed."""
    site = site_aaa()
    value = site.get("OTEL", False) if isinstance(site, dict) else False
    if not isinstance(value, bool):
        return [Error(f"AAA['OTEL'] must be True or False, not {type(value).__name__}.", id="aaa.E050")]
    if value:
        try:
            import opentelemetry.metrics
            import opentelemetry.trace  # noqa: F401
        except ImportError:
            return [
                Error(
                    "AAA['OTEL'] is True but OpenTelemetry is not installed.",
                    hint="pip install 'aaa_django[otel]', or set AAA['OTEL'] = False.",
                    id="aaa.E050",
                )
            ]
    return []


# -- the models runs are sent to (aaa.E060: AAA["LLM"] itself, site/llm_settings.py) ------


@register()
def check_models(app_configs: Sequence[AppConfig] | None = None, **kwargs: object) -> list[Error]:
    """``aaa.E061`` and ``aaa.E062``: a combination of model settings that cannot work
    is an error at start-up, not a failed run."""
    site = site_aaa()
    if not isinstance(site, dict):
        return []
    from .site.llm_settings import llm_options

    errors: list[Error] = []
    try:
        options = llm_options()
    except ImproperlyConfigured:  # aaa.E060 says what
        options, configured = None, True
    else:
        configured = options is not None
    if options is not None and options["PROVIDER"] == "pydantic-ai":
        problem = _unbuildable(options["MODEL"], options["BASE_URL"], options["API_KEY"])
        if problem:
            errors.append(
                Error(
                    f"AAA['LLM']: Pydantic AI cannot build the model {options['MODEL']!r}: {problem}",
                    hint="MODEL is 'provider:model' (docs/models.md); install the provider's "
                    "extra of pydantic-ai-slim and give API_KEY.",
                    id="aaa.E061",
                )
            )
    site_model = configured or bool(site.get("LLM_CLIENT")) or bool(site.get("WORKER_SETUP"))
    paths = site.get("AGENTS")
    for path in paths if isinstance(paths, (list, tuple)) else ():
        try:
            agent = import_string(path)
        except ImportError:
            continue  # aaa.E020
        if not _is_agent(agent):
            continue
        if agent.model is None and not site_model:
            errors.append(
                Error(
                    f"AAA['AGENTS']: {path!r} has no model of its own and the site configures "
                    "none, so every model call of its runs would fail.",
                    hint="Give the agent a model (Agent(model, ...)), or set AAA['LLM'].",
                    id="aaa.E062",
                )
            )
        elif isinstance(agent.model, str) and (problem := _unbuildable(agent.model, None, None)):
            errors.append(
                Error(
                    f"AAA['AGENTS']: Pydantic AI cannot build the model {agent.model!r} of {path!r}: {problem}",
                    id="aaa.E061",
                )
            )
    return errors


def _unbuildable(model: str, base_url: str | None, api_key: str | None) -> str | None:
    """Why Pydantic AI cannot build ``model`` as the site's client would (None: it can)."""
    from .llm.pydantic_ai_client import PydanticAIClient
    from .site.llm_settings import provider_client

    try:
        client = provider_client("pydantic-ai", model, base_url=base_url, api_key=api_key)
    except ImportError:  # the extra is missing: aaa.E060 names the install
        return None
    assert isinstance(client, PydanticAIClient)
    try:
        client.build(None, client.make_sdk())
    except Exception as exc:  # any way it fails: every call would fail the same way
        return client.redact(f"{type(exc).__name__}: {exc}")
    return None


# -- the web process's engine and the REST API (LLM_CLIENT ... API_STREAM_SECONDS) -------

_RATE_PERIODS = ("s", "sec", "m", "min", "h", "hour", "d", "day")


def check_api_settings(app_configs: Sequence[AppConfig] | None = None, **kwargs: object) -> list[Error]:
    """Checks of the keys read by ``aaa_django.site.host`` and ``aaa_django.api``."""
    site = site_aaa()
    if not isinstance(site, dict):
        return []  # aaa.E001 says so already
    errors: list[Error] = []

    def wrong_type(key: str, readable: str) -> None:
        errors.append(Error(f"AAA[{key!r}] must be {readable}, not {type(site[key]).__name__}.", id="aaa.E003"))

    client = site.get("LLM_CLIENT")
    if "LLM_CLIENT" in site and client is not None:
        if not isinstance(client, str):
            wrong_type("LLM_CLIENT", "a dotted path (str) or None")
        else:
            errors.extend(_dotted("LLM_CLIENT", client, callable, "a callable factory"))
    for key, accepts, readable in (
        ("TOOLS", _is_tool, "a tool (@tool) or a function"),
        ("PROJECTIONS", _is_named_projection, "a Projection with a name"),
        ("AGENTS", _is_agent, "a pydantic_ai.Agent"),
    ):
        if key not in site:
            continue
        paths = site[key]
        if not isinstance(paths, (list, tuple)) or not all(isinstance(p, str) for p in paths):
            wrong_type(key, "a list of dotted paths (str)")
            continue
        if key == "AGENTS" and paths and importlib.util.find_spec("pydantic_ai") is None:
            errors.append(
                Error(
                    "AAA['AGENTS'] names Pydantic AI agents, but pydantic-ai is not installed.",
                    hint="pip install 'aaa_django[pydantic-ai]'",
                    id="aaa.E020",
                )
            )
            continue
        for path in paths:
            errors.extend(_dotted(key, path, accepts, readable))
    for key in ("API_MAX_BODY", "API_STREAM_SECONDS", "API_STREAMS_PER_USER"):
        if key not in site:
            continue
        value = site[key]
        if isinstance(value, bool) or not isinstance(value, int):
            wrong_type(key, "an int")
        elif value < 1:
            errors.append(Error(f"AAA[{key!r}] must be >= 1, not {value}.", id="aaa.E022"))
    idle = site.get("CONVERSATION_IDLE")
    if idle is not None and (isinstance(idle, bool) or not isinstance(idle, (int, float)) or idle <= 0):
        errors.append(
            Error(
                f"AAA['CONVERSATION_IDLE'] must be a number of seconds above 0, or None, not {idle!r}.", id="aaa.E023"
            )
        )
    for key in ("API_RATE", "API_KEY_FAILURES"):
        rate = site.get(key)
        if rate is None:
            continue
        if not isinstance(rate, str):
            wrong_type(key, 'a str such as "600/min", or None')
        elif not _valid_rate(rate):
            errors.append(
                Error(
                    f"AAA[{key!r}] is {rate!r}.",
                    hint='Write "N/period", e.g. "600/min"; periods: ' + ", ".join(_RATE_PERIODS),
                    id="aaa.E021",
                )
            )
    return errors


#: cache backends that count per process (or not at all)
_LOCAL_CACHES = ("django.core.cache.backends.locmem.LocMemCache", "django.core.cache.backends.dummy.DummyCache")


def check_api_cache(app_configs: Sequence[AppConfig] | None = None, **kwargs: object) -> list[Warning]:
    """``aaa.W020``: the API's limits count in the default cache; a per-process one
    lets every process (and every worker of a server) count alone."""
    from django.conf import settings as s

    conf = aaa_settings()
    limits = [k for k in ("API_RATE", "API_KEY_FAILURES", "API_STREAMS_PER_USER") if conf.get(k)]
    backend = s.CACHES.get("default", {}).get("BACKEND", "")
    if not limits or s.DEBUG or backend not in _LOCAL_CACHES:
        return []
    return [
        Warning(
            f"AAA[{limits[0]!r}] is counted in the default cache, {backend.rsplit('.', 1)[-1]}, "
            "which is per process: each server process counts on its own, so the limit is "
            "multiplied by the number of processes.",
            hint="Set CACHES['default'] to a shared cache (Redis, Memcached or the database "
            "cache), or set the limits to None.",
            id="aaa.W020",
        )
    ]


def _dotted(key: str, path: str, accepts: Callable[[object], bool], readable: str) -> list[Error]:
    try:
        obj = import_string(path)
    except ImportError as exc:
        return [
            Error(
                f"AAA[{key!r}]: cannot import {path!r} ({exc}).",
                hint=_install_hint(getattr(exc, "name", None)),
                id="aaa.E020",
            )
        ]
    if not accepts(obj):
        return [Error(f"AAA[{key!r}]: {path!r} is not {readable}.", id="aaa.E020")]
    return []


def _is_tool(obj: object) -> bool:
    return isinstance(obj, Tool) or callable(obj)


def _is_named_projection(obj: object) -> bool:
    return isinstance(obj, Projection) and bool(obj.name)


def _is_agent(obj: object) -> bool:
    try:
        from pydantic_ai import Agent
    except ImportError:  # pragma: no cover - depends on the installation
        return False
    return isinstance(obj, Agent)


def _valid_rate(rate: str) -> bool:
    count, _, period = rate.partition("/")
    if not count.isdigit() or int(count) < 1:
        return False
    unit = period.lstrip("0123456789")
    multiplier = period[: len(period) - len(unit)]
    return unit in _RATE_PERIODS and (multiplier == "" or int(multiplier) >= 1)


# --- cluster mode: the Celery bus (aaa_django.celery.bus) -------------------------------------
#
# =========  =====================================================================
# Id         Problem
# =========  =====================================================================
# aaa.W101   ``BUS`` is "celery" and the default database is SQLite (one writer at a
#            time: workers wait on each other's locks; fine for a demo only).
# aaa.E101   ``BUS`` is "celery" and Celery (or redis-py) is not installed.
# aaa.E102   ``BUS`` is "celery" and no Celery broker is configured.
# aaa.E103   ``BUS`` is "celery" and there is no Redis for coordination
#            (``REDIS_URL`` unset and the broker is not Redis).
# aaa.E104   A cluster setting has the wrong type or value.
# aaa.E105   ``WORKER_SETUP`` cannot be imported.
# =========  =====================================================================


_POSITIVE = ("RUN_LOCK_TTL", "LEASE_TTL", "STALL_AFTER", "RUN_LEASE_TTL")
#: what ``UNCERTAIN`` may say (``aaa_django.tools.handler``)
_UNCERTAIN = ("reconcile", "fail")


@register()
def check_cluster_settings(app_configs: Sequence[AppConfig] | None = None, **kwargs: object) -> list[Error]:
    """Types and values of the cluster keys (whatever the bus)."""
    site = site_aaa()
    if not isinstance(site, dict):
        return []  # aaa.E001 says so
    errors: list[Error] = []
    url = site.get("REDIS_URL")
    if url is not None and not isinstance(url, str):
        errors.append(Error(f"AAA['REDIS_URL'] must be a str or None, not {type(url).__name__}.", id="aaa.E104"))
    if "CELERY_QUEUES" in site:
        errors += _check_queues(site["CELERY_QUEUES"])
    for key in _POSITIVE:
        value = site.get(key)
        if key in site and (isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0):
            errors.append(Error(f"AAA[{key!r}] must be a number of seconds > 0, not {value!r}.", id="aaa.E104"))
    if "WORKER_IN_FLIGHT" in site:
        value = site["WORKER_IN_FLIGHT"]
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            errors.append(Error(f"AAA['WORKER_IN_FLIGHT'] must be an int >= 1, not {value!r}.", id="aaa.E104"))
    if "WORKER_DRAIN_SECONDS" in site:
        value = site["WORKER_DRAIN_SECONDS"]
        if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0:
            errors.append(
                Error(f"AAA['WORKER_DRAIN_SECONDS'] must be a number of seconds >= 0, not {value!r}.", id="aaa.E104")
            )
    every = site.get("DUTY_EVERY")
    if "DUTY_EVERY" in site and (isinstance(every, bool) or not isinstance(every, (int, float)) or every < 0):
        errors.append(
            Error(
                f"AAA['DUTY_EVERY'] must be a number of seconds >= 0, not {every!r}.",
                hint="0 turns the workers' periodic duty off.",
                id="aaa.E104",
            )
        )
    alias = site.get("DUTY_DATABASE")
    if "DUTY_DATABASE" in site and alias not in settings.DATABASES:
        errors.append(
            Error(
                f"AAA['DUTY_DATABASE'] = {alias!r} is not a database alias.",
                hint="One of: " + ", ".join(settings.DATABASES) + ".",
                id="aaa.E104",
            )
        )
    if "ADOPT" in site and not isinstance(site["ADOPT"], bool):
        errors.append(Error(f"AAA['ADOPT'] must be True or False, not {site['ADOPT']!r}.", id="aaa.E104"))
    if "UNCERTAIN" in site and site["UNCERTAIN"] not in _UNCERTAIN:
        errors.append(
            Error(
                f"AAA['UNCERTAIN'] is {site['UNCERTAIN']!r}.",
                hint="One of: " + ", ".join(repr(u) for u in _UNCERTAIN) + ".",
                id="aaa.E104",
            )
        )
    if "CELERY_FAST_PUBLISH" in site and not isinstance(site["CELERY_FAST_PUBLISH"], bool):
        errors.append(
            Error(
                f"AAA['CELERY_FAST_PUBLISH'] must be True or False, not {site['CELERY_FAST_PUBLISH']!r}.", id="aaa.E104"
            )
        )
    setup = site.get("WORKER_SETUP")
    if setup is not None:
        if not isinstance(setup, str):
            errors.append(Error("AAA['WORKER_SETUP'] must be a dotted path (a str) or None.", id="aaa.E104"))
        else:
            try:
                if not callable(import_string(setup)):
                    raise ImportError(f"{setup} is not callable")
            except ImportError as exc:
                errors.append(
                    Error(
                        f"AAA['WORKER_SETUP'] = {setup!r} cannot be imported: {exc}",
                        hint="A callable setup(engine) that attaches the site's handlers.",
                        id="aaa.E105",
                    )
                )
    return errors


def _check_queues(value: object) -> list[Error]:
    kinds = ("algorithms", "llm", "tools")
    if not isinstance(value, dict):
        return [
            Error(
                "AAA['CELERY_QUEUES'] must be a dict: kind of work -> queue name.",
                hint="Kinds: " + ", ".join(kinds) + ".",
                id="aaa.E104",
            )
        ]
    errors = []
    for kind, name in value.items():
        if kind not in kinds:
            errors.append(
                Error(
                    f"AAA['CELERY_QUEUES'] has an unknown kind {kind!r}.",
                    hint="Kinds: " + ", ".join(kinds) + ".",
                    id="aaa.E104",
                )
            )
        elif not isinstance(name, str) or not name:
            errors.append(Error(f"AAA['CELERY_QUEUES'][{kind!r}] must be a queue name.", id="aaa.E104"))
    return errors


@register()
def check_celery_bus(app_configs: Sequence[AppConfig] | None = None, **kwargs: object) -> list[Error | Warning]:
    """With ``BUS = "celery"``: Celery installed, a broker, Redis, not SQLite."""
    site = site_aaa()
    if not isinstance(site, dict) or site.get("BUS") != "celery":
        return []
    out: list[Error | Warning] = []
    try:
        import celery  # noqa: F401
        import redis  # noqa: F401
    except ImportError as exc:
        return [
            Error(
                f"AAA['BUS'] is 'celery' but {exc.name} is not installed.",
                hint="pip install 'aaa_django[celery]'",
                id="aaa.E101",
            )
        ]
    default = settings.DATABASES.get("default", {})
    if "sqlite" in default.get("ENGINE", ""):
        out.append(
            Warning(
                "AAA['BUS'] is 'celery' on SQLite: one writer at a time, so workers wait on "
                "each other ('database is locked').",
                hint="Use PostgreSQL for a cluster; SQLite is fine for a demo.",
                id="aaa.W101",
            )
        )
    broker = broker_url()
    if not broker:
        out.append(
            Error(
                "AAA['BUS'] is 'celery' but no Celery broker is configured.",
                hint="Set CELERY_BROKER_URL (e.g. redis://127.0.0.1:6379/0) and load your Celery "
                "app in your project's __init__.py.",
                id="aaa.E102",
            )
        )
    if not redis_url():
        out.append(
            Error(
                "AAA['BUS'] is 'celery' but there is no Redis for the run locks, tool pools and cancel notices.",
                hint="Set AAA['REDIS_URL'] (or use a redis:// Celery broker).",
                id="aaa.E103",
            )
        )
    return out


@register("database")
def check_sqlite_transaction_mode(
    app_configs: Sequence[AppConfig] | None = None, databases: Sequence[str] | None = None, **kwargs: object
) -> list[Warning]:
    """SQLite appenders need ``transaction_mode: IMMEDIATE``.

    In SQLite's default deferred mode a transaction that has read cannot take the write
    lock later: concurrent appenders (threads, the dev server, workers) fail with
    "database is locked" instead of waiting their turn.
    """
    warnings = []
    for alias, db in settings.DATABASES.items():
        if db.get("ENGINE") != "django.db.backends.sqlite3":
            continue
        if str(db.get("OPTIONS", {}).get("transaction_mode", "")).upper() != "IMMEDIATE":
            warnings.append(
                Warning(
                    f"database {alias!r} is SQLite without transaction_mode IMMEDIATE: "
                    "concurrent appends to the event log may fail with 'database is locked'.",
                    hint=f'Set DATABASES[{alias!r}]["OPTIONS"]["transaction_mode"] = "IMMEDIATE".',
                    id="aaa.W001",
                )
            )
    return warnings


# --- retention (aaa_django.site.retention) ---------------------------------------------------
#
# =========  =====================================================================
# Id         Problem
# =========  =====================================================================
# aaa.E030   ``RETENTION`` is not a dict of outcome -> days (a number > 0, or None).
# aaa.E031   ``RETENTION`` names an outcome that does not exist.
# aaa.E032   ``RETENTION_BATCH`` is not an int >= 1, or ``ORPHAN_GRACE`` not a number
#            of seconds >= 0.
# =========  =====================================================================


@register()
def check_retention_settings(app_configs: Sequence[AppConfig] | None = None, **kwargs: object) -> list[Error]:
    """``RETENTION``, ``RETENTION_BATCH`` and ``ORPHAN_GRACE``."""
    site = site_aaa()
    if not isinstance(site, dict):
        return []  # aaa.E001 says so
    errors: list[Error] = []
    keys = (*OUTCOMES, "*")
    policy = site.get("RETENTION", {})
    if not isinstance(policy, dict):
        errors.append(
            Error(
                f"AAA['RETENTION'] must be a dict, not {type(policy).__name__}.",
                hint='e.g. {"success": 30, "failed": 90, "*": 365} (days).',
                id="aaa.E030",
            )
        )
        policy = {}
    for outcome, days in policy.items():
        if outcome not in keys:
            errors.append(
                Error(
                    f"AAA['RETENTION'] names an unknown outcome {outcome!r}.",
                    hint="Outcomes: " + ", ".join(keys) + ".",
                    id="aaa.E031",
                )
            )
        elif days is not None and (isinstance(days, bool) or not isinstance(days, (int, float)) or days <= 0):
            errors.append(
                Error(
                    f"AAA['RETENTION'][{outcome!r}] must be a number of days > 0 or None (keep), not {days!r}.",
                    id="aaa.E030",
                )
            )
    batch = site.get("RETENTION_BATCH", 1)
    if isinstance(batch, bool) or not isinstance(batch, int) or batch < 1:
        errors.append(Error(f"AAA['RETENTION_BATCH'] must be an int >= 1, not {batch!r}.", id="aaa.E032"))
    grace = site.get("ORPHAN_GRACE", 0)
    if isinstance(grace, bool) or not isinstance(grace, (int, float)) or grace < 0:
        errors.append(Error(f"AAA['ORPHAN_GRACE'] must be a number of seconds >= 0, not {grace!r}.", id="aaa.E032"))
    return errors
