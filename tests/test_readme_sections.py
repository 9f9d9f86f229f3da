"""README sections that must run as written: their first ``python`` block is run as a
script from the repository's root, in a process of its own, as a reader would."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def first_python_block(heading: str) -> str:
    text = (ROOT / "README.md").read_text()
    section = text.split(f"\n## {heading}\n", 1)[1].split("\n## ", 1)[0]
    return re.search(r"```python\n(.*?)```", section, re.S).group(1)


@pytest.mark.parametrize("heading, prints", [
    ("Add an MCP server", "{'text': '2 + 40 = {\"result\": 42}'}"),
    ("Bring your Pydantic AI agent", "{'output': {'city': 'Lyon', 'celsius': 18}}\n"
     "['aaa.llm.requested', 'aaa.llm.completed', 'aaa.tool.requested', 'aaa.tool.completed', "
     "'aaa.llm.requested', 'aaa.llm.completed']\n"),
    ("Watching runs", '"logger": "mysite.tools", "message": "greeting Ada", "run_id": "run-'),
])
def test_the_section_runs_as_written(heading, prints, tmp_path):
    script = tmp_path / "section.py"
    script.write_text(first_python_block(heading))
    done = subprocess.run([sys.executable, str(script)], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert prints in done.stdout


@pytest.mark.django_db(databases="__all__", transaction=True)
def test_the_event_log_example_runs_as_written_on_the_sites_store(db_alias):
    """The "Event log & projections" block (top-level awaits: async code's), in a
    coroutine, on each database (the block names "default", the suite's SQLite; the
    PostgreSQL alias in its place): its store is the site's, and the fold reads back
    what it appended."""
    import asyncio
    import textwrap

    from aaa_django.store.postgres import PgEventStore
    from aaa_django.store.sqlite import SqliteEventStore

    block = first_python_block("Event log & projections")
    assert 'site_store("default")' in block
    block = block.replace('site_store("default")', f"site_store({db_alias!r})")
    scope: dict = {}
    exec(f"async def example():\n{textwrap.indent(block, '    ')}\n    return store, state", scope)
    store, state = asyncio.run(scope["example"]())
    assert type(store) is (PgEventStore if db_alias == "postgres" else SqliteEventStore)
    assert state == {"events": 1}
