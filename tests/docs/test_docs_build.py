"""The documentation site builds with ``mkdocs build --strict``: a broken link, a
missing anchor, a page left out of the nav is a warning, and a warning fails the
build. The same build of a copy with one broken anchor and one page outside the nav
fails (so the strictness itself is tested)."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from .pages import ROOT


def build(root: Path, site: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "mkdocs",
            "build",
            "--strict",
            "--config-file",
            str(root / "mkdocs.yml"),
            "--site-dir",
            str(site),
        ],
        cwd=root,
        capture_output=True,
        text=True,
        timeout=300,
    )


@pytest.mark.slow
def test_the_docs_build_strict_without_a_warning(tmp_path):
    done = build(ROOT, tmp_path / "site")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "WARNING" not in done.stdout + done.stderr
    pages = {p.relative_to(ROOT / "docs").with_suffix("").as_posix() for p in (ROOT / "docs").rglob("*.md")}
    built = {p.parent.relative_to(tmp_path / "site").as_posix() for p in (tmp_path / "site").rglob("index.html")}
    assert {p for p in pages if p != "index"} <= built


@pytest.mark.slow
def test_a_broken_anchor_or_a_page_outside_the_nav_fails_the_build(tmp_path):
    copy = tmp_path / "copy"
    shutil.copytree(ROOT / "docs", copy / "docs")
    shutil.copy(ROOT / "mkdocs.yml", copy / "mkdocs.yml")
    with open(copy / "docs" / "index.md", "a", encoding="utf-8") as f:
        f.write("\n[nowhere](api.md#no-such-heading)\n")
    (copy / "docs" / "stray.md").write_text("# Not in the nav\n", encoding="utf-8")
    done = build(copy, tmp_path / "site")
    out = done.stdout + done.stderr
    assert done.returncode != 0
    assert "no-such-heading" in out and "stray.md" in out
