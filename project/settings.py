"""Settings of the example site.

The embedded default needs nothing: SQLite at var/db.sqlite3, the in-process bus and
blobs on disk under var/blobs. Environment variables switch on the cluster parts:

  AAA_DEBUG            "1"/"0" (default 1: this is a demo site)
  AAA_SECRET_KEY       the secret key (default: a development-only key)
  AAA_ALLOWED_HOSTS    comma-separated (default: localhost,127.0.0.1,[::1])
  AAA_DB               "sqlite" (default) or "postgres"
  AAA_SQLITE_PATH      the SQLite file (default var/db.sqlite3)
  AAA_PG_HOST, AAA_PG_PORT, AAA_PG_NAME, AAA_PG_USER, AAA_PG_PASSWORD
                       PostgreSQL when AAA_DB=postgres (defaults 127.0.0.1, 5432,
                       aaa, postgres, empty)
  AAA_BUS              "inprocess" (default) or "celery"
  AAA_LLM_BASE_URL, AAA_LLM_API_KEY, AAA_LLM_MODEL, AAA_LLM_PROVIDER, AAA_LLM_TIMEOUT
                       a real model provider (AAA["LLM"]; its TIMEOUT: seconds an HTTP
                       attempt may take, default 60); unset: the scripted model
  AAA_LLM_CLIENT       dotted path of the API engine's LLM client factory (default: the
                       scripted demo models, project/chat/model.py and project/api_demo.py)
  AAA_STREAM_TOKENS    "1": live tokens (AAA["STREAM_TOKENS"]) of a provider that streams
  AAA_REDIS_URL        Celery broker and result backend, and the cache (e.g.
                       redis://127.0.0.1:6379/0)
  AAA_STALL_AFTER, AAA_LEASE_TTL, AAA_RUN_LEASE_TTL
                       AAA["STALL_AFTER"], AAA["LEASE_TTL"], AAA["RUN_LEASE_TTL"]
  AAA_EXTRA_TOOLS      more tools (dotted paths of @tool functions, comma-separated)
  AAA_S3_BUCKET        blobs in S3 (django-storages) when set, with AAA_S3_ENDPOINT,
                       AAA_S3_ACCESS_KEY, AAA_S3_SECRET_KEY, AAA_S3_REGION
  AAA_GC_THRESHOLD     the garbage collector's thresholds in the site's web and worker
                       processes (default 10000,10,10; "python": Python's own;
                       project/collector.py)
"""

import os
from pathlib import Path

from project.collector import threshold as collector_threshold

BASE_DIR = Path(__file__).resolve().parent.parent
VAR_DIR = BASE_DIR / "var"


def env(name: str, default: str = "") -> str:
    return os.environ.get(name, default)


def env_flag(name: str, default: bool) -> bool:
    value = os.environ.get(name)
    if value is None:
        return default
    return value.strip().lower() in ("1", "true", "yes", "on")


# DEVELOPMENT-ONLY default key: set AAA_SECRET_KEY anywhere the site is reachable.
SECRET_KEY = env("AAA_SECRET_KEY", "dev-only-insecure-key-do-not-deploy-aaa-django")
DEBUG = env_flag("AAA_DEBUG", True)
ALLOWED_HOSTS = [h for h in env("AAA_ALLOWED_HOSTS", "localhost,127.0.0.1,[::1]").split(",") if h]

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "ninja",  # the API docs' static files (Swagger UI), served locally
    "aaa_django",
    "project",
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
]

ROOT_URLCONF = "project.urls"
WSGI_APPLICATION = "project.wsgi.application"
ASGI_APPLICATION = "project.asgi.application"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [BASE_DIR / "templates"],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ],
        },
    },
]

if env("AAA_DB", "sqlite") == "postgres":
    DATABASES = {
        "default": {
            "ENGINE": "django.db.backends.postgresql",
            "HOST": env("AAA_PG_HOST", "127.0.0.1"),
            "PORT": env("AAA_PG_PORT", "5432"),
            "NAME": env("AAA_PG_NAME", "aaa"),
            "USER": env("AAA_PG_USER", "postgres"),
            "PASSWORD": env("AAA_PG_PASSWORD"),
            # A connection kept for a minute by each server thread (checked before a
            # request reuses it): not opened (a PostgreSQL backend started) per request.
            "CONN_MAX_AGE": int(env("AAA_PG_CONN_MAX_AGE", "60")),
            "CONN_HEALTH_CHECKS": True,
        }
    }
else:
    VAR_DIR.mkdir(exist_ok=True)
    DATABASES = {
        "default": {
            "ENGINE": "django.db.backends.sqlite3",
            "NAME": env("AAA_SQLITE_PATH") or VAR_DIR / "db.sqlite3",
            # WAL lets the web process read while a run appends.
            "OPTIONS": {"init_command": "PRAGMA journal_mode=WAL;", "transaction_mode": "IMMEDIATE"},
        }
    }

