"""The layers of docs/architecture.md#layers hold: the core imports no Django, Celery or
other adapter library; arrows point down only; no module imports itself through others.

Checked by import-linter's contracts in pyproject.toml (the core's forbidden imports,
the layers, the independent siblings), by reading every core module's imports with
`ast` here (so the core's rule holds even if a contract is misconfigured), and by
finding import cycles in grimp's graph of the package (imports inside functions and
under TYPE_CHECKING included), which layers between packages do not see.
"""

import ast
import subprocess
import sys
from pathlib import Path

import grimp
import pytest

pytestmark = pytest.mark.static

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "aaa_django"
CORE = ("events", "data", "runtime", "llm", "tools", "validate", "algos")
FORBIDDEN = ("django", "celery", "ninja", "boto3", "botocore", "redis", "storages", "kombu", "psycopg")


def test_import_linter_contract_is_kept():
    lint_imports = Path(sys.executable).parent / "lint-imports"
    result = subprocess.run([str(lint_imports), "--no-cache"], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imported_modules(path: Path):
    """(line, absolute module name) for every import in the file, relative ones resolved."""
    tree = ast.parse(path.read_text(), filename=str(path))
    package = module_name(path)
    if path.name != "__init__.py":
        package = package.rpartition(".")[0]
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - (node.level - 1)]
                name = ".".join(base + ([node.module] if node.module else []))
            else:
                name = node.module or ""
            yield node.lineno, name
            for alias in node.names:  # `from aaa_django import conf` imports a module
                yield node.lineno, f"{name}.{alias.name}"


def is_forbidden(name: str) -> bool:
    top, _, rest = name.partition(".")
    if top in FORBIDDEN:
        return True
    if top == "aaa_django" and rest:
        # Within the app the core may import the core and the root's dunder names
        # (__version__); every other module of the app is the Django layer.
        first = rest.split(".")[0]
        return first not in CORE and not first.startswith("__")
    return False


def core_files() -> list[Path]:
    return sorted(f for p in CORE if (PACKAGE / p).is_dir() for f in (PACKAGE / p).rglob("*.py"))


def test_core_modules_import_no_adapter_library_nor_the_django_layer():
    files = core_files()
    assert files, "no core module found: is the layout still aaa_django/<core package>/?"
    violations = [
        f"{f.relative_to(ROOT)}:{line} imports {name}"
        for f in files
        for line, name in imported_modules(f)
        if is_forbidden(name)
    ]
    assert violations == []


def test_the_checker_sees_what_it_must_forbid():
    assert is_forbidden("django.db")
    assert is_forbidden("celery")
    assert is_forbidden("aaa_django.conf")
    assert is_forbidden("aaa_django.conf.aaa_settings")
    assert not is_forbidden("aaa_django.events.event")
    assert not is_forbidden("aaa_django.__version__")
    assert not is_forbidden("djangoish")
    assert not is_forbidden("json")


def import_cycles(graph) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    cycles: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph.find_modules_directly_imported_by(v):
            if w not in graph.modules:
                continue
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                cycles.append(sorted(component))

    for module in sorted(graph.modules):
        if module not in index:
            visit(module)
    return cycles


def test_no_module_imports_itself_through_others():
    sys.setrecursionlimit(max(sys.getrecursionlimit(), 10_000))
    assert import_cycles(grimp.build_graph("aaa_django")) == []


def test_the_cycle_finder_finds_a_cycle():
    graph = grimp.ImportGraph()
    for m in ("p", "p.a", "p.b", "p.c"):
        graph.add_module(m)
    graph.add_import(importer="p.a", imported="p.b")
    graph.add_import(importer="p.b", imported="p.a")
    graph.add_import(importer="p.c", imported="p.a")
    assert import_cycles(graph) == [["p.a", "p.b"]]


# -- capabilities are declared (a Protocol, detected once where the object is wired),
# never probed by name at each use --------------------------------------------------------


def is_protocol(node: ast.ClassDef) -> bool:
    return any(
        (isinstance(b, ast.Name) and b.id == "Protocol")
        or (isinstance(b, ast.Subscript) and isinstance(b.value, ast.Name) and b.value.id == "Protocol")
        for b in node.bases
    )


def protocol_methods(files: list[Path]) -> dict[str, str]:
    """Method name -> the Protocol of the package that declares it."""
    out: dict[str, str] = {}
    for f in files:
        for node in ast.walk(ast.parse(f.read_text(), filename=str(f))):
            if isinstance(node, ast.ClassDef) and is_protocol(node):
                for item in node.body:
                    if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)) and not item.name.startswith("__"):
                        out.setdefault(item.name, node.name)
    return out


def probes(files: list[Path], methods: dict[str, str], root: Path = ROOT) -> list[str]:
    """``getattr(x, "m")`` / ``hasattr(x, "m")`` of a method ``m`` a Protocol declares."""
    found = []
    for f in files:
        for node in ast.walk(ast.parse(f.read_text(), filename=str(f))):
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Name)
                and node.func.id in ("getattr", "hasattr")
                and len(node.args) >= 2
                and isinstance(node.args[1], ast.Constant)
                and node.args[1].value in methods
            ):
                name = node.args[1].value
                found.append(
                    f"{f.relative_to(root)}:{node.lineno} {node.func.id}(..., {name!r}): declared by {methods[name]}"
                )
    return found


def package_files() -> list[Path]:
    return sorted(f for f in PACKAGE.rglob("*.py") if "migrations" not in f.parts)


def test_capabilities_are_declared_not_probed():
    files = package_files()
    methods = protocol_methods(files)
    assert {"fresh", "observe", "unfinished", "watch_ends", "erase_many"} <= set(methods)
    assert probes(files, methods) == []


def test_the_probe_finder_finds_a_probe(tmp_path):
    module = tmp_path / "m.py"
    module.write_text(
        "from typing import Protocol\n"
        "class Fresh(Protocol):\n"
        "    def fresh(self, event_id: str) -> bool: ...\n"
        "def use(store):\n"
        "    return getattr(store, 'fresh', None)\n"
    )
    assert probes([module], protocol_methods([module]), root=tmp_path) == [
        "m.py:5 getattr(..., 'fresh'): declared by Fresh"
    ]
