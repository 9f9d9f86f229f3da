"""The source distribution carries what the package points its users to: ``docs/``
(system-check hints and docstrings name its pages) besides the code, templates and
static files."""

from __future__ import annotations

import re
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.slow
def test_the_sdist_has_the_docs_the_package_points_to(tmp_path):
    build = subprocess.run(
        [sys.executable, "-c", "import sys; from setuptools import build_meta as b;"
         "print(b.build_sdist(sys.argv[1]))", str(tmp_path)],
        cwd=ROOT, capture_output=True, text=True, timeout=300,
    )
    assert build.returncode == 0, build.stderr
    (sdist,) = tmp_path.glob("*.tar.gz")
    with tarfile.open(sdist) as tar:
        names = {n.split("/", 1)[1] for n in tar.getnames() if "/" in n}
    pointed = {m for p in (ROOT / "aaa_django").rglob("*.py")
               for m in re.findall(r"docs/[\w.-]+\.md", p.read_text())}
    assert pointed, "the package names no docs page: this test checks nothing"
    docs = {f"docs/{p.name}" for p in (ROOT / "docs").glob("*.md")}
    assert pointed <= docs
    assert docs <= names, sorted(docs - names)
    assert {"README.md", "aaa_django/templates/aaa/admin/run.html",
            "aaa_django/static/aaa/live.js"} <= names


def test_the_readme_names_every_extra_a_site_installs():
    """The README's ``pip install`` line names each optional dependency a site may ask
    for (``test`` is the suite's own)."""
    import tomllib

    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    line = next(ln for ln in (ROOT / "README.md").read_text().splitlines()
                if ln.startswith("pip install aaa_django "))
    assert [name for name in extras if name != "test" and f"[{name}]" not in line] == []
