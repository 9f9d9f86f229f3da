"""A ToolLoop turn's persistence, against LangGraph's checkpointer and against the floor.

    .venv-bench/bin/python benchmarks/bench_turn.py              # the reported run (~2 min)
    .venv-bench/bin/python benchmarks/bench_turn.py --quick      # fewer rounds (~40 s)
    .venv-bench/bin/python benchmarks/bench_turn.py --turns 100  # a longer conversation

(``.venv-bench``: a venv with ``requirements/bench.txt``, see benchmarks/README.md.)

One turn = one model call and the tool call it asks for (the model is scripted and
answers at once, the tool does nothing), so what is measured is what the framework
does around them: persisting the turn durably and deciding the next step. Both sides
run the same conversation (T model calls, a tool call after each but the last) on the
same database in the same process, in rounds (ours, LangGraph's, the raw commits),
so a busy moment of this 2-core machine moves every side alike:

- **aaa_django**: ``Engine`` on the in-process bus with the site's store (the embedded
  default's path, ``site_store``: on PostgreSQL ``PgEventStore``, whose calls are
  awaits; the Django store, a thread hop per call, is measured in the same rounds
  beside it), a ToolLoop run of T turns; per turn = the run's wall time / T. The same
  runs with each result appended alone (``Engine(answers=False)``) are measured in the
  same rounds beside it, and on PostgreSQL the same runs on connections that prepare
  no statements (``OPTIONS`` ``prepare_threshold`` None: as behind a transaction-mode
  pooler; the store's connections prepare theirs when nothing pools them, as here,
  ``aaa_django.store.connections``). Also its store
  calls per turn (of them, reads), the durable commits per turn (appends that stored
  something), and the process's CPU per turn.
- **LangGraph** 1.2: the same loop as a graph (an agent node and a tool node over
  ``MessagesState``-style ``add_messages`` state), ``ainvoke(..., durability="sync")``
  with its async checkpointer on the same database (``AsyncPostgresSaver`` on a
  ``psycopg_pool.AsyncConnectionPool`` with ``autocommit=True, row_factory=dict_row,
  prepare_threshold=0``; ``AsyncSqliteSaver`` on an aiosqlite connection with the same
  pragmas as ours: WAL, ``synchronous=FULL``), and with the sync ``invoke`` and its sync
  saver; the faster of the two is the one compared.
- **floor**: the turn's durable commits (ours, counted) times a raw one-row durable
  commit measured here (psycopg autocommit INSERT; sqlite3 BEGIN IMMEDIATE / INSERT /
  COMMIT), plus the engine's own work per turn (the same runs on the in-memory store).
  The raw commit is made as the turn makes its commits: after the engine's work
  between two of them (CPU kept busy that long: ``common.busy``). On this VM a commit
  after ~0.5 ms of work costs about twice one made back to back (its server's
  processes, and the disk's, go idle meanwhile); the back-to-back commit, and the
  floor it would give, are printed beside it.

Goals: a turn below LangGraph's on both databases, and within 2x of the
floor. Storage per turn is printed too (PostgreSQL: ``pg_column_size`` of the rows a
run or a thread wrote): LangGraph rewrites the conversation at every step; so is the
WAL per turn of one run on each side (``pg_current_wal_insert_lsn`` before and after:
what the server wrote and synced, counted by it, the same from one run to the next).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import platform
import statistics
import sys
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import (
    PG_DB,
    PG_UNPREPARED,
    SQLITE_PRAGMAS,
    CountingStore,
    postgres,
    raw_commit_postgres,
    raw_commit_sqlite,
    setup_django,
    table,
    wal_lsn,
    workdir,
)

# -- aaa_django ---------------------------------------------------------------------------


def scripted(turns: int, latency: float = 0.0):
    """A model for T turns: a no-op tool call after each reply but the last. It decides
    from the conversation (the number of tool results), so any process agrees."""
    from aaa_django.llm.fake import text, tool_call

    async def model(request):
        if latency:
            await asyncio.sleep(latency)
        done = sum(1 for m in request.messages if m.role == "tool")
        return text("done") if done >= turns - 1 else tool_call("noop", i=done)

    return model


def noop_registry():
    from aaa_django.tools import ToolRegistry, tool

    @tool(name="noop", inline=True)
    def noop(i: int = 0) -> int:
        """Does nothing."""
        return i

    return ToolRegistry([noop])


async def aaa_run(store, turns: int, cache=None, *, answers: bool = True) -> dict:
    """One ToolLoop run of ``turns`` turns on ``store``: seconds, CPU, store calls.
    ``answers=False``: each result appended alone, stepped on when delivered (see
    ``Engine.answer``), for the comparison in the same rounds."""
    from aaa_django.algos import ToolLoop
    from aaa_django.events import FoldCache
    from aaa_django.llm import FakeLLMClient, LLMHandler
    from aaa_django.runtime import Engine
    from aaa_django.tools import ToolHandler

    registry = noop_registry()
    counting = CountingStore(store)
    async with Engine(store=counting, cache=cache or FoldCache(), answers=answers) as engine:
        LLMHandler(FakeLLMClient(scripted(turns))).attach(engine)
        ToolHandler(registry).attach(engine)
        c0, t0 = time.process_time(), time.perf_counter()
        run = await engine.start(ToolLoop(registry, max_turns=turns + 1), {"task": "bench"})
        outcome = await run.result()
        seconds, cpu = time.perf_counter() - t0, time.process_time() - c0
        assert outcome.outcome == "success", outcome
        calls = dict(counting.by_method)
    return {
        "seconds": seconds,
        "cpu": cpu,
        "calls": sum(calls.values()),
        "by_method": calls,
        "commits": counting.appends,
        "run_id": run.run_id,
    }


# -- LangGraph ----------------------------------------------------------------------------


def langgraph_app(turns: int, checkpointer, latency: float = 0.0):
    """The same loop as a LangGraph graph: agent -> tools -> agent ... -> end."""
    from typing import Annotated, TypedDict

    from langchain_core.messages import AIMessage, ToolMessage
    from langgraph.graph import END, START, StateGraph
    from langgraph.graph.message import add_messages

    # (the functional form: this module's annotations are strings, and LangGraph
    # resolves the state's at run time)
    State = TypedDict("State", {"messages": Annotated[list, add_messages]})  # noqa: UP013

    def reply(state):
        done = sum(1 for m in state["messages"] if isinstance(m, ToolMessage))
        if done >= turns - 1:
            return {"messages": [AIMessage("done")]}
        call = {"name": "noop", "args": {"i": done}, "id": f"call_{done}", "type": "tool_call"}
        return {"messages": [AIMessage("", tool_calls=[call])]}

    async def agent(state):
        if latency:
            await asyncio.sleep(latency)
        return reply(state)

    def agent_sync(state):
        return reply(state)

    def tools(state):
        last = state["messages"][-1]
        return {"messages": [ToolMessage(content=str(c["args"]["i"]), tool_call_id=c["id"]) for c in last.tool_calls]}

    def route(state):
        return "tools" if state["messages"][-1].tool_calls else END

    g = StateGraph(State)
    g.add_node("agent", agent if checkpointer is None or _is_async(checkpointer) else agent_sync)
    g.add_node("tools", tools)
    g.add_edge(START, "agent")
    g.add_conditional_edges("agent", route, ["tools", END])
    g.add_edge("tools", "agent")
    return g.compile(checkpointer=checkpointer)


def _is_async(saver) -> bool:
    return type(saver).__name__.startswith("Async")


def lg_config(turns: int) -> dict:
    return {"configurable": {"thread_id": f"t-{uuid.uuid4().hex}"}, "recursion_limit": 4 * turns + 10}


async def lg_run_async(app, turns: int) -> tuple[float, str]:
    from langchain_core.messages import HumanMessage

    config = lg_config(turns)
    t0 = time.perf_counter()
    out = await app.ainvoke({"messages": [HumanMessage("bench")]}, config, durability="sync")
    seconds = time.perf_counter() - t0
    assert out["messages"][-1].content == "done", out["messages"][-1]
    return seconds, config["configurable"]["thread_id"]


def lg_run_sync(app, turns: int) -> float:
    from langchain_core.messages import HumanMessage

    config = lg_config(turns)
    t0 = time.perf_counter()
    out = app.invoke({"messages": [HumanMessage("bench")]}, config, durability="sync")
    seconds = time.perf_counter() - t0
    assert out["messages"][-1].content == "done", out["messages"][-1]
    return seconds


class Savers:
    """LangGraph's checkpointers on one database, async and sync, opened once."""

    def __init__(self, label: str, pg: dict | None, sqlite_path: str) -> None:
        self.label, self.pg, self.sqlite_path = label, pg, sqlite_path
        self.closers: list = []

    async def open(self):
        if self.label == "PostgreSQL":
            import psycopg
            from langgraph.checkpoint.postgres import PostgresSaver
            from langgraph.checkpoint.postgres.aio import AsyncPostgresSaver
            from psycopg.rows import dict_row
            from psycopg_pool import AsyncConnectionPool

            conninfo = f"host={self.pg['host']} port={self.pg['port']} user={self.pg['user']} dbname={PG_DB}"
            kwargs = dict(autocommit=True, row_factory=dict_row, prepare_threshold=0)
            pool = AsyncConnectionPool(conninfo, kwargs=kwargs, min_size=1, max_size=4, open=False)
            await pool.open()
            self.closers.append(pool.close)
            self.async_saver = AsyncPostgresSaver(pool)
            await self.async_saver.setup()
            conn = psycopg.connect(conninfo, **kwargs)
            self.closers.append(lambda: asyncio.to_thread(conn.close))
            self.sync_saver = PostgresSaver(conn)
        else:
            import sqlite3

            import aiosqlite
            from langgraph.checkpoint.sqlite import SqliteSaver
            from langgraph.checkpoint.sqlite.aio import AsyncSqliteSaver

            path = self.sqlite_path
            aconn = await aiosqlite.connect(path)
            for pragma in SQLITE_PRAGMAS.split(";"):
                if pragma.strip():
                    await aconn.execute(pragma)
            self.closers.append(aconn.close)
            self.async_saver = AsyncSqliteSaver(aconn)
            await self.async_saver.setup()
            conn = sqlite3.connect(path, check_same_thread=False)
            conn.executescript(SQLITE_PRAGMAS)
            self.closers.append(lambda: asyncio.to_thread(conn.close))
            self.sync_saver = SqliteSaver(conn)
            self.sync_saver.setup()
        return self

    async def close(self):
        for close in reversed(self.closers):
            await close()


