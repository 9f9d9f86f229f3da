"""Fresh virtualenvs made with uv, from the package indexes pip is configured with.

uv reads none of pip's configuration, so :func:`uv_environment` carries it over: the
index (``index-url``), the extra indexes, ``find-links`` and the CA bundle, from ``pip
config list`` (pip's configuration files and ``PIP_*`` variables), with pip's way of
choosing among indexes (the best version from any of them); :func:`pip_constraints`
gives its constraint files, for ``uv pip install -c``. Used by the install-profile
tests and by ``noxfile.py`` (the matrix's legs).
"""

from __future__ import annotations

import functools
import os
import shlex
import subprocess
import sys
from pathlib import Path

# pip's option -> (uv's variable, how uv separates several values)
_OPTIONS = {
    "index-url": ("UV_DEFAULT_INDEX", None),
    "extra-index-url": ("UV_INDEX", " "),
    "find-links": ("UV_FIND_LINKS", ","),
    "cert": ("SSL_CERT_FILE", None),
}


def pip_options(listing: str) -> dict[str, str]:
    """pip's effective options from the output of ``pip config list``: an environment
    variable (``:env:.``) wins over the files' ``install.`` section, which wins over
    ``global.``."""
    found: dict[str, dict[str, str]] = {}
    for line in listing.splitlines():
        key, sep, value = line.partition("=")
        if not sep or "." not in key:
            continue
        section, _, option = key.rpartition(".")
        found.setdefault(option, {})[section] = value.strip().strip("'\"")
    return {
        option: next(by[s] for s in (":env:", "install", "global") if s in by)
        for option, by in found.items()
        if any(s in by for s in (":env:", "install", "global"))
    }


@functools.cache
def _pip_config() -> dict[str, str]:
    listing = subprocess.run(
        [sys.executable, "-m", "pip", "config", "list"],
        capture_output=True,
        text=True,
        check=False,
    ).stdout
    return pip_options(listing)


def uv_environment() -> dict[str, str]:
    """The ``UV_*`` variables that make uv see the packages pip sees."""
    env = {"UV_INDEX_STRATEGY": "unsafe-best-match"}  # pip: the best version of any index
    for option, value in _pip_config().items():
        if option not in _OPTIONS or not value:
            continue
        name, separator = _OPTIONS[option]
        values = shlex.split(value)
        env[name] = separator.join(values) if separator else values[0]
    return env


def pip_constraints() -> list[str]:
    """The constraint files pip applies to every install (its ``constraint`` option)."""
    return shlex.split(_pip_config().get("constraint", ""))


def uv() -> str:
    """The uv executable installed beside this Python (requirements/test.txt pins it)."""
    from uv import find_uv_bin

    return find_uv_bin()


def run_uv(*args: str | Path, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    """``uv ARGS`` with pip's indexes; raises with uv's output when it fails."""
    env = {**os.environ, **uv_environment()}
    env.pop("VIRTUAL_ENV", None)  # uv would take the test's own venv for the target
    done = subprocess.run([uv(), *map(str, args)], env=env, capture_output=True, text=True, timeout=timeout)
    if done.returncode != 0:
        raise RuntimeError(f"uv {' '.join(map(str, args))} failed:\n{done.stdout}\n{done.stderr}")
    return done
