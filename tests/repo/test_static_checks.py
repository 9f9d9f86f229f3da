"""The linter and the type checker find nothing in aaa_django/ (the linter nothing in
benchmarks/ either), and the code is formatted (their configuration, and what each
checks, is in pyproject.toml: ``[tool.ruff]`` and ``[tool.mypy]``)."""

import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.static

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
#: what ``ruff format`` keeps formatted (its options: ``[tool.ruff]``)
FORMATTED = ["aaa_django", "benchmarks", "tests", "project", "noxfile.py", "manage.py"]


def check(*command: str) -> None:
    result = subprocess.run(
        [str(BIN / command[0]), *command[1:]], cwd=ROOT, capture_output=True, text=True, timeout=600
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_ruff_finds_nothing():
    check("ruff", "check", "--no-cache", "aaa_django", "benchmarks")


def test_the_code_is_formatted():
    check("ruff", "format", "--check", "--no-cache", *FORMATTED)


def test_mypy_finds_nothing():
    check("mypy")  # files and options: [tool.mypy]
