"""Settings for the test suite (pytest-django). Independent of the example site.

Databases:
  default   SQLite in a file (threads and the test database share it), in
            $AAA_TEST_TMPDIR when bin/test set it, else a temporary directory
            removed at exit.
  postgres  PostgreSQL, only when AAA_TEST_PG_PORT is set (bin/test starts one):
            AAA_TEST_PG_HOST (default 127.0.0.1), AAA_TEST_PG_PORT, user postgres,
            no password, database aaa. pytest-django creates test_aaa (test_aaa_gwN
            under xdist) from it.
Use conftest's `db_alias` / `pg_alias` fixtures rather than reading these.
"""

import atexit
import os
import shutil
import tempfile
from pathlib import Path

import django

if os.environ.get("AAA_TEST_TMPDIR"):
    TMP_DIR = Path(os.environ["AAA_TEST_TMPDIR"])
    TMP_DIR.mkdir(parents=True, exist_ok=True)
else:
    TMP_DIR = Path(tempfile.mkdtemp(prefix="aaa-tests-"))
    atexit.register(shutil.rmtree, TMP_DIR, ignore_errors=True)

SECRET_KEY = "tests-only-not-secret"
DEBUG = False
ALLOWED_HOSTS = ["testserver", "localhost", "127.0.0.1"]

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",  # the admin's CSS and JS in browser tests (live_server)
    "ninja",  # Swagger UI's JS and CSS served locally (no CDN: there is no network)
    "aaa_django",
]

MIDDLEWARE = [
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
]

ROOT_URLCONF = "tests.urls"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
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

DATABASES = {
    "default": {
        "ENGINE": "django.db.backends.sqlite3",
        "NAME": TMP_DIR / "aaa.sqlite3",
        "TEST": {"NAME": str(TMP_DIR / "test_aaa.sqlite3")},
        # A deferred transaction that has read cannot take the write lock later
        # ("database is locked" at once): appenders must take it up front.
        "OPTIONS": {"transaction_mode": "IMMEDIATE", "timeout": 20},
    }
}

if os.environ.get("AAA_TEST_PG_PORT"):
    DATABASES["postgres"] = {
        "ENGINE": "django.db.backends.postgresql",
        "HOST": os.environ.get("AAA_TEST_PG_HOST", "127.0.0.1"),
        "PORT": os.environ["AAA_TEST_PG_PORT"],
        "USER": "postgres",
        "PASSWORD": "",
        "NAME": "aaa",
        # Created on its own: a run of PostgreSQL tests alone must not need "default".
        "TEST": {"DEPENDENCIES": []},
    }

STORAGES = {
    "default": {
        "BACKEND": "django.core.files.storage.FileSystemStorage",
        "OPTIONS": {"location": str(TMP_DIR / "media")},
    },
    "staticfiles": {"BACKEND": "django.contrib.staticfiles.storage.StaticFilesStorage"},
}

# Fast hashing: the suite creates users.
PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]

# No engine host started by a test's web request adopts runs in the background of other
# tests: a test that wants it says so (tests/site/test_recovery.py, the field tests' site).
AAA: dict = {"ADOPT": False}

USE_TZ = True
TIME_ZONE = "UTC"
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
STATIC_URL = "static/"

if django.VERSION >= (6, 1):
    # Django 6.1 configures email with MAILERS (sending mail without it is deprecated);
    # the test runner makes every mailer the in-memory one (``mail.outbox``).
    MAILERS = {"default": {"BACKEND": "django.core.mail.backends.locmem.EmailBackend"}}
