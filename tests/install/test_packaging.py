"""The source distribution carries what the package points its users to: ``docs/``
(system-check hints and docstrings name its pages) besides the code, templates and
static files."""

from __future__ import annotations

import re
import tarfile
from pathlib import Path

import pytest

from .checkout import copy_checkout
from .uvenv import run_uv

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_the_sdist_has_the_docs_the_package_points_to(tmp_path):
    # built as a package index's user builds it: in an isolated environment holding what
    # pyproject.toml's build-system requires (no setuptools needed where the test runs)
    copy_checkout(tmp_path / "checkout")
    run_uv("build", "--sdist", "--out-dir", tmp_path / "dist", tmp_path / "checkout")
    (sdist,) = (tmp_path / "dist").glob("*.tar.gz")
    with tarfile.open(sdist) as tar:
        names = {n.split("/", 1)[1] for n in tar.getnames() if "/" in n}
    pointed = {m for p in (ROOT / "aaa_django").rglob("*.py") for m in re.findall(r"docs/[\w.-]+\.md", p.read_text())}
    assert pointed, "the package names no docs page: this test checks nothing"
    docs = {f"docs/{p.name}" for p in (ROOT / "docs").glob("*.md")}
    assert pointed <= docs
    assert docs <= names, sorted(docs - names)
    assert {"README.md", "aaa_django/templates/aaa/admin/run.html", "aaa_django/static/aaa/live.js"} <= names


@pytest.mark.parametrize("page", ["README.md", "docs/install.md"])
def test_the_install_instructions_name_every_extra_a_site_installs(page):
    """The ``pip install aaa_django`` line of the README and of the install how-to names
    each optional dependency a site may ask for (``test`` is the suite's own), and
    their table of extras has a row for each."""
    import tomllib

    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    wanted = [name for name in extras if name != "test"]
    text = (ROOT / page).read_text()
    line = next(ln for ln in text.splitlines() if ln.startswith("pip install aaa_django "))
    assert [name for name in wanted if f"[{name}]" not in line] == []
    rows = [ln.split(" | ")[0] for ln in text.splitlines() if ln.startswith("| `")]
    assert [name for name in wanted if not any(f"`{name}`" in row for row in rows)] == []


def test_the_classifiers_and_the_django_range_are_the_legs_of_the_matrix():
    """pyproject.toml claims the Django and Python versions noxfile.py's legs test, and
    its Django range admits each tested Django and nothing newer."""
    import tomllib

    from packaging.requirements import Requirement

    from noxfile import LEGS

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    classifiers = project["classifiers"]
    djangos = {c.rsplit(" :: ", 1)[1] for c in classifiers if c.startswith("Framework :: Django :: ")}
    pythons = {
        c.rsplit(" :: ", 1)[1] for c in classifiers if re.fullmatch(r"Programming Language :: Python :: 3\.\d+", c)
    }
    assert djangos == {django for _, django in LEGS.values()}
    assert pythons == {python for python, _ in LEGS.values()}
    (django,) = [r for r in map(Requirement, project["dependencies"]) if r.name.lower() == "django"]
    newest = max(djangos, key=lambda v: tuple(map(int, v.split("."))))
    major, minor = map(int, newest.split("."))
    assert all(django.specifier.contains(f"{v}.0") for v in djangos)
    assert not django.specifier.contains(f"{major}.{minor + 1}.0")
    assert project["requires-python"] == f">={min(pythons, key=lambda v: tuple(map(int, v.split('.'))))}"


def test_the_docs_say_what_each_leg_is():
    """docs/development.md's table of the legs and docs/install.md's supported versions
    are noxfile.py's legs."""
    from noxfile import LEGS

    from ..docs.pages import section

    rows = [
        line.split(" | ")
        for line in section("docs/development.md", "The matrix").splitlines()
        if line.startswith("| `django")
    ]
    assert {row[0].strip("| `"): (row[2], row[1]) for row in rows} == LEGS
    table = section("docs/install.md", "Supported versions").splitlines()
    header = next(line for line in table if line.startswith("| Django |"))
    pythons = [cell.removeprefix("Python ") for cell in header.strip("| ").split(" | ")[1:]]
    tested = {
        (python, line.split(" | ")[0].strip("| ").split()[0])
        for line in table
        if line.startswith("| ") and not line.startswith(("| Django", "| ---"))
        for python, cell in zip(pythons, line.strip("| ").split(" | ")[1:])
        if cell == "tested"
    }
    assert tested == set(LEGS.values())