if env("AAA_S3_BUCKET"):
    BLOB_STORAGE = {
        "BACKEND": "storages.backends.s3.S3Storage",
        "OPTIONS": {
            "bucket_name": env("AAA_S3_BUCKET"),
            "endpoint_url": env("AAA_S3_ENDPOINT") or None,
            "access_key": env("AAA_S3_ACCESS_KEY") or None,
            "secret_key": env("AAA_S3_SECRET_KEY") or None,
            "region_name": env("AAA_S3_REGION") or None,
        },
    }
else:
    BLOB_STORAGE = {
        "BACKEND": "django.core.files.storage.FileSystemStorage",
        "OPTIONS": {"location": VAR_DIR / "blobs"},
    }

STORAGES = {
    "default": {"BACKEND": "django.core.files.storage.FileSystemStorage"},
    "staticfiles": {"BACKEND": "django.contrib.staticfiles.storage.StaticFilesStorage"},
    "aaa_blobs": BLOB_STORAGE,
}

AAA = {
    "BUS": env("AAA_BUS", "inprocess"),
    "BLOB_STORAGE": "aaa_blobs",
    # The REST API's engine (aaa_django.site.host): SCRIPTED models, no provider is called
    # (project/api_demo.py; the chat page's, project/chat/model.py). Point AAA_LLM_CLIENT
    # at a real client factory to change it.
    "LLM_CLIENT": env("AAA_LLM_CLIENT", "project.chat.model.demo_model"),
    "TOOLS": [
        "project.api_demo.lookup_population",
        "project.api_demo.publish_answer",
        "project.chat.model.choose_city",
    ],
    # A real model provider when the environment names one (docs/models.md): then the
    # demo command and the API's engine use it instead of the scripted model.
    "LLM": {
        "PROVIDER": env("AAA_LLM_PROVIDER", "openai"),
        "BASE_URL": env("AAA_LLM_BASE_URL") or None,
        "API_KEY": env("AAA_LLM_API_KEY") or None,
        "MODEL": env("AAA_LLM_MODEL") or None,
        "TIMEOUT": float(env("AAA_LLM_TIMEOUT") or 60),
    }
    if env("AAA_LLM_BASE_URL") or env("AAA_LLM_API_KEY")
    else None,
}
if env_flag("AAA_STREAM_TOKENS", False):  # a provider's replies as they are written
    AAA["STREAM_TOKENS"] = True
if env("AAA_STALL_AFTER"):  # the cluster's sweeper: seconds before a run counts as stalled
    AAA["STALL_AFTER"] = float(env("AAA_STALL_AFTER"))
if env("AAA_LEASE_TTL"):  # seconds a tool pool's, a busy mark's or a model or guarded call's lease lives
    AAA["LEASE_TTL"] = float(env("AAA_LEASE_TTL"))
if env("AAA_RUN_LEASE_TTL"):  # seconds a process's lease on a run it drives lives unless renewed
    AAA["RUN_LEASE_TTL"] = float(env("AAA_RUN_LEASE_TTL"))
if env("AAA_EXTRA_TOOLS"):  # more @tool functions (dotted paths, comma-separated), e.g. a test's
    AAA["TOOLS"] = [*AAA["TOOLS"], *env("AAA_EXTRA_TOOLS").split(",")]

# The API's rate limits count in the default cache: shared between processes when
# there is a Redis (else each process counts alone: system check aaa.W020 outside DEBUG).
if env("AAA_REDIS_URL"):
    CACHES = {"default": {"BACKEND": "django.core.cache.backends.redis.RedisCache", "LOCATION": env("AAA_REDIS_URL")}}

# The garbage collector of the site's web and worker processes, which carry many runs
# at once (project/collector.py sets it; read here too, so that a wrong value stops
# every command with its reason).
collector_threshold(env("AAA_GC_THRESHOLD"))

# Celery (used when AAA_BUS=celery): `celery -A project worker`.
CELERY_BROKER_URL = env("AAA_REDIS_URL", "memory://")
CELERY_RESULT_BACKEND = env("AAA_REDIS_URL") or None
CELERY_TASK_IGNORE_RESULT = True
# Cluster mode (docs/cluster.md): `celery -A project worker`, no -Q and no beat
# (the workers fire due deadlines and sweep stalled runs themselves). One message at a
# time per worker process; a message a worker took and did not acknowledge goes to
# another after 10 minutes (above the demo's longest model or tool call: no message
# waits for a deadline), as do the messages of a worker killed whole.
CELERY_WORKER_PREFETCH_MULTIPLIER = 1
CELERY_BROKER_TRANSPORT_OPTIONS = {"visibility_timeout": 600}

AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.UserAttributeSimilarityValidator"},
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
    {"NAME": "django.contrib.auth.password_validation.CommonPasswordValidator"},
    {"NAME": "django.contrib.auth.password_validation.NumericPasswordValidator"},
]

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = True
USE_TZ = True

STATIC_URL = "static/"
STATICFILES_DIRS = [BASE_DIR / "static"]
STATIC_ROOT = VAR_DIR / "static"
MEDIA_ROOT = VAR_DIR / "media"

DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "handlers": {"console": {"class": "logging.StreamHandler"}},
    "loggers": {"aaa_django": {"handlers": ["console"], "level": env("AAA_LOG_LEVEL", "INFO")}},
}
