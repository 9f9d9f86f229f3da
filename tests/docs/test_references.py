"""What the code and the docs point a reader to exists.

- Every ``docs/<page>.md`` (and ``#anchor``) the package, the example site, the
  project's config, commands and tests name, in a docstring, a comment or a system
  check's hint, is a page of the docs (with that heading).
- Every mention of a README in them names a file that exists, and a README section
  (``README's "Cluster mode"``) that the README has: the reference moved to ``docs/``
  and the README is a front door, so a pointer into it must say where.
- Every relative link of ``README.md`` and ``benchmarks/README.md`` resolves, anchors
  included (the docs pages' own links are checked by the strict build).
- Every repository path the README and the docs name in code spans
  (``aaa_django/store/faults.py``, ``tests/mcp/server.py``, ``benchmarks/...``) exists,
  and every dotted ``aaa_django.`` name in them is a module, or a name its module
  defines.
"""

from __future__ import annotations

import ast
import re
from functools import cache
from pathlib import Path

import pytest

from .pages import ROOT, anchors, headings

CODE = [
    p for d in ("aaa_django", "project") for p in (ROOT / d).rglob("*") if p.suffix in (".py", ".html", ".js", ".txt")
]
# where else a docs page is cited: the project's config, its commands, its tests
CITING = [
    *CODE,
    ROOT / "pyproject.toml",
    ROOT / "mkdocs.yml",
    *(ROOT / "bin").iterdir(),
    *(ROOT / "tests").rglob("*.py"),
]
DOCS = sorted((ROOT / "docs").glob("**/*.md"))
PROSE = [ROOT / "README.md", ROOT / "benchmarks" / "README.md", *DOCS]


def rel(p: Path) -> str:
    return p.relative_to(ROOT).as_posix()


def test_every_docs_page_the_code_names_exists_with_its_anchor():
    pointed = {
        (rel(p), m.group(1), m.group(2))
        for p in CITING
        if p.is_file()
        for m in re.finditer(r"\bdocs/([\w./-]+?\.md)(?:#([\w-]+))?", p.read_text(encoding="utf-8"))
    }
    assert pointed, "the code names no docs page: this test checks nothing"
    missing = [
        (src, page, anchor)
        for src, page, anchor in pointed
        if not (ROOT / "docs" / page).is_file() or (anchor and anchor not in anchors(Path("docs") / page))
    ]
    assert missing == []


def test_every_readme_the_code_names_exists_and_so_does_its_section():
    wrong = []
    readme_titles = {title for _, _, title in headings((ROOT / "README.md").read_text(encoding="utf-8"))}
    for p in CODE:
        text = p.read_text(encoding="utf-8")
        for m in re.finditer(
            r"(?:([\w./-]*)/)?README(?:\.md)?(?:'s)?(?:,? (?:section )?[\"'“]([^\"'”]+)[\"'”])?", text
        ):
            folder, title = m.group(1), m.group(2)
            if folder:  # a path: benchmarks/README.md
                if not (ROOT / folder / "README.md").is_file():
                    wrong.append((rel(p), m.group(0)))
            elif title is None or title not in readme_titles:
                wrong.append((rel(p), m.group(0)))
    assert wrong == [], "a README named without a section it has (the reference is in docs/)"


LINK = re.compile(r"\]\(([^)\s]+)\)")


@pytest.mark.parametrize("page", ["README.md", "benchmarks/README.md"])
def test_the_relative_links_of_a_readme_resolve(page):
    base = (ROOT / page).parent
    broken = []
    for target in LINK.findall((ROOT / page).read_text(encoding="utf-8")):
        if re.match(r"[a-z]+:", target):
            continue  # http(s), mailto
        path, _, anchor = target.partition("#")
        file = (base / path).resolve() if path else ROOT / page
        if not file.exists() or (anchor and file.suffix == ".md" and anchor not in anchors(file)):
            broken.append(target)
    assert broken == []


PATH = re.compile(r"`((?:aaa_django|tests|benchmarks|project|bin|examples|requirements|docs)/[\w./-]*)")
DOTTED = re.compile(r"`(aaa_django(?:\.\w+)+)")


@pytest.mark.parametrize("page", [rel(p) for p in PROSE])
def test_the_paths_a_page_names_exist(page):
    text = (ROOT / page).read_text(encoding="utf-8")
    named = {m.rstrip(".") for m in PATH.findall(text)}
    assert [p for p in sorted(named) if not (ROOT / p).exists()] == []


@cache
def _defined(module: Path) -> frozenset[str]:
    """Names a module binds at its top level (defs, classes, assignments, imports)."""
    tree = ast.parse(module.read_text(encoding="utf-8"))
    names: set[str] = set()
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names |= {n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name)}
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names |= {(a.asname or a.name).split(".")[0] for a in node.names}
        elif isinstance(node, (ast.If, ast.Try)):
            names |= {n.id for n in ast.walk(node) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)}
            names |= {
                a.asname or a.name
                for n in ast.walk(node)
                if isinstance(n, (ast.Import, ast.ImportFrom))
                for a in n.names
            }
    return frozenset(names)


def _resolves(dotted: str) -> bool:
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        base = ROOT.joinpath(*parts[:cut])
        module = base / "__init__.py" if base.is_dir() else base.with_suffix(".py")
        if module.is_file():
            rest = parts[cut:]
            # a name the module defines (its attributes past that are the class's business)
            return not rest or rest[0] in _defined(module) or (base.is_dir() and (base / rest[0]).exists())
    return False


@pytest.mark.parametrize("page", [rel(p) for p in PROSE])
def test_the_dotted_names_a_page_names_exist(page):
    text = (ROOT / page).read_text(encoding="utf-8")
    named = set(DOTTED.findall(text))
    assert [d for d in sorted(named) if not _resolves(d)] == []
