"""Sections of the README and the docs that must run as written: their first ``python``
block is run as a script from the repository's root, in a process of its own, as a
reader would (``tests/docs/pages.py`` finds a section by its heading, so the tests
follow the text where it moves)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from .pages import blocks, section

ROOT = Path(__file__).resolve().parents[2]


def first_python_block(page: str, heading: str) -> str:
    return blocks(section(page, heading), "python")[0]


FIRST_RUN_PRINTS = "success {'text': 'Lyon has 522250 inhabitants.'}\n"


@pytest.mark.parametrize(
    "page, heading, prints",
    [
        ("docs/mcp.md", "Add an MCP server", "{'text': '2 + 40 = {\"result\": 42}'}"),
        (
            "docs/agents.md",
            "A complete example",
            "{'output': {'city': 'Lyon', 'celsius': 18}}\n"
            "['aaa.llm.requested', 'aaa.llm.attempted', 'aaa.llm.completed', 'aaa.tool.requested', "
            "'aaa.tool.completed', 'aaa.llm.requested', 'aaa.llm.attempted', 'aaa.llm.completed']\n",
        ),
        (
            "docs/observe.md",
            "Logs with context",
            '"logger": "mysite.tools", "message": "greeting Ada", "run_id": "run-',
        ),
        ("README.md", "A first run", FIRST_RUN_PRINTS + "1 aaa.run.started\n"),
    ],
)
def test_the_section_runs_as_written(page, heading, prints, tmp_path):
    script = tmp_path / "section.py"
    script.write_text(first_python_block(page, heading))
    done = subprocess.run([sys.executable, str(script)], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert prints in done.stdout


def test_the_tutorials_first_run_prints_what_the_tutorial_says(tmp_path):
    """The tutorial shows the whole output of its script: it is that, line for line."""
    text = section("docs/tutorial.md", "3. A first run of your own, in Python")
    (code,) = blocks(text, "python")
    (expected,) = blocks(text, "text")
    assert expected.startswith(FIRST_RUN_PRINTS)
    script = tmp_path / "first_run.py"
    script.write_text(code)
    done = subprocess.run([sys.executable, str(script)], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout == expected


@pytest.mark.django_db(databases="__all__", transaction=True)
def test_the_event_log_example_runs_as_written_on_the_sites_store(db_alias):
    """The event log's example (``docs/eventlog.md``, "In short"; top-level awaits:
    async code's), in a coroutine, on each database (the block names "default", the
    suite's SQLite; the PostgreSQL alias in its place): its store is the site's, and
    the fold reads back what it appended."""
    import asyncio
    import textwrap

    from aaa_django.store.postgres import PgEventStore
    from aaa_django.store.sqlite import SqliteEventStore

    block = first_python_block("docs/eventlog.md", "In short")
    assert 'site_store("default")' in block
    block = block.replace('site_store("default")', f"site_store({db_alias!r})")
    scope: dict = {}
    exec(f"async def example():\n{textwrap.indent(block, '    ')}\n    return store, state", scope)
    store, state = asyncio.run(scope["example"]())
    assert type(store) is (PgEventStore if db_alias == "postgres" else SqliteEventStore)
    assert state == {"events": 1}
