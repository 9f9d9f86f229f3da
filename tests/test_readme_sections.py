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
