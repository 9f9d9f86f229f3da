"""Conversations that wait for their people: N open conversations on one process.

    .venv-bench/bin/python benchmarks/bench_conversations.py                  # 1,000 over 60 s, 1 s model
    .venv-bench/bin/python benchmarks/bench_conversations.py --conversations 200 --over 20 --only aaa
    .venv-bench/bin/python benchmarks/bench_conversations.py --repeat 3         # the rows in turn, three times

(``.venv-bench``: a venv with ``requirements/bench.txt``, see benchmarks/README.md.)

Each row opens N conversations at once (each answers its first message: a model call
of L seconds), lets them wait, then sends each its second message at a random moment
over ``--over`` seconds (the same moments for every row: ``--seed``), and times each
reply: from the message sent to the reply in hand, over L (the goal: within 1.3x for
every reply). Memory per waiting conversation: the process's resident memory with N
conversations waiting (after ``gc.collect()`` and glibc's ``malloc_trim``, so freed
memory is not counted) less the same before they were opened, over N (the goal: at
most 50 KB), measured after the first answers and again after the second.

Rows (each in a process of its own, on one durable PostgreSQL 15, one after the other,
in one run):

- ``aaa``: ``Engine`` on the in-process bus with the site's store (``PgEventStore``,
  group commit) and the site's wake-ups; a ToolLoop started with ``conversation=True``
  per conversation (``{"idle": 3600}``, the REST API's default: the engine holds a loop
  timer for each); the next message is ``run.say(...)``, the reply awaited with
  ``run.waiting()``. The model: an ``LLMClient`` that sleeps L then says what it heard
  (not ``FakeLLMClient``, whose token counting keeps each run's conversation).
- ``langgraph``: a LangGraph 1.2 graph of one model node (the same model) with
  ``AsyncPostgresSaver`` on a ``psycopg_pool`` pool (``--pool`` connections), one
  thread per conversation (``thread_id``), invoked again with the next message
  (``durability="sync"``).

The machine is shared: the load average is printed at the start and end of each row;
compare the rows of one run, not figures across runs.
"""

from __future__ import annotations

import argparse
import asyncio
import ctypes
import gc
import json
import os
import platform
import random
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from common import PG_DB, ROOT, postgres, rss, setup_django, table, workdir  # noqa: E402

ROWS = ["aaa", "langgraph"]
#: a reply within this many model latencies is on time (the goal)
GOAL_RATIO = 1.3
#: memory per waiting conversation at most (the goal), bytes
GOAL_MEMORY = 50 * 1024


def trimmed_rss() -> int:
    """The process's resident memory once garbage is collected and glibc has given back
    what it can."""
    gc.collect()
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except OSError:
        pass
    return rss()


def moments(n: int, over: float, seed: int) -> list[float]:
    """When each conversation gets its second message: seconds after the first is sent."""
    rng = random.Random(seed)
    return [rng.uniform(0, over) for _ in range(n)]


def heard(last: str, count: int) -> str:
    return f"heard {last!r} ({count} messages)"


# -- aaa_django ------------------------------------------------------------------------------


class SleepyModel:
    """An ``LLMClient`` whose reply comes after ``latency`` seconds: what it heard, and how
    many messages the conversation had."""

    def __init__(self, latency: float) -> None:
        self.latency = latency

    async def complete(self, request):
        from aaa_django.llm.messages import LLMResponse, Message, Usage

        await asyncio.sleep(self.latency)
        content = heard(request.messages[-1].content or "", len(request.messages))
        return LLMResponse(
            message=Message(role="assistant", content=content),
            usage=Usage(input_tokens=10 * len(request.messages), output_tokens=8),
            finish_reason="stop",
        )


