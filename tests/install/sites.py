"""The install profiles: what each extra installs and enables, and the small Django site
each profile's test writes (settings that use the extra, the install how-to's
``urls.py``, and what the uses need: an agent, an MCP server, a contract test)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ..docs.pages import blocks, section

EXTRAS = ("postgres", "celery", "s3", "openai", "anthropic", "pydantic-ai", "mcp", "otel", "testing")

#: the optional packages (top-level modules) the extras install; the embedded default
#: imports none of them
OPTIONAL = (
    "celery",
    "kombu",
    "redis",
    "psycopg",
    "boto3",
    "botocore",
    "storages",
    "openai",
    "anthropic",
    "mcp",
    "opentelemetry",
    "pydantic_ai",
    "pytest",
)

#: the package's modules that import an extra's packages as they are imported; every
#: other module imports with the package alone
NEEDS: dict[str, tuple[str, ...]] = {
    "celery": (
        "aaa_django.celery.bus",
        "aaa_django.celery.delivering",
        "aaa_django.celery.duty",
        "aaa_django.celery.engines",
        "aaa_django.celery.publish",
        "aaa_django.celery.tasks",
        "aaa_django.celery.wiring",
        "aaa_django.celery.worker",
        "aaa_django.tasks",
    ),
    "pydantic-ai": ("aaa_django.algos._pydantic_replay", "aaa_django.llm.pydantic_ai_messages"),
    "otel": ("aaa_django.observe.otel",),
    "testing": ("aaa_django.testing", "aaa_django.testing.blobstore", "aaa_django.testing.eventstore"),
}

#: the modules each extra enables: those above, and those that import its packages
#: only when they are used (a store's connection, a client, a server)
ENABLES: dict[str, tuple[str, ...]] = {
    "postgres": (
        "aaa_django.store.postgres",
        "aaa_django.store.connections",
        "aaa_django.store.wakeups",
        "aaa_django.store.groupcommit",
    ),
    "celery": (
        *NEEDS["celery"],
        "aaa_django.celery",
        "aaa_django.celery.coordination",
        "aaa_django.celery.redrives",
        "aaa_django.celery.sweeper",
        "aaa_django.store.redis",
        "aaa_django.store.tokens",
    ),
    "s3": ("aaa_django.site.blobs",),
    "openai": ("aaa_django.llm.openai_client",),
    "anthropic": ("aaa_django.llm.anthropic_client",),
    "pydantic-ai": (*NEEDS["pydantic-ai"], "aaa_django.llm.pydantic_ai_client", "aaa_django.algos.pydantic_agent"),
    "mcp": ("aaa_django.tools.mcp", "aaa_django.site.mcp_settings"),
    "otel": ("aaa_django.observe", *NEEDS["otel"]),
    "testing": NEEDS["testing"],
}

#: what each profile's probe does with its extra (tests/install/probe.py)
USES: dict[str, tuple[str, ...]] = {
    "base": ("demo",),
    "postgres": ("demo",),
    "celery": ("celery_bus",),
    "s3": ("blobs",),
    "openai": ("llm_client",),
    "anthropic": ("llm_client",),
    "pydantic-ai": ("llm_client", "agent_run"),
    "mcp": ("mcp_tools",),
    "otel": ("demo",),
    "testing": ("contract_suite",),
    # every extra at once: a model provider is configured, so no demo (it would call it)
    "all": (
        "migrate",
        "celery_bus",
        "blobs",
        "llm_client",
        "provider_clients",
        "agent_run",
        "mcp_tools",
        "contract_suite",
    ),
}

_SETTINGS = """\
from pathlib import Path

HERE = Path(__file__).resolve().parent
SECRET_KEY = "install-profile"
DEBUG = False
ALLOWED_HOSTS = ["127.0.0.1", "localhost"]
INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "ninja",
    "aaa_django",
]
MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
]
ROOT_URLCONF = "urls"
TEMPLATES = [{
    "BACKEND": "django.template.backends.django.DjangoTemplates",
    "APP_DIRS": True,
    "OPTIONS": {"context_processors": [
        "django.template.context_processors.request",
        "django.contrib.auth.context_processors.auth",
        "django.contrib.messages.context_processors.messages",
    ]},
}]
DATABASES = {"default": {"ENGINE": "django.db.backends.sqlite3", "NAME": HERE / "db.sqlite3",
                         "OPTIONS": {"transaction_mode": "IMMEDIATE"}}}
