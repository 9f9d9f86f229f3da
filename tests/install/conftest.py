"""Fixtures of the install tests: the wheel, built once per test process from a clean
copy of the checkout, and fresh virtualenvs with it installed, one per profile (uv,
from the package indexes pip uses; the Django of the running leg, so each leg of the
matrix installs its own)."""

from __future__ import annotations

import importlib.metadata
import os
import sys
import uuid
from pathlib import Path
from typing import Callable

import pytest

from ..conftest import require_service
from .checkout import copy_checkout
from .uvenv import pip_constraints, run_uv


@pytest.fixture(scope="session")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The package's wheel, built from a clean copy of the checkout."""
    work = tmp_path_factory.mktemp("wheel")
    source = copy_checkout(work / "checkout")
    run_uv("build", "--wheel", "--out-dir", work / "dist", source)
    (built,) = (work / "dist").glob("aaa_django-*.whl")
    return built


@pytest.fixture(scope="session")
def constraints(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """pip's constraint files, and this leg's Django."""
    path = tmp_path_factory.mktemp("constraints") / "constraints.txt"
    lines = [Path(c).read_text() for c in pip_constraints() if Path(c).is_file()]
    lines.append(f"Django=={importlib.metadata.version('django')}\n")
    path.write_text("\n".join(lines))
    return path


@pytest.fixture(scope="session")
def venv(tmp_path_factory: pytest.TempPathFactory, wheel: Path, constraints: Path) -> Callable[[str], Path]:
    """``venv(profile)``: the Python of a fresh virtualenv holding the wheel with the
    profile's extras (``"base"``: none; ``"all"``: every one), made once per process."""
    made: dict[str, Path] = {}
    root = tmp_path_factory.mktemp("venvs")

    def make(profile: str) -> Path:
        if profile not in made:
            from .sites import EXTRAS

            extras = {"base": "", "all": f"[{','.join(EXTRAS)}]"}.get(profile, f"[{profile}]")
            where = root / profile
            run_uv("venv", "--python", sys.executable, where)
            run_uv(
                "pip", "install", "--python", where / "bin" / "python", "--constraint", constraints, f"{wheel}{extras}"
            )
            made[profile] = where / "bin" / "python"
        return made[profile]

    return make


@pytest.fixture
def pg_database():
    """A new, empty PostgreSQL database on the server bin/test started: its settings."""
    port = os.environ.get("AAA_TEST_PG_PORT", "")
    require_service("postgres", bool(port))
    import psycopg

    host = os.environ.get("AAA_TEST_PG_HOST", "127.0.0.1")
    name = f"install_{uuid.uuid4().hex[:12]}"
    server = {"host": host, "port": port, "user": "postgres", "dbname": "aaa", "autocommit": True}
    with psycopg.connect(**server) as admin:
        admin.execute(f'CREATE DATABASE "{name}"')
    yield {
        "ENGINE": "django.db.backends.postgresql",
        "HOST": host,
        "PORT": port,
        "USER": "postgres",
        "PASSWORD": "",
        "NAME": name,
    }
    with psycopg.connect(**server) as admin:
        admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