async def aaa(n: int, latency: float, at: list[float]) -> dict:
    from aaa_django.algos import ToolLoop
    from aaa_django.llm import LLMHandler
    from aaa_django.runtime import Engine
    from aaa_django.store import wakeups
    from aaa_django.store.postgres import site_store
    from aaa_django.tools import ToolRegistry

    algo = ToolLoop(ToolRegistry([]))
    async with Engine(
        store=site_store("postgres"), wakeups=wakeups.for_database("postgres"), close_timeout=30
    ) as engine:
        LLMHandler(SleepyModel(latency)).attach(engine)
        for i in range(3):  # warm-up: a conversation of two turns, closed
            run = await engine.start(algo, {"task": f"warm {i}"}, conversation=True)
            await run.waiting()
            await run.say("again")
            await run.waiting()
            await run.close()
            await run.result()
        await engine.drain()
        base = trimmed_rss()

        async def open_one(i: int):  # (an idle timeout: the API's default, a loop timer each)
            run = await engine.start(algo, {"task": f"hello from {i}"}, conversation={"idle": 3600})
            meta = await run.waiting()
            assert meta.status == "waiting" and meta.turns == 1, meta
            return run

        t0 = time.perf_counter()
        runs = await asyncio.gather(*(open_one(i) for i in range(n)))
        opened = time.perf_counter() - t0
        await engine.drain()
        held_open = trimmed_rss() - base

        async def second(run, delay: float) -> float:
            await asyncio.sleep(delay)
            t = time.perf_counter()
            await run.say(f"second from {run.run_id}")
            meta = await run.waiting()
            took = time.perf_counter() - t
            assert meta.status == "waiting" and meta.turns == 2, meta
            return took

        c0 = time.process_time()
        replies = await asyncio.gather(*(second(r, d) for r, d in zip(runs, at)))
        cpu = time.process_time() - c0
        await engine.drain()
        held_after = trimmed_rss() - base
        last = await runs[0].events(hydrate=True)
        assert [e.data["content"] for e in last if e.type == "aaa.message.sent"][-1] == heard(
            f"second from {runs[0].run_id}", 3
        )
        timers = len(engine.timers())
    return {
        "opened": opened,
        "replies": replies,
        "cpu": cpu,
        "held_open": held_open,
        "held_after": held_after,
        "timers": timers,
    }


# -- LangGraph -------------------------------------------------------------------------------


def chat_graph(saver, latency: float):
    """One model node: it says what it heard (the same model as aaa's)."""
    from typing import Annotated, TypedDict

    from langchain_core.messages import AIMessage
    from langgraph.graph import END, START, StateGraph
    from langgraph.graph.message import add_messages

    State = TypedDict("State", {"messages": Annotated[list, add_messages]})  # noqa: UP013

    async def agent(state):
        await asyncio.sleep(latency)
        messages = state["messages"]
        return {"messages": [AIMessage(heard(messages[-1].content, len(messages)))]}

    g = StateGraph(State)
    g.add_node("agent", agent)
    g.add_edge(START, "agent")
    g.add_edge("agent", END)
    return g.compile(checkpointer=saver)


async def langgraph(pg: dict, n: int, latency: float, at: list[float], pool_size: int) -> dict:
    from langchain_core.messages import HumanMessage
    from langgraph.checkpoint.postgres.aio import AsyncPostgresSaver
    from psycopg.rows import dict_row
    from psycopg_pool import AsyncConnectionPool

    conninfo = f"host={pg['host']} port={pg['port']} user={pg['user']} dbname={PG_DB}"
    kwargs = dict(autocommit=True, row_factory=dict_row, prepare_threshold=0)
    async with AsyncConnectionPool(conninfo, kwargs=kwargs, min_size=pool_size, max_size=pool_size) as pool:
        saver = AsyncPostgresSaver(pool)
        await saver.setup()
        app = chat_graph(saver, latency)

        async def say(thread: str, text: str) -> str:
            config = {"configurable": {"thread_id": thread}}
            out = await app.ainvoke({"messages": [HumanMessage(text)]}, config, durability="sync")
            return out["messages"][-1].content

        prefix = f"p{os.getpid()}"  # (threads of their own: the rows share the database)
        for i in range(3):
            await say(f"{prefix}-warm-{i}", "hello")
            await say(f"{prefix}-warm-{i}", "again")
        base = trimmed_rss()

        t0 = time.perf_counter()
        threads = [f"{prefix}-t-{i}" for i in range(n)]
        firsts = await asyncio.gather(*(say(t, f"hello from {i}") for i, t in enumerate(threads)))
        opened = time.perf_counter() - t0
        assert firsts[0] == heard("hello from 0", 1)
        held_open = trimmed_rss() - base

        async def second(thread: str, delay: float) -> float:
            await asyncio.sleep(delay)
            t = time.perf_counter()
            reply = await say(thread, f"second from {thread}")
            took = time.perf_counter() - t
            assert reply == heard(f"second from {thread}", 3), reply
            return took

        c0 = time.process_time()
        replies = await asyncio.gather(*(second(t, d) for t, d in zip(threads, at)))
        cpu = time.process_time() - c0
        held_after = trimmed_rss() - base
    return {"opened": opened, "replies": replies, "cpu": cpu, "held_open": held_open, "held_after": held_after}


