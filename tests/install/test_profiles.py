"""Each install profile in a fresh virtualenv, as a site installs it: the built wheel
alone (``base``), with each extra alone, and with all of them.

For each: ``django.setup()`` on a small site whose settings use the extra, the system
checks (``manage.py check``) pass, every module of the package the extra enables
imports, and the extra does its job (a run on the site's database, a blob in S3, the
Celery bus, a model client, an agent's run, an MCP server's tools, a contract suite).
The base install imports none of the optional packages. And the other way round: on
the base install, a setting that needs a missing extra is a system-check error whose
hint is the ``pip install`` to run, not a traceback.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path
from typing import Any, Callable

import pytest

from .checkout import ROOT
from .sites import ENABLES, EXTRAS, NEEDS, OPTIONAL, USES, settings_for, write_site

pytestmark = [pytest.mark.slow, pytest.mark.install]

PROBE = Path(__file__).with_name("probe.py")

#: the package each extra installs that its profile's uses must have imported
USED: dict[str, str] = {
    "postgres": "psycopg",
    "celery": "celery",
    "s3": "boto3",
    "openai": "openai",
    "anthropic": "anthropic",
    "pydantic-ai": "pydantic_ai",
    "mcp": "mcp",
    "otel": "opentelemetry",
    "testing": "pytest",
}


def package_modules() -> list[str]:
    """Every module of the package (its files, as the wheel ships them)."""
    package = ROOT / "aaa_django"
    names = []
    for path in sorted(package.rglob("*.py")):
        parts = path.relative_to(ROOT).with_suffix("").parts
        names.append(".".join(parts[:-1] if parts[-1] == "__init__" else parts))
    return names


def base_modules() -> list[str]:
    needs = {m for mods in NEEDS.values() for m in mods}
    return [m for m in package_modules() if m not in needs]


def site_env(site: Path) -> dict[str, str]:
    """The site's environment: this one without the test suite's Django settings and
    Python paths."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DJANGO_", "PYTHON")) and k != "VIRTUAL_ENV"}
    return {**env, "DJANGO_SETTINGS_MODULE": "site_settings", "PYTHONPATH": str(site)}


