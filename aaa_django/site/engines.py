"""Build the engine a Django site configured: its database, its blob storage.

The core :class:`~aaa_django.runtime.Engine` knows nothing of Django; this adapter
hands it the Django ORM store and, when ``AAA["BLOB_STORAGE"]`` names a ``STORAGES``
alias, a blob store over that storage (django-storages' S3 included).
"""

from __future__ import annotations

from typing import Any

from django.utils.module_loading import import_string

from aaa_django.algos.pydantic_agent import agent_tools
from aaa_django.conf import aaa_settings
from aaa_django.events import default_cache
from aaa_django.llm import LLMHandler, LLMRequest, LLMResponse
from aaa_django.llm.routes import AgentModels
from aaa_django.runtime import Engine
from aaa_django.store import wakeups
from aaa_django.store.postgres import site_store
from aaa_django.tools import ToolHandler, ToolRegistry

from .blobs import StorageBlobStore
from .buses import site_bus
from .llm_settings import agent_clients, client_from_settings
from .mcp_settings import mcp_tools
from .tokens import site_tokens


def build_engine(*, using: str = "default", **overrides: Any) -> Engine:
    """An :class:`~aaa_django.runtime.Engine` over the site's database and storage.

    The store is :func:`~aaa_django.store.postgres.site_store`'s: on PostgreSQL (psycopg 3)
    its calls are awaits on connections of its own, else Django's store. Its waits
    (``engine.wait``, ``run.result()``) are woken by the database's wake-ups
    (:func:`aaa_django.store.wakeups.for_database`): on PostgreSQL, any process's end of
    the run.

    ``overrides`` go to the Engine as they are (``bus=...``, ``blobs=...``, ...). The
    bus is the one ``AAA["BUS"]`` names unless given (:func:`~aaa_django.site.buses.site_bus`:
    with ``"celery"``, the Celery adapter's ``DistributedBus``). The engine sends the signals of
    :mod:`aaa_django.signals`, and with ``AAA["OTEL"]`` OpenTelemetry spans and metrics
    (:mod:`aaa_django.observe.otel`).
    Use it as ``async with build_engine() as engine:``.
    """
    conf = aaa_settings()
    default_cache.check_every = conf["FOLD_CHECK_EVERY"]
    options: dict[str, Any] = {
        "store": site_store(using),
        "blobs": site_blobs(),
        "claim_threshold": conf["CLAIM_THRESHOLD"],
        "max_abandoned": conf["MAX_ABANDONED_ATTEMPTS"],
        # its waits share the process's hub for the database with the event streams
        "wakeups": wakeups.for_database(using),
    }
    if "bus" not in overrides and (bus := site_bus(conf["BUS"])) is not None:
        # the cluster: deliveries are Celery tasks (the bus its adapter registered)
        options["bus"] = bus
    options.update(overrides)
    engine = Engine(**options)
    from aaa_django.signals import SignalSender  # the run's signals, after commit

    engine.observe(SignalSender(engine, using))
    if conf["OTEL"]:  # OpenTelemetry (the otel extra): imported only when asked for
        from aaa_django.observe.otel import OtelObserver
        from aaa_django.runtime.observe import CarriesTrace

        otel = OtelObserver(engine)
        engine.observe(otel)
        if isinstance(engine.bus, CarriesTrace):
            engine.bus.carry(otel)
    return engine


def site_blobs() -> StorageBlobStore | None:
    """The site's blob store: a :class:`~aaa_django.site.blobs.StorageBlobStore` over
    ``AAA["BLOB_STORAGE"]``, or None when the site keeps no blobs (the engine's, the
    read side's, exports' and imports')."""
    alias = aaa_settings()["BLOB_STORAGE"]
    return StorageBlobStore(alias=alias) if alias else None


class NoModelClient:
    """The LLM client of a site that configured none: every request fails, clearly."""

    async def complete(self, request: LLMRequest) -> LLMResponse:
        raise RuntimeError(
            "no model client is configured for this process: set AAA['LLM'] (a provider) "
            "or AAA['LLM_CLIENT'] (the dotted path of a factory returning an LLM client)"
        )


def attach_site_handlers(engine: Engine) -> Engine:
    """Attach the handlers the settings name: the web process's host and every Celery
    worker wire their engines the same way.

    - model: ``AAA["LLM_CLIENT"]`` (a factory), else ``AAA["LLM"]`` (a provider),
      else, unless ``WORKER_SETUP`` attaches one, a client that fails clearly; the
      ``AAA["AGENTS"]`` that have a model of their own are answered by it
      (:class:`~aaa_django.llm.routes.AgentModels`); with ``AAA["STREAM_TOKENS"]`` the
      replies stream to the site's live tokens;
    - tools: ``AAA["TOOLS"]`` (dotted paths of @tool functions), the tools of the
      ``AAA["MCP_SERVERS"]`` (listed now, from each server) and those of the
      ``AAA["AGENTS"]`` (Pydantic AI agents, loaded now: their runs may be started),
      an uncertain side-effecting call handled as ``AAA["UNCERTAIN"]`` says;
    - ``AAA["WORKER_SETUP"]``: ``setup(engine)`` for anything else.
    """
    conf = aaa_settings()
    setup = conf.get("WORKER_SETUP")
    deltas = site_tokens()
    client = site_client()
    if client is not None or not setup:
        agents = agent_clients((path, import_string(path)) for path in conf.get("AGENTS") or ())
        client = client if client is not None else NoModelClient()
        LLMHandler(AgentModels(client, agents) if agents else client, deltas=deltas).attach(engine)
    tools = site_tools()
    if tools:
        ToolHandler(ToolRegistry(tools), uncertain=conf["UNCERTAIN"]).attach(engine)
    if setup:
        import_string(setup)(engine)
    return engine


def site_client() -> Any:
    """The site's model client: ``AAA["LLM_CLIENT"]``'s (a factory), else the provider of
    ``AAA["LLM"]``; None when it configures neither."""
    factory = aaa_settings().get("LLM_CLIENT")
    return import_string(factory)() if factory else client_from_settings()


def site_tools() -> list[Any]:
    """The tools the settings give the site's engines: ``AAA["TOOLS"]`` (dotted paths of
    @tool functions), the tools of the ``AAA["MCP_SERVERS"]`` (listed now, from each
    server) and those of the ``AAA["AGENTS"]`` (Pydantic AI agents)."""
    conf = aaa_settings()
    tools = [import_string(p) for p in conf.get("TOOLS") or ()]
    if conf.get("MCP_SERVERS"):
        tools += mcp_tools()
    if conf.get("AGENTS"):
        tools += [t for path in conf["AGENTS"] for t in agent_tools(import_string(path))]
    return tools


def load_agents() -> list[object]:
    """Import the ``AAA["AGENTS"]`` (at start-up, ``AaaConfig.ready``): a run's config
    names only agents the process has loaded, and the REST API or the admin may start
    one before any engine is wired. An entry that does not import is left to system
    check ``aaa.E020``."""
    paths = aaa_settings().get("AGENTS")
    loaded = []
    for path in paths if isinstance(paths, (list, tuple)) else ():
        try:
            loaded.append(import_string(path))
        except ImportError:
            continue
    return loaded
