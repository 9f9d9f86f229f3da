"""A ToolLoop turn on PostgreSQL with this checkout's group commit against another
checkout's (``--db sqlite``: on SQLite, this checkout's ``SqliteEventStore`` against
another's), in one process, alternated round by round, their order swapped every round.

    .venv-bench/bin/python benchmarks/ab_turn.py --base /tmp/base           # ~1 min
    .venv-bench/bin/python benchmarks/ab_turn.py --base . --rounds 81       # the noise: this against itself
    .venv-bench/bin/python benchmarks/ab_turn.py --base /tmp/base --db sqlite

``--base``: a checkout of the commit to compare with (``git worktree add --detach DIR
REV``); its ``aaa_django/store/groupcommit.py`` is loaded beside this one's and given to
a second ``PgEventStore`` (everything else is this checkout's); with ``--db sqlite`` its
``aaa_django/store/sqlite.py`` is, and its ``SqliteEventStore`` (a connection of its own
to the same database file) is the base. Each round runs one
20-turn run on each store (``bench_turn.aaa_run``) and one on the in-memory store; the
order of the two swaps every round, because on this machine the second of two
identical stores measures about 0.96x the first (a harness that ran the base first in
every round would read a change 4 points better than it is). Prints the medians per turn and this
checkout's over the base's (the median of the rounds' ratios). ``--base .`` measures the
harness's own noise.
"""

import argparse
import asyncio
import importlib.util
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_turn import aaa_run
from common import postgres, setup_django, workdir

ap = argparse.ArgumentParser()
ap.add_argument("--base", required=True, help="a checkout of the commit to compare with")
ap.add_argument("--rounds", type=int, default=41)
ap.add_argument("--turns", type=int, default=20)
ap.add_argument("--db", choices=["postgres", "sqlite"], default="postgres")
args = ap.parse_args()


def load(path: Path, name: str):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # (dataclasses look their module up)
    spec.loader.exec_module(module)
    return module


async def go(alias: str) -> None:
    from aaa_django.events import InMemoryEventStore
    from aaa_django.store.postgres import PgEventStore

    if args.db == "sqlite":
        from aaa_django.store.sqlite import SqliteEventStore

        base_module = load(Path(args.base).resolve() / "aaa_django/store/sqlite.py", "aaa_django.store._base_sqlite")
        base, this = base_module.SqliteEventStore(alias), SqliteEventStore(alias)
    else:
        base_module = load(
            Path(args.base).resolve() / "aaa_django/store/groupcommit.py", "aaa_django.store._base_groupcommit"
        )
        base, this = PgEventStore(alias), PgEventStore(alias)
        base.group = base_module.GroupCommit(base)
    res: dict[str, list[dict]] = {"base": [], "this": [], "memory": []}
    for rnd in range(args.rounds + 3):
        pair = [("base", base), ("this", this)]
        for name, store in (pair if rnd % 2 else pair[::-1]) + [("memory", None)]:
            r = await aaa_run(store if store is not None else InMemoryEventStore(), args.turns)
            if rnd >= 3:  # (warm-up)
                res[name].append(r)
    med = statistics.median
    for name, rows in res.items():
        wall = med(r["seconds"] for r in rows) / args.turns * 1e3
        cpu = med(r["cpu"] for r in rows) / args.turns * 1e3
        vs = (
            (
                f"; / base: wall {med(a['seconds'] / b['seconds'] for a, b in zip(rows, res['base'])):.3f}x, "
                f"CPU {med(a['cpu'] / b['cpu'] for a, b in zip(rows, res['base'])):.3f}x"
            )
            if name == "this"
            else ""
        )
        print(f"{name:7} wall {wall:.3f} ms, CPU {cpu:.3f} ms a turn{vs}")


with workdir() as tmp:
    if args.db == "sqlite":
        asyncio.run(go(setup_django(tmp, None)["SQLite"]))
    else:
        with postgres(tmp) as pg:
            asyncio.run(go(setup_django(tmp, pg)["PostgreSQL"]))
