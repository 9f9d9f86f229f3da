"""ToolLoop at 10, 100 and 1,000 turns: engine overhead, flatness, log growth.

    .venv/bin/python benchmarks/bench_toolloop.py [--turns 10,100,1000] [--stores memory,sqlite,postgres]

The model is the scripted ``FakeLLMClient`` (it asks for the no-op tool until the
last turn) and the tool does nothing, so nearly all the time measured is the engine:
appending and reading events, folding projections, rebuilding the conversation,
the bus. Printed per run:

- overhead/turn: wall time per turn minus the time spent inside the model client
  and the tool (microseconds);
- turn@10 and turn@N: median wall time of a turn around turn 10 and at the end of the
  run (20-turn windows), and their ratio (flat is 1.0; the goal is <= 1.5); the ratio
  of the window means is printed too: it includes rare spikes (GC, the holder's
  periodic whole-log self-check) that the median leaves out;
- log bytes/turn: JSON bytes of event data per turn (constant per turn = linear log);
- store calls and time in the store per turn.

Stores: the in-memory store, and ``DjangoEventStore`` on SQLite (WAL,
synchronous=FULL) and on PostgreSQL (a durable cluster started for the run, see
common.py); each store is warmed up by a 10-turn run first. Two fold holders are
compared: the default (its self-check refolds the whole log every 100 reads) and one
with the self-check off; the difference, the self-check's cost a turn, is printed
last. Ratios, not absolute times, are the point: they do not depend on the machine.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from aaa_django.algos import ToolLoop
from aaa_django.events import FoldCache, InMemoryEventStore, encode_json
from aaa_django.llm import FakeLLMClient, LLMHandler
from aaa_django.llm.fake import text, tool_call
from aaa_django.runtime import Engine
from aaa_django.tools import ToolHandler, ToolRegistry, tool

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import CountingStore


@tool(inline=True)
def noop(i: int) -> int:
    """Does nothing."""
    return i


class TimedClient(FakeLLMClient):
    """The fake client, timing itself and stamping the start of every turn."""

    def __init__(self, turns: int) -> None:
        self.turns = turns
        self.inside = 0.0
        self.stamps: list[float] = []
        self._tool_results = 0
        super().__init__(self.model)

    def model(self, request):
        self._tool_results += 0  # the conversation is the state: count from it
        done = request.messages[-1].role == "tool" and len(self.stamps) >= self.turns
        return text("done") if done else tool_call("noop", i=len(self.stamps))

    async def complete(self, request):
        t0 = time.perf_counter()
        self.stamps.append(t0)
        reply = await super().complete(request)
        self.inside += time.perf_counter() - t0
        return reply


async def one_run(turns: int, store, cache: FoldCache) -> dict:
    client = TimedClient(turns)
    registry = ToolRegistry([noop])
    store = CountingStore(store)
    async with Engine(store=store, cache=cache) as engine:
        LLMHandler(client).attach(engine)
        ToolHandler(registry).attach(engine)
        gc.collect()
        t0 = time.perf_counter()
        run = await engine.start(ToolLoop(registry, max_turns=turns + 1), {"task": "bench"})
        outcome = await run.result()
        total = time.perf_counter() - t0
        assert outcome.ok, outcome
        events = await engine.store.read(run.run_id)
    stamps = client.stamps
    gaps = [b - a for a, b in zip(stamps, stamps[1:])]
    # medians of 20-turn windows: robust to a stray GC pause, still a per-turn cost
    early = gaps[5:25] if len(gaps) >= 25 else gaps
    late = gaps[-20:]
    data_bytes = sum(len(encode_json(e.data)) for e in events)
    return {
        "turns": len(stamps),
        "events": len(events),
        "total_s": total,
        "overhead_us": (total - client.inside) / len(stamps) * 1e6,
        "early_us": statistics.median(early) * 1e6,
        "late_us": statistics.median(late) * 1e6,
        "early_mean_us": statistics.mean(early) * 1e6,
        "late_mean_us": statistics.mean(late) * 1e6,
        "store_calls": store.calls / len(stamps),
        "store_us": store.seconds / len(stamps) * 1e6,
        "bytes_per_turn": data_bytes / len(stamps),
    }


def report(label: str, r: dict) -> None:
    ratio = r["late_us"] / r["early_us"]
    mean_ratio = r["late_mean_us"] / r["early_mean_us"]
    print(
        f"{label:<16} turns={r['turns']:>5} events={r['events']:>6} "
        f"total={r['total_s']:7.3f}s overhead/turn={r['overhead_us']:7.0f}us "
        f"turn@10={r['early_us']:6.0f}us turn@N={r['late_us']:6.0f}us "
        f"ratio={ratio:4.2f} (means: {mean_ratio:4.2f}) "
        f"log bytes/turn={r['bytes_per_turn']:4.0f} store calls/turn={r['store_calls']:4.1f} "
        f"in store/turn={r['store_us']:6.0f}us"
    )


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--turns", default="10,100,1000")
    p.add_argument(
        "--stores",
        default="memory,sqlite,postgres",
        help="of memory, sqlite, postgres (DjangoEventStore; durable, see common.py)",
    )
    p.add_argument("--sqlite", action="store_true", help="(no effect: sqlite is a default store)")
    p.add_argument("--repeat", type=int, default=1)
    args = p.parse_args()
    sizes = [int(x) for x in args.turns.split(",")]
    wanted = [s for s in args.stores.split(",") if s]
    holders = {
        "default holder (self-check/100)": lambda: FoldCache(),
        "holder, self-check off": lambda: FoldCache(check_every=0),
    }
    from contextlib import nullcontext

    from common import postgres, setup_django, workdir

    with workdir() as tmp, postgres(tmp) if "postgres" in wanted else nullcontext(None) as pg:
        stores = {"memory": InMemoryEventStore}
        if "sqlite" in wanted or "postgres" in wanted:
            backends = setup_django(tmp, pg)
            from aaa_django.store import DjangoEventStore

            if "sqlite" in wanted:
                stores["sqlite"] = lambda: DjangoEventStore(backends["SQLite"])
            if pg is not None:
                stores["postgres"] = lambda: DjangoEventStore(backends["PostgreSQL"])
        if "memory" not in wanted:
            del stores["memory"]
        results: dict[tuple[str, str, int], dict] = {}
        for store_name, make_store in stores.items():
            # Warm up: imports, connections, the code paths of a turn (not measured).
            asyncio.run(one_run(10, make_store(), FoldCache()))
            for holder_name, make_cache in holders.items():
                print(f"\n== {store_name} store, {holder_name}")
                for n in sizes:
                    best = None
                    for _ in range(args.repeat):
                        r = asyncio.run(one_run(n, make_store(), make_cache()))
                        if best is None or r["total_s"] < best["total_s"]:
                            best = r
                    results[store_name, holder_name, n] = best
                    report(f"{store_name} N={n}", best)
        on, off = holders
        print(
            "\n== the self-check's cost (overhead/turn with it, less without it; its whole-log "
            "fold every 100 holder reads)"
        )
        for store_name in stores:
            for n in sizes:
                a, b = results[store_name, on, n], results[store_name, off, n]
                print(
                    f"{store_name} N={n}: {a['overhead_us'] - b['overhead_us']:+7.0f}us a turn "
                    f"({(a['overhead_us'] / b['overhead_us'] - 1) * 100:+.0f}%)"
                )


if __name__ == "__main__":
    main()
