"""The spec's large-payload program (spec 004, ``aaa`` -> ``aaa_django``) runs as written."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_large_payloads_example_prints_the_three_lines():
    out = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "large_payloads.py")],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[0] == "got 60000 chars"
    m = re.fullmatch(r"stored event keys: \['\$claim', 'call_id', 'name'\] \| blob: (\d+) bytes", lines[1])
    assert m, lines[1]
    # 60,000 bytes of result + the JSON envelope: {"call_id":"call_<13>","name":"fetch_report","result":"..."}
    assert int(m.group(1)) == 60_066
    assert lines[2] == "hydrated result length: 60000"
