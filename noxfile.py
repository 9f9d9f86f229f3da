"""The test matrix: one nox session per supported Django and Python.

    nox -l                                   # the legs
    nox -s django61-py313                    # one leg: pytest -q -n 2 (what it runs by default)
    nox -s django61-py313 -- tests/admin -x  # one leg, any pytest arguments
    bin/test --leg django61-py313 [ARGS]     # the same, with bin/test's services

``bin/test`` runs the first leg in ``.venv`` and then the others (tag ``other-legs``)
here, with the services it started (the ``AAA_TEST_*`` variables pass through). Each
leg is a virtualenv made by uv under ``.nox/`` with ``requirements/test.txt``, that
leg's Django in place of the pinned one, and the package (editable). The other legs
leave out what does not depend on Django or Python: see ``OTHER_LEGS_SKIP`` and
docs/development.md. Interpreters: ``python3.X`` on the PATH, else pyenv's newest
``3.X.*``; ``AAA_PYTHON_3_12=/path/to/python`` (and so on) names one.
"""

from __future__ import annotations

import glob
import os
import shutil
import subprocess
import sys
from pathlib import Path

import nox

ROOT = Path(__file__).resolve().parent
sys.path.insert(0, str(ROOT))
from tests.install.uvenv import pip_constraints, uv_environment  # noqa: E402

nox.options.default_venv_backend = "uv"
nox.options.reuse_venv = "yes"
nox.options.error_on_missing_interpreters = True
nox.options.sessions = []  # name the legs: bin/test runs them, or `nox -s LEG`

#: leg -> (Python, Django)
LEGS = {
    "django52-py311": ("3.11", "5.2"),
    "django60-py312": ("3.12", "6.0"),
    "django60-py313": ("3.13", "6.0"),
    "django61-py312": ("3.12", "6.1"),
    "django61-py313": ("3.13", "6.1"),
}

#: what the legs after the first leave out, to keep CI within its time (docs/development.md,
#: "The matrix"): RabbitMQ as the second broker, the long fault and load campaigns, the
#: static checks (mypy checks for Python 3.11 anyway), the install profiles, and every
#: test marked slow (the site started as deployed, the Celery clusters' kills and loads).
#: What is left is the rest of the suite, with its services: PostgreSQL, Redis, Celery
#: workers, S3 and the browser tests among it.
OTHER_LEGS_SKIP = ["-m", "not rabbitmq and not campaign and not static and not install and not slow"]


def interpreter(version: str) -> str:
    """The interpreter of Python ``version`` on this machine."""
    named = os.environ.get(f"AAA_PYTHON_{version.replace('.', '_')}")
    if named:
        return named
    on_path = shutil.which(f"python{version}")
    if on_path and subprocess.run([on_path, "-c", ""], capture_output=True).returncode == 0:
        return on_path
    pyenv = os.environ.get("PYENV_ROOT", os.path.expanduser("~/.pyenv"))
    found = sorted(
        glob.glob(f"{pyenv}/versions/{version}.*/bin/python"),
        key=lambda p: [int(x) for x in Path(p).parents[1].name.split(".") if x.isdigit()],
    )
    return found[-1] if found else version


def run_leg(session: nox.Session, django: str, *, first: bool) -> None:
    overrides = Path(session.create_tmp()) / "django.txt"
    overrides.write_text(f"Django~={django}.0\n")
    constraints = [arg for c in pip_constraints() for arg in ("--constraint", c)]
    session.install(
        "-r",
        "requirements/test.txt",
        "--override",
        str(overrides),
        *constraints,
        "-e",
        ".",
        env={**uv_environment(), "UV_PYTHON_DOWNLOADS": "never"},
    )
    session.run(
        "python", "-c", "import django, sys; print('Django', django.get_version(), 'on Python', sys.version.split()[0])"
    )
    env = {}
    if os.environ.get("AAA_TEST_TMPDIR"):  # a leg's scratch files apart from another's
        env["AAA_TEST_TMPDIR"] = f"{os.environ['AAA_TEST_TMPDIR']}-{session.name}"
    args = session.posargs or ["-q", "-n", "2", *([] if first else OTHER_LEGS_SKIP)]
    session.run("python", "-m", "pytest", *args, env=env)


def _define(leg: str, python: str, django: str) -> None:
    first = leg == next(iter(LEGS))

    # --seed: pip in the venv, as in one `python -m venv` makes (the tests read its config)
    @nox.session(name=leg, python=interpreter(python), venv_params=["--seed"], tags=[] if first else ["other-legs"])
    def session(session: nox.Session) -> None:
        run_leg(session, django, first=first)

    session.__doc__ = f"Django {django} on Python {python}" + (" (bin/test runs it in .venv)" if first else "")


for _leg, (_python, _django) in LEGS.items():
    _define(_leg, _python, _django)
