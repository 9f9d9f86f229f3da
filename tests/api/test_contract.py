"""The REST API's contract: every operation has a stable id and a tag; the schema is
versioned and checked into the package (``aaa_django/api/openapi.json``); the schema a
site serves is that file; and the file never changes under a version it had before (its
git history says which schemas each version named).

A client generated from the file drives every endpoint on the example site as deployed:
``tests/api/test_client.py``.
"""

from __future__ import annotations

import json
import re
import subprocess
from io import StringIO
from pathlib import Path

import pytest
from django.core.management import CommandError, call_command
from django.test import Client

from aaa_django.api import VERSION, contract, openapi

from ..conftest import require_service

ROOT = Path(__file__).resolve().parents[2]
FILE = openapi.FILE.relative_to(ROOT).as_posix()

#: the operations of the contract (a generated client's function names)
OPERATIONS = {
    "start_run",
    "list_runs",
    "get_run",
    "get_runs",
    "watch_runs",
    "cancel_run",
    "erase_run",
    "list_events",
    "stream_events",
    "get_projection",
    "list_approvals",
    "decide_approval",
    "export_run",
    "import_run",
    "fork_run",
    "send_message",
    "list_messages",
    "close_conversation",
    "list_questions",
    "answer_question",
}


def operations(doc: dict) -> list[dict]:
    return [op for item in doc["paths"].values() for op in item.values()]


def test_every_operation_has_a_stable_snake_case_id_and_one_tag():
    ops = operations(openapi.schema())
    ids = [op["operationId"] for op in ops]
    assert sorted(ids) == sorted(OPERATIONS)  # each once, none named after its module
    assert all(re.fullmatch(r"[a-z]+(_[a-z]+)*", i) for i in ids), ids
    assert all(len(op["tags"]) == 1 and op["tags"][0] in contract.TAGS for op in ops), ops
    assert {op["tags"][0] for op in ops} == set(contract.TAGS)


def test_the_checked_in_file_is_the_routers_schema_as_the_command_writes_it(tmp_path):
    assert openapi.checked_in() == openapi.schema(), "run: python manage.py aaa_openapi"
    assert openapi.checked_in()["info"]["version"] == VERSION
    out = tmp_path / "openapi.json"
    call_command("aaa_openapi", "--output", str(out), stdout=StringIO())
    assert out.read_text() == openapi.FILE.read_text()  # byte for byte
    call_command("aaa_openapi", "--check", stdout=StringIO())
    out.write_text(out.read_text().replace('"start_run"', '"begin_run"'))
    with pytest.raises(CommandError, match="not the router's schema"):
        call_command("aaa_openapi", "--check", "--output", str(out), stdout=StringIO())


def test_the_schema_a_site_serves_is_the_checked_in_file():
    r = Client().get("/api/aaa/openapi.json")  # the test site mounts the router at /api/aaa/
    assert r.status_code == 200
    served = openapi.served_part(r.json(), "/api/aaa")
    assert served == openapi.served_part(openapi.checked_in(), "")
    assert served["version"] == VERSION and len(operations(served)) == len(OPERATIONS)


# -- the version moves with the schema ------------------------------------------------------------


def semver(version: str) -> tuple[int, ...]:
    return tuple(int(p) for p in version.split("."))


def unversioned(current: dict, history: list[tuple[str, dict]]) -> list[str]:
    """What is wrong with ``current`` given the schemas the file held before (newest first,
    each with its commit): a schema under a version an earlier, different schema had, or
    a version lower than an earlier one."""
    problems = []
    version = current["info"]["version"]
    for commit, old in history:
        was = old["info"]["version"]
        if was == version and old != current:
            problems.append(
                f"the schema changed since {commit[:12]} under the same version {version}: "
                "raise aaa_django.api.contract.VERSION"
            )
        elif semver(version) < semver(was):
            problems.append(f"version {version} is lower than {was} of {commit[:12]}")
    return problems


def git(*args: str) -> str:
    return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, check=True, timeout=60).stdout


def file_history() -> list[tuple[str, dict]]:
    """Every committed version of the file, newest first (none when git cannot say)."""
    try:
        git("rev-parse", "--git-dir")
    except (OSError, subprocess.CalledProcessError):
        require_service("git history", False)
    history = []
    for commit in git("log", "--format=%H", "--", FILE).split():
        try:
            history.append((commit, json.loads(git("show", f"{commit}:{FILE}"))))
        except (subprocess.CalledProcessError, ValueError):
            continue  # removed or not JSON at that commit (a conflict): names no schema
    return history


def test_the_checked_in_schema_changed_only_with_its_version():
    assert unversioned(openapi.checked_in(), file_history()) == []


def test_a_schema_changed_under_its_version_is_caught():
    v1 = {"info": {"version": "2.0.0"}, "paths": {"/runs": {}}}
    changed = {"info": {"version": "2.0.0"}, "paths": {"/runs": {}, "/more": {}}}
    bumped = {"info": {"version": "2.1.0"}, "paths": {"/runs": {}, "/more": {}}}
    assert unversioned(v1, [("a" * 40, v1)]) == []
    [problem] = unversioned(changed, [("a" * 40, v1)])
    assert "same version 2.0.0" in problem
    assert unversioned(bumped, [("a" * 40, v1)]) == []
    [lower] = unversioned({"info": {"version": "1.9.0"}, "paths": {}}, [("a" * 40, v1)])
    assert "lower" in lower