# -- the runner ------------------------------------------------------------------------------


def child(args) -> None:
    pg = json.loads(os.environ["AAA_BENCH_PG"])
    tmp = Path(os.environ["AAA_BENCH_TMP"])
    at = moments(args.conversations, args.over, args.seed)
    load = os.getloadavg()
    if args.child == "langgraph":
        out = asyncio.run(langgraph(pg, args.conversations, args.latency, at, args.pool))
    else:
        setup_django(tmp, pg)
        out = asyncio.run(aaa(args.conversations, args.latency, at))
    out["load"] = [load, os.getloadavg()]
    print(json.dumps(out))


def quantiles(r: dict, latency: float) -> dict:
    """A row's reply times over the model's: p50, p90, p99, the slowest, how many on time."""
    ratios = sorted(t / latency for t in r["replies"])

    def q(p: float) -> float:
        return ratios[min(int(len(ratios) * p), len(ratios) - 1)]

    return {
        "p50": q(0.5),
        "p90": q(0.9),
        "p99": q(0.99),
        "max": ratios[-1],
        "on_time": sum(1 for x in ratios if x <= GOAL_RATIO),
        "n": len(ratios),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--conversations", type=int, default=1000)
    ap.add_argument("--over", type=float, default=60.0, help="seconds over which the second messages come")
    ap.add_argument("--latency", type=float, default=1.0, help="seconds of each model call")
    ap.add_argument("--seed", type=int, default=40)
    ap.add_argument("--pool", type=int, default=10, help="LangGraph's PostgreSQL pool size")
    ap.add_argument("--only", default=",".join(ROWS), help=f"rows to run, of {','.join(ROWS)}")
    ap.add_argument(
        "--repeat",
        type=int,
        default=1,
        help="run the rows this many times, in turn, and print each repetition and the "
        "medians (the machine's load moves between rows)",
    )
    ap.add_argument("--child", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        child(args)
        return
    rows = [r for r in args.only.split(",") if r]
    if set(rows) - set(ROWS):
        ap.error(f"unknown rows {sorted(set(rows) - set(ROWS))}; choose from {ROWS}")
    started = time.perf_counter()
    results: dict[str, list[dict]] = {}
    with workdir() as tmp, postgres(tmp) as pg:
        for repetition in range(args.repeat):
            for row in rows:
                sub = tmp / f"{row}-{repetition}"
                sub.mkdir()
                os.chmod(sub, 0o777)
                cmd = [
                    sys.executable,
                    __file__,
                    "--child",
                    row,
                    "--conversations",
                    str(args.conversations),
                    "--over",
                    str(args.over),
                    "--latency",
                    str(args.latency),
                    "--seed",
                    str(args.seed),
                    "--pool",
                    str(args.pool),
                ]
                env = {
                    **os.environ,
                    "AAA_BENCH_PG": json.dumps(pg),
                    "AAA_BENCH_TMP": str(sub),
                    "PYTHONPATH": os.pathsep.join([str(HERE), str(ROOT)]),
                }
                proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
                if proc.returncode:
                    print(f"# {row} failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}", file=sys.stderr)
                    continue
                r = json.loads(proc.stdout.strip().splitlines()[-1])
                r["repetition"] = repetition
                results.setdefault(row, []).append(r)
                print(
                    f"# {row} ({repetition + 1}/{args.repeat}): opened in {r['opened']:.2f} s, load average "
                    f"{r['load'][0][0]:.2f} -> {r['load'][1][0]:.2f}",
                    flush=True,
                )
    n, latency = args.conversations, args.latency
    print(
        f"\n# bench_conversations: Python {platform.python_version()}, {os.cpu_count()} CPUs; {n} "
        f"conversations on one process, each sent its second message at a random moment over "
        f"{args.over:g} s (seed {args.seed}); model latency {latency:g} s; durable PostgreSQL 15; "
        f"{args.repeat} repetition(s), the rows in turn"
    )
    labels = {
        "aaa": "aaa_django, in-process bus, PostgreSQL",
        "langgraph": f"LangGraph threads, AsyncPostgresSaver (pool {args.pool})",
    }
    out = []
    for row, rs in results.items():
        for r in rs:
            qs = quantiles(r, latency)
            out.append(
                [
                    f"{labels[row]} ({r['repetition'] + 1})",
                    f"{r['opened']:.2f} s",
                    f"{qs['p50']:.2f}x / {qs['p90']:.2f}x / {qs['p99']:.2f}x",
                    f"{qs['max']:.2f}x",
                    f"{qs['on_time']}/{qs['n']}",
                    f"{r['held_open'] / n / 1024:.1f} KB / {r['held_after'] / n / 1024:.1f} KB",
                    f"{r['cpu']:.1f} s",
                    f"{r['load'][0][0]:.2f} -> {r['load'][1][0]:.2f}",
                ]
            )
    print(
        table(
            [
                "row (repetition)",
                f"{n} opened (1st replies)",
                "reply / model (p50 / p90 / p99)",
                "slowest",
                f"within {GOAL_RATIO}x",
                "memory per waiting conversation (1 turn / 2 turns)",
                "CPU (2nd messages)",
                "load average",
            ],
            out,
        )
    )
    med = statistics.median
    for row, rs in results.items():
        qs = [quantiles(r, latency) for r in rs]
        per = med([max(r["held_open"], r["held_after"]) / n for r in rs])
        print(
            f"# {labels[row]}, medians: reply p50 {med([q['p50'] for q in qs]):.2f}x, p90 "
            f"{med([q['p90'] for q in qs]):.2f}x, p99 {med([q['p99'] for q in qs]):.2f}x, slowest "
            f"{med([q['max'] for q in qs]):.2f}x, within {GOAL_RATIO}x {med([q['on_time'] for q in qs]):g}/{n}; "
            f"{per / 1024:.1f} KB per waiting conversation; CPU {med([r['cpu'] for r in rs]):.1f} s"
        )
    if "aaa" in results:
        rs = results["aaa"]
        slowest = max(max(r["replies"]) for r in rs) / latency
        per = max(max(r["held_open"], r["held_after"]) for r in rs) / n
        print(
            f"# goals (every repetition): every reply within {GOAL_RATIO}x the model time: "
            f"{'met' if slowest <= GOAL_RATIO else 'NOT met'} (slowest {slowest:.2f}x); at most "
            f"{GOAL_MEMORY // 1024} KB per waiting conversation: "
            f"{'met' if per <= GOAL_MEMORY else 'NOT met'} ({per / 1024:.1f} KB); the engine held "
            f"{rs[0]['timers']} loop timers (their idle timeouts)"
        )
    if "aaa" in results and "langgraph" in results:
        lg = {r["repetition"]: r for r in results["langgraph"]}
        for a in results["aaa"]:
            b = lg.get(a["repetition"])
            if b is None:
                continue
            qa, qb = quantiles(a, latency), quantiles(b, latency)
            print(
                f"# repetition {a['repetition'] + 1}, aaa_django / LangGraph: median reply "
                f"{qa['p50'] / qb['p50']:.2f}x, p99 {qa['p99'] / qb['p99']:.2f}x, CPU {a['cpu'] / b['cpu']:.2f}x, "
                f"memory per waiting conversation {max(a['held_open'], a['held_after']) / max(b['held_open'], b['held_after']):.2f}x"
            )
    print(f"# total {time.perf_counter() - started:.0f} s")


if __name__ == "__main__":
    main()
