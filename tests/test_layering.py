"""The core imports no Django, Celery or other adapter library (DESIGN.md, "Layers").

Checked twice: by import-linter's contract in pyproject.toml, and by reading every core
module's imports with `ast` here, so the rule holds even if the contract is misconfigured.
"""

import ast
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "aaa_django"
CORE = ("events", "data", "runtime", "llm", "tools", "validate", "algos")
FORBIDDEN = ("django", "celery", "ninja", "boto3", "botocore", "redis", "storages", "kombu", "psycopg")


def test_import_linter_contract_is_kept():
    lint_imports = Path(sys.executable).parent / "lint-imports"
    result = subprocess.run(
        [str(lint_imports), "--no-cache"], cwd=ROOT, capture_output=True, text=True, timeout=300
    )
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
