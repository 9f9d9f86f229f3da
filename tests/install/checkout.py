"""A clean copy of the checkout, as a new user's clone would have it.

The files are the working tree's, as the next commit would have them: the tracked
files that still exist (with their uncommitted changes) and new files git does not
ignore, so a test run on an uncommitted tree sees the change it tests. Nothing
ignored comes along: no ``.venv``, ``var/``, caches or build output.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def checkout_files(root: Path = ROOT) -> list[str]:
    """The paths (relative to ``root``) a clean copy holds."""
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=root,
        capture_output=True,
        check=True,
    ).stdout.decode()
    return sorted({name for name in listed.split("\0") if name and (root / name).is_file()})


def copy_checkout(dest: Path, root: Path = ROOT) -> Path:
    """Copy the checkout's files into ``dest`` (modes kept: ``bin/`` stays executable)."""
    for name in checkout_files(root):
        target = dest / name
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(root / name, target)
    return dest