def pg_bytes(pg: dict, sql: str, params: list) -> int:
    import psycopg

    with psycopg.connect(**pg, dbname=PG_DB) as conn:
        return int(conn.execute(sql, params).fetchone()[0] or 0)


def storage_per_turn(pg: dict, run_id: str, thread_id: str, turns: int) -> tuple[float, float]:
    ours = pg_bytes(pg, "SELECT sum(pg_column_size(e.*)) FROM aaa_event e WHERE stream = %s", [run_id])
    theirs = sum(
        pg_bytes(pg, f"SELECT sum(pg_column_size(t.*)) FROM {t} t WHERE thread_id = %s", [thread_id])
        for t in ("checkpoints", "checkpoint_blobs", "checkpoint_writes")
    )
    return ours / turns, theirs / turns


# -- the benchmark ---------------------------------------------------------------------------


async def bench(label: str, alias: str, pg: dict | None, sqlite_path: str, turns: int, rounds: int) -> dict:
    from aaa_django.events import InMemoryEventStore
    from aaa_django.store import DjangoEventStore
    from aaa_django.store.postgres import site_store

    savers = await Savers(label, pg, sqlite_path).open()
    app_async = langgraph_app(turns, savers.async_saver)
    app_sync = langgraph_app(turns, savers.sync_saver)
    store = site_store(alias)
    # The Django store (every call through Django's thread-sensitive executor), where
    # the site's store is another (PostgreSQL: the async store), in the same rounds.
    django = DjangoEventStore(alias) if type(store) is not DjangoEventStore else None
    # PostgreSQL: the same store on connections that prepare no statements (OPTIONS
    # prepare_threshold None: as behind a transaction-mode pooler).
    unprepared = site_store(PG_UNPREPARED) if label == "PostgreSQL" else None
    # Warm up every path (imports, connections, the model of each code path).
    for _ in range(2):
        await aaa_run(store, turns)
        if django is not None:
            await aaa_run(django, turns)
        if unprepared is not None:
            await aaa_run(unprepared, turns)
        await aaa_run(InMemoryEventStore(), turns)
        await lg_run_async(app_async, turns)
        await asyncio.to_thread(lg_run_sync, app_sync, turns)
    rows: list[dict] = []
    for _ in range(rounds):
        ours = await aaa_run(store, turns)
        before = await aaa_run(django, turns) if django is not None else None
        none_prepared = await aaa_run(unprepared, turns) if unprepared is not None else None
        alone = await aaa_run(store, turns, answers=False)
        memory = await aaa_run(InMemoryEventStore(), turns)
        lg_async, thread_id = await lg_run_async(app_async, turns)
        lg_sync = await asyncio.to_thread(lg_run_sync, app_sync, turns)
        # The raw commit as the turn makes its commits: after the engine's work between
        # two of them (this round's engine time per turn over the commits per turn),
        # and back to back (printed beside it: what this machine gives a client that
        # never stops sending, see common.raw_commit_postgres).
        gap = memory["seconds"] / max(ours["commits"], 1)
        raw = (
            (lambda g: raw_commit_postgres(pg, 10, g))
            if label == "PostgreSQL"
            else (lambda g: raw_commit_sqlite(sqlite_path, 10, g))
        )
        rows.append(
            {
                "ours": ours,
                "before": before,
                "unprepared": none_prepared,
                "alone": alone,
                "memory": memory,
                "lg_async": lg_async,
                "lg_sync": lg_sync,
                "commit": raw(gap),
                "back_to_back": raw(0.0),
                "gap": gap,
                "thread_id": thread_id,
            }
        )
    wal = await wal_per_turn(pg, store, app_async, app_sync, turns) if label == "PostgreSQL" else None
    await savers.close()
    storage = (
        storage_per_turn(pg, rows[-1]["ours"]["run_id"], rows[-1]["thread_id"], turns)
        if label == "PostgreSQL"
        else None
    )
    return {**summarise(rows, turns, storage), "store": repr(store), "wal": wal}


