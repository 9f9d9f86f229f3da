"""Record the golden logs again, deliberately (after a change that is meant to alter
what an algorithm decides: a prompt, a rule, a new event).

    .venv/bin/python -m tests.golden.record             # every algorithm
    .venv/bin/python -m tests.golden.record fsm plan_and_execute
    .venv/bin/python -m tests.golden.record --check     # write nothing; exit 1 if a
                                                        # golden log no longer replays

Each log is the run of the scenario named in ``tests.algos.scenarios.GOLDEN``, with
the fake model and a fixed run id, written as JSON lines (times and tracebacks left
out). Review the diff before committing it: it is exactly what changed in the
decisions.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from tests.algos.scenarios import GOLDEN, RUN  # noqa: E402
from tests.golden.replay import dump, path_of, replay_file  # noqa: E402


async def record(name: str) -> str:
    result = await GOLDEN[name](False)
    return dump(e for e in result.log if e.stream == RUN)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("names", nargs="*", help=f"which logs (default: all of {sorted(GOLDEN)})")
    parser.add_argument("--check", action="store_true", help="replay the committed logs, write nothing")
    args = parser.parse_args(argv)
    names = args.names or sorted(GOLDEN)
    unknown = sorted(set(names) - set(GOLDEN))
    if unknown:
        parser.error(f"unknown golden logs {unknown}; known: {sorted(GOLDEN)}")
    status = 0
    for name in names:
        if args.check:
            r = replay_file(name)
            print(f"{name}: {'replays' if r.same else 'DIFFERS'}")
            if not r.same:
                print(r.explain())
                status = 1
            continue
        text = asyncio.run(record(name))
        path = path_of(name)
        old = path.read_text(encoding="utf-8") if path.exists() else None
        path.write_text(text, encoding="utf-8")
        print(
            f"{name}: {'unchanged' if old == text else 'written'} ({text.count(chr(10))} events) -> "
            f"{path.relative_to(Path.cwd()) if path.is_relative_to(Path.cwd()) else path}"
        )
    return status


if __name__ == "__main__":
    raise SystemExit(main())
