"""The site's MCP servers, from ``settings.AAA["MCP_SERVERS"]`` (Django layer).

    AAA = {
        "MCP_SERVERS": {
            "files": {"command": "python", "args": ["-m", "my_files_server"], "prefix": "files_"},
            "search": {"url": "http://search:8000/mcp", "timeout": 30, "pool": "search"},
        },
    }

Each entry names a server and gives the keywords of
:class:`~aaa_django.tools.mcp.MCPServer` (``command``/``args``/``env``/``cwd`` for a
stdio server this process starts, or ``url`` for streamable HTTP; ``prefix``,
``timeout``, ``tool_timeout``, ``pool``, ``requires_approval``, ``approval_expires``,
``side_effects``, ``idempotent``, ``only``). Every process that wires its engine from the
settings (the web process's host, each Celery worker) lists their tools when it starts
and adds them to its ToolHandler's registry (:func:`mcp_tools`), so a run's tool calls
can be served by any of them. System check ``aaa.E040``: a malformed entry, or the
``mcp`` package missing.
"""

from __future__ import annotations

import importlib.util
import inspect
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from django.apps import AppConfig
from django.core.checks import Error

from aaa_django.conf import site_aaa

if TYPE_CHECKING:
    from aaa_django.tools import SchemaTool
    from aaa_django.tools.mcp import MCPServer


def mcp_config() -> dict[str, dict[str, Any]]:
    raw = site_aaa().get("MCP_SERVERS") if isinstance(site_aaa(), dict) else None
    return dict(raw or {})


def mcp_servers() -> list[MCPServer]:
    """The configured servers (not connected yet)."""
    config = mcp_config()
    if not config:
        return []
    from aaa_django.tools.mcp import servers_from_settings

    return servers_from_settings(config)


def mcp_tools() -> list[SchemaTool]:
    """Every configured server's tools (each server is asked once, now)."""
    return [t for server in mcp_servers() for t in server.tools()]


def check_mcp_settings(app_configs: Sequence[AppConfig] | None = None, **kwargs: object) -> list[Error]:
    """System check ``aaa.E040``."""
    site = site_aaa()
    if not isinstance(site, dict) or site.get("MCP_SERVERS") in (None, {}):
        return []
    raw = site["MCP_SERVERS"]
    if not isinstance(raw, dict) or not all(isinstance(k, str) and isinstance(v, dict) for k, v in raw.items()):
        return [Error("AAA['MCP_SERVERS'] must be a dict {name: {keywords of MCPServer}}.", id="aaa.E040")]
    # aaa_django.tools.mcp imports the SDK only when a server connects: ask for it here
    if importlib.util.find_spec("mcp") is None:
        return [
            Error(
                "AAA['MCP_SERVERS'] is set, but the 'mcp' package is missing.",
                hint="pip install 'aaa_django[mcp]'",
                id="aaa.E040",
            )
        ]
    from aaa_django.tools.mcp import MCPServer

    known = set(inspect.signature(MCPServer).parameters) - {"name"}
    errors = []
    for name, entry in raw.items():
        unknown = sorted(set(entry) - known)
        if unknown:
            errors.append(
                Error(
                    f"AAA['MCP_SERVERS'][{name!r}] has unknown keys {unknown}.",
                    hint="Known: " + ", ".join(sorted(known)) + ".",
                    id="aaa.E040",
                )
            )
        elif ("command" in entry) == ("url" in entry):
            errors.append(
                Error(
                    f"AAA['MCP_SERVERS'][{name!r}] needs either 'command' (stdio) or 'url' (streamable HTTP).",
                    id="aaa.E040",
                )
            )
    return errors
