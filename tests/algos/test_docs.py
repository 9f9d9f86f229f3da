"""docs/algorithms.md: every algorithm has a section, and every example runs and prints
what the page says it prints."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from aaa_django.runtime import registry

ROOT = Path(__file__).resolve().parents[2]
DOC = (ROOT / "docs" / "algorithms.md").read_text(encoding="utf-8")

FENCES = re.findall(r"^```(\w*)\n(.*?)^```\n", DOC, re.S | re.M)  # (language, body) in order
EXAMPLES = [
    (code, out)
    for (lang, code), (next_lang, out) in zip(FENCES, FENCES[1:])
    if lang == "python" and next_lang == "text" and "asyncio.run(main())" in code
]


def test_every_built_in_algorithm_is_documented():
    for name in registry.names():
        if name.startswith("aaa.algos."):
            assert f"`{name}`" in DOC, name
    for projection in ("REFINE", "PLAN", "WF", "FSM_STATE", "SAMPLES"):
        assert f"### {projection}" in DOC


def test_six_examples():
    assert len(EXAMPLES) == 6


@pytest.mark.parametrize(
    "code, expected", EXAMPLES, ids=[re.search(r"from aaa_django.algos import (\w+)", c).group(1) for c, _ in EXAMPLES]
)
def test_example_prints_what_the_page_says(code, expected):
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout == expected