def probe(python: Path, site: Path, modules: list[str], uses: tuple[str, ...]) -> dict[str, Any]:
    """Run tests/install/probe.py in the virtualenv, on the site; what it found."""
    shutil.copy(PROBE, site / "probe.py")
    config = {"modules": modules, "uses": list(uses), "optional": list(OPTIONAL)}
    (site / "probe.json").write_text(json.dumps(config))
    done = subprocess.run(
        [str(python), "probe.py", "probe.json", "result.json"],
        cwd=site,
        env=site_env(site),
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    result = json.loads((site / "result.json").read_text())
    # the installed wheel answered, not the checkout
    assert str(python.parent.parent) in result["package"], result["package"]
    return result


def services_for(profile: str, request: pytest.FixtureRequest) -> dict[str, Any]:
    services: dict[str, Any] = {}
    if profile in ("postgres", "all"):
        services["postgres"] = request.getfixturevalue("pg_database")
    if profile in ("s3", "all"):
        services["s3"] = request.getfixturevalue("s3_bucket")
    return services


def expect_use(use: str, found: dict[str, Any], profile: str) -> None:
    """What each use of tests/install/probe.py must have done."""
    assert "error" not in found, found.get("error")
    if use == "demo":
        assert "Outcome: success" in found["output"], found["output"]
    elif use == "migrate":
        assert found == {"vendor": "postgresql", "events": 0}
    elif use == "llm_client":
        provider = "pydantic-ai" if profile == "all" else profile
        assert (
            found["client"]
            == {"openai": "OpenAICompatibleClient", "anthropic": "AnthropicClient", "pydantic-ai": "PydanticAIClient"}[
                provider
            ]
        )
    elif use == "provider_clients":
        assert found["clients"] == ["OpenAICompatibleClient", "AnthropicClient"]
    elif use == "celery_bus":
        assert found["bus"] == "DistributedBus"
        assert "aaa.deliver" in found["tasks"], found["tasks"]
    elif use == "blobs":
        assert found == {"storage": "S3Storage", "read": "an install profile's blob"}
    elif use == "agent_run":
        assert found["agent"] == "Agent" and found["outcome"] == "success", found
        assert {"aaa.llm.requested", "aaa.tool.requested", "aaa.tool.completed"} <= set(found["types"])
    elif use == "mcp_tools":
        assert found["tools"] == ["install_add"]
    elif use == "contract_suite":
        assert found["returncode"] == 0 and " passed" in found["output"], found["output"]
    else:
        raise AssertionError(f"no expectation for the use {use!r}")


@pytest.mark.parametrize("profile", ["base", *EXTRAS, "all"])
def test_a_site_on_each_install_profile_checks_imports_and_uses_its_extras(
    profile: str, venv: Callable[[str], Path], tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    python = venv(profile)
    extras = EXTRAS if profile == "all" else () if profile == "base" else (profile,)
    site = write_site(tmp_path / "site", settings_for(extras, python=python, services=services_for(profile, request)))
    if profile == "base":
        modules = base_modules()
    elif profile == "all":
        modules = package_modules()
    else:
        modules = list(ENABLES[profile])

    found = probe(python, site, modules, USES[profile])

    assert found["check"]["passed"], found["check"]["output"]
    assert "ERRORS" not in found["check"]["output"]
    assert {m: tb for m, tb in found["imports"].items() if tb} == {}
    assert sorted(found["imports"]) == sorted(modules)
    for use in USES[profile]:
        expect_use(use, found["uses"][use], profile)
    if profile == "base":
        assert found["optional"] == []
    for extra in extras:
        assert USED[extra] in found["optional"], f"the {extra} profile never used {USED[extra]}"


def test_the_embedded_default_imports_no_extra_even_with_every_extra_installed(
    venv: Callable[[str], Path], tmp_path: Path
) -> None:
    """The base site on the install with every extra: setting up, checking, importing
    the base modules and a run import no optional package but Celery's (the Celery
    adapter registers its bus where Celery is installed: ``AaaConfig.ready``)."""
    site = write_site(tmp_path / "site", settings_for((), python=venv("all"), services={}))
    found = probe(venv("all"), site, base_modules(), USES["base"])
    assert found["check"]["passed"], found["check"]["output"]
    expect_use("demo", found["uses"]["demo"], "base")
    assert set(found["optional"]) <= {"celery", "kombu", "redis"}, found["optional"]


def test_the_modules_that_need_an_extra_are_the_ones_it_enables() -> None:
    assert set(NEEDS) <= set(EXTRAS) and set(ENABLES) == set(EXTRAS) == set(USED)
    for extra, modules in NEEDS.items():
        assert set(modules) <= set(ENABLES[extra]), extra
    assert {m for mods in ENABLES.values() for m in mods} <= set(package_modules())
    import tomllib

    declared = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    assert set(EXTRAS) == set(declared) - {"test"}


# --- a setting that needs a missing extra, on the base install --------------------------

MISSING = [
    ("celery", [("aaa.E101", "pip install 'aaa_django[celery]'")]),
    ("s3", [("aaa.E007", "pip install 'aaa_django[s3]'")]),
    ("openai", [("aaa.E060", "pip install 'aaa_django[openai]'")]),
    ("anthropic", [("aaa.E060", "pip install 'aaa_django[anthropic]'")]),
    (
        "pydantic-ai",
        [("aaa.E060", "pip install 'aaa_django[pydantic-ai]'"), ("aaa.E020", "pip install 'aaa_django[pydantic-ai]'")],
    ),
    ("mcp", [("aaa.E040", "pip install 'aaa_django[mcp]'")]),
    ("otel", [("aaa.E050", "pip install 'aaa_django[otel]'")]),
]

_S3_OPTIONS = {
    "bucket_name": "blobs",
    "endpoint_url": "http://127.0.0.1:9",
    "access_key": "k",
    "secret_key": "s",
    "region_name": "us-east-1",
}


def manage_check(python: Path, site: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(python), "-m", "django", "check"],
        cwd=site,
        env=site_env(site),
        capture_output=True,
        text=True,
        timeout=300,
    )


@pytest.mark.parametrize("extra, errors", MISSING, ids=[m[0] for m in MISSING])
def test_a_setting_that_needs_a_missing_extra_is_a_check_error_naming_the_install(
    extra: str, errors: list[tuple[str, str]], venv: Callable[[str], Path], tmp_path: Path
) -> None:
    python = venv("base")
    site = write_site(tmp_path / "site", settings_for((extra,), python=python, services={"s3": _S3_OPTIONS}))

    done = manage_check(python, site)

    said = done.stdout + done.stderr
    assert done.returncode == 1, said
    assert "SystemCheckError" in said and "Traceback" not in said, said
    for check_id, hint in errors:
        (line,) = [n for n, text in enumerate(said.splitlines()) if f"({check_id})" in text]
        assert said.splitlines()[line + 1].strip().startswith(f"HINT: {hint}"), said


def test_a_postgresql_database_without_psycopg_stops_at_djangos_own_error(
    venv: Callable[[str], Path], tmp_path: Path
) -> None:
    """Django loads the database backend while it sets up (``django.contrib.auth``'s
    models), before any system check runs: what the site sees is Django's own
    ``ImproperlyConfigured``, which names psycopg (docs/install.md says so)."""
    python = venv("base")
    database = {"ENGINE": "django.db.backends.postgresql", "NAME": "aaa", "HOST": "127.0.0.1"}
    site = write_site(tmp_path / "site", settings_for(("postgres",), python=python, services={"postgres": database}))

    done = manage_check(python, site)

    assert done.returncode == 1
    assert done.stderr.rstrip().splitlines()[-1] == (
        "django.core.exceptions.ImproperlyConfigured: Error loading psycopg2 or psycopg module"
    )