async def wal_per_turn(pg: dict, store, app_async, app_sync, turns: int) -> dict:
    """PostgreSQL's WAL bytes per turn of one run on each side (``pg_current_wal_insert_lsn``
    before and after it: what the server wrote and synced, counted by it, not a time)."""
    import psycopg

    out = {}
    with psycopg.connect(**pg, dbname=PG_DB, autocommit=True) as conn:
        for side, run in (
            ("aaa_django", lambda: aaa_run(store, turns)),
            ("LangGraph async", lambda: lg_run_async(app_async, turns)),
            ("LangGraph sync", lambda: asyncio.to_thread(lg_run_sync, app_sync, turns)),
        ):
            before = wal_lsn(conn)
            await run()
            out[side] = (wal_lsn(conn) - before) / turns
    return out


def summarise(rows: list[dict], turns: int, storage) -> dict:
    med = statistics.median
    turn = lambda s: s / turns  # noqa: E731
    ours = [turn(r["ours"]["seconds"]) for r in rows]
    lg = [turn(min(r["lg_async"], r["lg_sync"])) for r in rows]
    commits = med(r["ours"]["commits"] for r in rows) / turns
    floors = [commits * r["commit"] + turn(r["memory"]["seconds"]) for r in rows]
    tight = [commits * r["back_to_back"] + turn(r["memory"]["seconds"]) for r in rows]
    by_method: dict[str, float] = {}
    for r in rows:
        for k, v in r["ours"]["by_method"].items():
            by_method[k] = by_method.get(k, 0) + v / turns / len(rows)
    before = [turn(r["before"]["seconds"]) for r in rows if r["before"] is not None]
    alone = [turn(r["alone"]["seconds"]) for r in rows]
    unprepared = [turn(r["unprepared"]["seconds"]) for r in rows if r["unprepared"] is not None]
    return {
        "unprepared": med(unprepared) if unprepared else None,
        "vs_unprepared": med(o / u for o, u in zip(ours, unprepared)) if unprepared else None,
        "unprepared_vs_lg": med(u / g for u, g in zip(unprepared, lg)) if unprepared else None,
        "unprepared_vs_floor": med(u / f for u, f in zip(unprepared, floors)) if unprepared else None,
        "before": med(before) if before else None,
        "alone": med(alone),
        "vs_alone": med(o / a for o, a in zip(ours, alone)),
        "alone_cpu": med(turn(r["alone"]["cpu"]) for r in rows),
        "alone_commits": med(r["alone"]["commits"] for r in rows) / turns,
        "ours": med(ours),
        "ours_cpu": med(turn(r["ours"]["cpu"]) for r in rows),
        "memory": med(turn(r["memory"]["seconds"]) for r in rows),
        "lg_async": med(turn(r["lg_async"]) for r in rows),
        "lg_sync": med(turn(r["lg_sync"]) for r in rows),
        "commit": med(r["commit"] for r in rows),
        "commits": commits,
        "floor": med(floors),
        "back_to_back": med(r["back_to_back"] for r in rows),
        "gap": med(r["gap"] for r in rows),
        "tight_floor": med(tight),
        "vs_tight_floor": med(o / f for o, f in zip(ours, tight)),
        "vs_lg": med(o / g for o, g in zip(ours, lg)),
        "vs_floor": med(o / f for o, f in zip(ours, floors)),
        "calls": med(r["ours"]["calls"] for r in rows) / turns,
        "by_method": by_method,
        "storage": storage,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="fewer rounds")
    ap.add_argument("--turns", type=int, default=20, help="turns per run (default 20)")
    ap.add_argument("--rounds", type=int, default=None)
    ap.add_argument("--no-postgres", action="store_true")
    args = ap.parse_args()
    rounds = args.rounds or (5 if args.quick else 15)
    started = time.perf_counter()
    from contextlib import nullcontext

    with workdir() as tmp, nullcontext(None) if args.no_postgres else postgres(tmp) as pg:
        backends = setup_django(tmp, pg)
        from langgraph.version import __version__ as lg_version

        print(
            f"# bench_turn: Python {platform.python_version()}, {os.cpu_count()} CPUs, "
            f"LangGraph {lg_version}; {args.turns} turns a run, {rounds} rounds, medians"
        )
        results = {}
        for label, alias in backends.items():
            results[label] = asyncio.run(bench(label, alias, pg, str(tmp / "bench.sqlite3"), args.turns, rounds))
        ms = lambda s: f"{s * 1000:.2f} ms"  # noqa: E731
        out = []
        for label, r in results.items():
            out.append(
                [
                    label,
                    ms(r["ours"]),
                    ms(r["lg_async"]),
                    ms(r["lg_sync"]),
                    f"{r['vs_lg']:.2f}x",
                    ms(r["floor"]),
                    f"{r['vs_floor']:.2f}x",
                ]
            )
        print()
        print(
            table(
                [
                    "per turn",
                    "aaa_django",
                    "LangGraph async",
                    "LangGraph sync",
                    "aaa / LangGraph",
                    "floor",
                    "aaa / floor",
                ],
                out,
            )
        )
        print()
        out = []
        for label, r in results.items():
            calls = ", ".join(f"{k} {v:.1f}" for k, v in sorted(r["by_method"].items()))
            out.append(
                [
                    label,
                    f"{r['commits']:.2f} x {ms(r['commit'])}",
                    ms(r["memory"]),
                    ms(r["ours_cpu"]),
                    f"{r['calls']:.1f} ({calls})",
                ]
            )
        print(
            table(
                [
                    "aaa_django per turn",
                    "durable commits x raw commit",
                    "engine (memory store)",
                    "process CPU",
                    "store calls",
                ],
                out,
            )
        )
        for label, r in results.items():
            print(
                f"\n{label}: the raw commit after {ms(r['gap'])} of work (the engine's between two "
                f"commits) {ms(r['commit'])}, back to back {ms(r['back_to_back'])}; with back-to-back "
                f"commits the floor would be {ms(r['tight_floor'])}, aaa / that {r['vs_tight_floor']:.2f}x"
            )
        for label, r in results.items():
            if r["before"] is not None:
                print(
                    f"\n{label}: {r['store']} {ms(r['ours'])} per turn; the Django store "
                    f"(a thread hop per call) {ms(r['before'])} in the same rounds "
                    f"({r['ours'] / r['before']:.2f}x)"
                )
        for label, r in results.items():
            if r["unprepared"] is not None:
                print(
                    f"\n{label}: on connections that prepare no statements (OPTIONS "
                    f"prepare_threshold None: as behind a transaction-mode pooler) "
                    f"{ms(r['unprepared'])} per turn in the same rounds, {r['unprepared_vs_lg']:.2f}x "
                    f"LangGraph, {r['unprepared_vs_floor']:.2f}x the floor; the default "
                    f"(prepared: nothing pools these connections) {r['vs_unprepared']:.2f}x that"
                )
        for label, r in results.items():
            print(
                f"\n{label}: each result appended alone (Engine(answers=False): the step on it "
                f"when it is delivered) {ms(r['alone'])} per turn, {r['alone_commits']:.2f} commits, "
                f"CPU {ms(r['alone_cpu'])}; a result with its step's output in one append "
                f"(the default) {r['vs_alone']:.2f}x that in the same rounds"
            )
        for label, r in results.items():
            if r["wal"]:
                print(
                    f"\n{label} WAL per turn (counted by the server): "
                    + ", ".join(f"{side} {b / 1024:.2f} KB" for side, b in r["wal"].items())
                )
        for label, r in results.items():
            if r["storage"]:
                print(
                    f"\n{label} storage per turn at {args.turns} turns: aaa_django "
                    f"{r['storage'][0] / 1024:.2f} KB, LangGraph {r['storage'][1] / 1024:.2f} KB"
                )
        print()
        for label, r in results.items():
            below = r["vs_lg"] < 1
            near = r["vs_floor"] <= 2
            print(
                f"{label}: below LangGraph: {r['vs_lg']:.2f}x ({'met' if below else 'MISSED'}); "
                f"within 2x of the floor: {r['vs_floor']:.2f}x ({'met' if near else 'MISSED'})"
            )
        print(f"# total {time.perf_counter() - started:.0f} s")


if __name__ == "__main__":
    main()