CACHES = {"default": {"BACKEND": "django.core.cache.backends.filebased.FileBasedCache",
                      "LOCATION": HERE / "cache"}}
STORAGES = {
    "default": {"BACKEND": "django.core.files.storage.FileSystemStorage",
                "OPTIONS": {"location": HERE / "media"}},
    "staticfiles": {"BACKEND": "django.contrib.staticfiles.storage.StaticFilesStorage"},
}
USE_TZ = True
STATIC_URL = "static/"
AAA = {}
"""

_AGENT = '''\
from pydantic_ai import Agent

agent = Agent("test", name="install", instructions="Double a number.")


@agent.tool_plain
def double(number: int) -> int:
    """Twice the number."""
    return 2 * number
'''

_MCP_SERVER = '''\
from mcp.server.mcpserver import MCPServer

server = MCPServer("install", log_level="CRITICAL")


@server.tool()
def add(a: int, b: int) -> int:
    """Adds two numbers."""
    return a + b


if __name__ == "__main__":
    server.run("stdio")
'''

_CONTRACT = """\
from aaa_django.events import InMemoryEventStore
from aaa_django.testing.eventstore import EventStoreContract


class TestTheSitesStore(EventStoreContract):
    def make_store(self, request):
        return InMemoryEventStore()

    def same_log(self, store):
        return store
"""


def settings_for(extras: tuple[str, ...], *, python: Path, services: dict[str, Any]) -> str:
    """Settings that use each of ``extras`` (``services``: the ``postgres`` database,
    the ``s3`` bucket's options, the ``redis`` URL, where the profile has them)."""
    lines = [_SETTINGS]
    if "postgres" in extras:
        lines.append(f"DATABASES['default'] = {services['postgres']!r}")
    if "celery" in extras:
        lines.append("AAA['BUS'] = 'celery'")
        lines.append(f"CELERY_BROKER_URL = {services.get('redis', 'redis://127.0.0.1:6379/0')!r}")
    if "s3" in extras:
        backend = {"BACKEND": "storages.backends.s3.S3Storage", "OPTIONS": services["s3"]}
        lines.append(f"STORAGES['blobs'] = {backend!r}")
        lines.append("AAA['BLOB_STORAGE'] = 'blobs'")
    # one model provider: the last of the extras that is one
    llm = None
    for provider, model in (("openai", "gpt-4o-mini"), ("anthropic", "claude-haiku-4-5")):
        if provider in extras:
            llm = {"PROVIDER": provider, "MODEL": model, "API_KEY": "install-profile"}
    if "pydantic-ai" in extras:  # Pydantic AI's TestModel: no key, no provider SDK
        llm = {"PROVIDER": "pydantic-ai", "MODEL": "test"}
    if llm:
        lines.append(f"AAA['LLM'] = {llm!r}")
    if "pydantic-ai" in extras:
        lines.append("AAA['AGENTS'] = ['agents.agent']")
    if "mcp" in extras:
        server = {"command": str(python), "args": ["mcp_server.py"], "prefix": "install_"}
        lines.append(f"AAA['MCP_SERVERS'] = {{'install': {server!r}}}")
    if "otel" in extras:
        lines.append("AAA['OTEL'] = True")
    return "\n".join(lines) + "\n"


def write_site(directory: Path, settings: str) -> Path:
    """The site's files in ``directory``: ``site_settings.py``, the install how-to's
    ``urls.py`` as written, an agent, an MCP server and a contract test (used where the
    profile has their extra)."""
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "site_settings.py").write_text(settings)
    (urls,) = blocks(section("docs/install.md", "URLs: mount the REST API"), "python")
    (directory / "urls.py").write_text(urls)
    (directory / "agents.py").write_text(_AGENT)
    (directory / "mcp_server.py").write_text(_MCP_SERVER)
    (directory / "test_contract.py").write_text(_CONTRACT)
    return directory
