"""``AAA["MCP_SERVERS"]``: the same settings give every process the same tools."""

from __future__ import annotations

import pytest

from aaa_django.site.mcp_settings import check_mcp_settings, mcp_tools

from .conftest import stdio_config


def test_the_servers_in_settings_give_their_tools(settings):
    settings.AAA = {
        "MCP_SERVERS": {"calc": {**stdio_config(), "prefix": "calc_", "only": ["add", "shout"], "pool": "calc"}}
    }
    assert check_mcp_settings() == []
    tools = {t.name: t for t in mcp_tools()}
    assert set(tools) == {"calc_add", "calc_shout"}
    assert tools["calc_add"].pool == "calc"


def test_the_site_engine_gets_them_in_its_tool_handler(settings):
    from aaa_django.runtime import Engine
    from aaa_django.runtime.event_types import TOOL_REQUESTED
    from aaa_django.site.engines import attach_site_handlers

    settings.AAA = {"MCP_SERVERS": {"calc": {**stdio_config(), "only": ["add"]}}}
    engine = attach_site_handlers(Engine())
    [handler] = [h for h in engine.subscribers(TOOL_REQUESTED)]
    assert handler.registry.names() == ["add"]


@pytest.mark.parametrize(
    "servers, says",
    [
        ([], "must be a dict"),
        ({"calc": {"command": "x", "url": "http://y"}}, "needs either 'command'"),
        ({"calc": {"comand": "x"}}, "unknown keys ['comand']"),
    ],
)
def test_a_bad_entry_is_a_clear_error_at_start_up(settings, servers, says):
    settings.AAA = {"MCP_SERVERS": servers}
    [error] = check_mcp_settings()
    assert error.id == "aaa.E040" and says in error.msg
