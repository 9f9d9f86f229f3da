"""The example site as it is deployed, under a load of runs that wait on a model, tried
as a user would: what the suite's in-process figures do not show.

    .venv/bin/python benchmarks/field_trial.py              # 200 runs (~1 min)
    .venv/bin/python benchmarks/field_trial.py --kill       # SIGKILL the worker mid-flight
    .venv/bin/python benchmarks/field_trial.py --runs 50 --tries 5
    .venv/bin/python benchmarks/field_trial.py --bus inprocess  # the embedded default
    .venv/bin/python benchmarks/field_trial.py --cancel         # cancel every other run, 1.5 s in
    .venv/bin/python benchmarks/field_trial.py --gc python      # Python's own collector (project/collector.py)

It starts what tests/field/site.py starts: a PostgreSQL cluster and a Redis server of
its own, S3 (moto), the site's web server (gunicorn, two processes), one Celery worker
started the usual way (``celery -A project worker -c 2``) and the field test's model
server, here with 1 s a call (it asks for two tool calls at once, then answers). It
starts the runs over the REST API at once (50 client threads), waits for their ends
over the API, then reads every run's log: each must end ``success`` with the answer
for its input, its seqs dense, one ``aaa.run.completed``, one result per request. It
prints the wall time against the ideal (two model calls: 2 s), where the runs' time
went (stretch by stretch, from their logs), and how many runs the workers' sweep
re-drove: with nothing broken, none should be (a re-driven run waited for the sweep,
``AAA_STALL_AFTER`` = 15 s here, for a step it had lost). ``--kill``: 2 s in, the
worker is SIGKILLed with its deliveries in hand and started again; every run must
still end ``success``, nothing lost or duplicated. ``--cancel``: 1.5 s after the last
start, every other run is cancelled over the API (a 409 for one that has ended); each
ends ``cancelled`` (its log whole, nothing after its end) or, ended before, ``success``;
the time from the cancel asked for to the run's end is printed. The CPU of the
serving processes is printed in all and split between the web server's and the
workers'. ``AAA_TRIAL_PYSPY=FILE``: py-spy samples the web server's processes and the
first worker's (with their children) to ``FILE.web`` and ``FILE.worker``.
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import re
import subprocess
import sys
import tempfile
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
os.chdir(ROOT)

from aaa_django.runtime.event_types import LLM_FAILED, TOOL_FAILED  # noqa: E402
from tests.field.model_server import answer  # noqa: E402
from tests.field.services import free_port, wait_port  # noqa: E402
from tests.field.site import Site  # noqa: E402
from tests.field.test_field import POPULATIONS, TOOLS, check_log, events  # noqa: E402

LATENCY = 1.0
IDEAL = 2 * LATENCY  # two model calls a run (the tools answer at once)


def patient(client) -> None:
    """The client waits out the API's rate limit (a 429 says how long), as a user's
    program would: this trial reads every run's log."""
    call = client.call

    def again(*args, **kwargs):
        while True:
            status, body = call(*args, **kwargs)
            if status != 429:
                return status, body
            time.sleep(2)

    client.call = again


def check_cancelled(run_id: str, log: list[dict]) -> None:
    """A cancelled run's log: dense seqs, unique ids, one end (the last event), nothing
    after it, and no result without its request (a call the end cut short has none)."""
    from aaa_django.runtime.event_types import RUN_COMPLETED, result_id

    types = [e["type"] for e in log]
    assert [e["seq"] for e in log] == list(range(1, len(log) + 1)), (run_id, types)
    assert len({e["id"] for e in log}) == len(log), (run_id, types)
    assert types.count(RUN_COMPLETED) == 1 and types[-1] == RUN_COMPLETED, (run_id, types)
    ids = {e["id"] for e in log}
    results = [
        e for e in log if e["type"] in ("aaa.llm.completed", "aaa.llm.failed", "aaa.tool.completed", "aaa.tool.failed")
    ]
    assert all(any(result_id(i) == r["id"] for i in ids) for r in results), (run_id, types)


def cpu_seconds(pids: list[int]) -> float:
    """User + system CPU of the processes ``pids`` and their children, so far."""
    out = subprocess.run(["ps", "-o", "pid=", "--ppid", ",".join(map(str, pids))], capture_output=True, text=True)
    every = pids + [int(p) for p in out.stdout.split()]
    total = 0
    for pid in every:
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += int(fields[11]) + int(fields[12])  # utime, stime (clock ticks)
    return total / os.sysconf("SC_CLK_TCK")


def _at(event: dict) -> float:
    return dt.datetime.fromisoformat(event["time"].replace("Z", "+00:00")).timestamp()


def stretches(logs: dict[str, list[dict]]) -> dict[str, list[float]]:
    out: dict[str, list[float]] = {}
    for log in logs.values():
        times = [(e["type"], dt.datetime.fromisoformat(e["time"].replace("Z", "+00:00")).timestamp()) for e in log]
        for (a, ta), (b, tb) in zip(times, times[1:]):
            out.setdefault(f"{a} -> {b}", []).append(tb - ta)
    return out


def trial(
    tmp: Path, s3: str, runs: int, kill: bool, bus: str = "celery", cancel: bool = False, gc: str | None = None
) -> dict:
    with Site(
        tmp,
        s3,
        bus=bus,
        workers=1 if bus == "celery" else 0,
        model=True,
        web_workers=2,
        stall_after=15,
        model_latency=(LATENCY, LATENCY),
        env={"AAA_GC_THRESHOLD": gc} if gc else None,
    ) as site:
        client = site.client
        patient(client)
        tasks = [f"trial {i} " + "x" * 2000 for i in range(runs)]
        started: dict[int, str] = {}

        def start(i: int) -> None:
            status, body = client.call(
                "POST",
                "/runs",
                {
                    "algorithm": "aaa.algos.ToolLoop",
                    "input": {"task": tasks[i]},
                    "config": {"tools": TOOLS, "max_turns": 4},
                    "deadline": 600,
                },
                headers={"Idempotency-Key": f"trial-{i}"},
            )
            assert status in (200, 201), (status, body)
            started[i] = body["id"]

        def serving(role: str = "") -> list[int]:
            """The web server's processes ("web"), the workers' ("worker"), or both."""
            return [
                p.proc.pid
                for name, p in site.procs.items()
                if (name == "web" or name.startswith("worker")) and name.startswith(role)
            ]

        spies = []
        if os.environ.get("AAA_TRIAL_PYSPY"):
            # sampled profiles of the web server's processes and of the worker's (and
            # their children), to FILE.web and FILE.worker (py-spy's raw format)
            for role, proc in [("web", site.procs["web"].proc)] + [("worker", w.proc) for w in site.workers[:1]]:
                spies.append(
                    subprocess.Popen(
                        [
                            str(ROOT / ".venv-bench/bin/py-spy"),
                            "record",
                            "--subprocesses",
                            "--nonblocking",
                            "-f",
                            "raw",
                            "-o",
                            f"{os.environ['AAA_TRIAL_PYSPY']}.{role}",
                            "-r",
                            "200",
                            "-p",
                            str(proc.pid),
                        ],
                        stdout=subprocess.DEVNULL,
                        stderr=subprocess.DEVNULL,
                    )
                )
            time.sleep(1)
        cpu0 = cpu_seconds(serving())
        web0 = cpu_seconds(serving("web"))
        t0 = time.monotonic()
        with ThreadPoolExecutor(50) as pool:
            list(pool.map(start, range(runs)))
        api = time.monotonic() - t0
        if kill:
            time.sleep(2.0)
            site.workers[0].kill()
            site.start_worker()
        cancelled: dict[str, float] = {}  # run id -> when its cancel was asked for
        if cancel:  # every other run, 1.5 s in: in the middle of its first model call or after
            time.sleep(1.5)

            def stop(i: int) -> None:
                asked = time.time()
                status, body = client.call("POST", f"/runs/{started[i]}/cancel", {"reason": "trial"})
                assert status in (202, 409), (status, body)
                cancelled[started[i]] = asked

            with ThreadPoolExecutor(20) as pool:
                list(pool.map(stop, range(0, runs, 2)))
        while client.call("GET", "/runs?status=completed&limit=1")[1]["count"] < runs:
            assert time.monotonic() - t0 < 600, f"runs not ended after 600 s\n{site.logs()}"
            time.sleep(0.2)
        wall = time.monotonic() - t0
        cpu = cpu_seconds(serving()) - cpu0
        web = cpu_seconds(serving("web")) - web0  # (a worker restarted by --kill: its CPU from its start)
        for spy in spies:
            spy.send_signal(2)
            spy.wait()
        logs = {run_id: events(client, run_id) for run_id in started.values()}
        wrong = []
        why: Counter[str] = Counter()
        stopped: list[float] = []  # seconds from a cancel asked for to the run's end
        for i, run_id in started.items():
            run = client.call("GET", f"/runs/{run_id}")[1]
            if run_id in cancelled and run["outcome"] == "cancelled":
                check_cancelled(run_id, logs[run_id])
                end = logs[run_id][-1]["time"]
                stopped.append(dt.datetime.fromisoformat(end.replace("Z", "+00:00")).timestamp() - cancelled[run_id])
                continue
            if (run["outcome"], run["value"]) != ("success", {"text": answer(tasks[i], POPULATIONS)}):
                wrong.append(run_id)
                # why, as the log says it: the failures of its calls, else its outcome
                failures = [
                    f"{e['type']}: {e['data'].get('reason')}: {e['data'].get('error', '')[:160]}"
                    for e in logs[run_id]
                    if e["type"] in (LLM_FAILED, TOOL_FAILED)
                ]
                why.update(failures or [f"outcome {run['outcome']}"])
            check_log(run_id, logs[run_id])
        redriven = {
            run_id
            for w in site.workers
            for line in re.findall(r"re-driving \d+ stalled runs.*", w.text())
            for run_id in re.findall(r"run-[0-9a-f-]{36}", line)
        }
        lacked = sum(w.text().count("lacked it; reading the run again") for w in site.workers)
        # what an operator reading the logs would see: errors and warnings, by message
        said: Counter[str] = Counter()
        for name, p in site.procs.items():
            for line in p.text().splitlines():
                found = re.search(r"(WARNING|ERROR|CRITICAL)(/[^\]]*)?\] (.*)", line)
                if found:
                    said[f"{name}: {found.group(1)} {re.sub(r'run-[0-9a-f-]{36}', 'run-…', found.group(3))[:140]}"] += 1

        # the run that took longest, as its log and the processes' logs tell it
        def took(log: list[dict]) -> float:
            return _at(log[-1]) - _at(log[0])

        slowest = max(logs, key=lambda r: took(logs[r]))
        told = [
            f"{name}: {line.strip()[:200]}"
            for name, p in site.procs.items()
            for line in p.text().splitlines()
            if slowest in line
        ]
        return {
            "slowest": (
                slowest,
                took(logs[slowest]),
                [(e["type"], _at(e) - _at(logs[slowest][0])) for e in logs[slowest]],
                told,
            ),
            "api": api,
            "wall": wall,
            "cpu": cpu,
            "web": web,
            "wrong": wrong,
            "why": why,
            "stopped": sorted(stopped),
            "lacked": lacked,
            "stretches": stretches(logs),
            "redriven": len(redriven),
            "said": said,
        }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--runs", type=int, default=200)
    ap.add_argument("--tries", type=int, default=1)
    ap.add_argument("--kill", action="store_true")
    ap.add_argument(
        "--slowest", action="store_true", help="print the slowest run's log and what the processes logged of it"
    )
    ap.add_argument("--cancel", action="store_true", help="cancel every other run over the API, 1.5 s in")
    ap.add_argument(
        "--bus",
        choices=["celery", "inprocess"],
        default="celery",
        help="inprocess: the embedded default (the runs run in the web processes)",
    )
    ap.add_argument(
        "--gc",
        help="AAA_GC_THRESHOLD of the site's processes (project/collector.py): G0,G1,G2, or python "
        "(Python's own); default: the site's",
    )
    args = ap.parse_args()
    port = free_port()
    with tempfile.TemporaryDirectory(prefix="aaa-trial-") as tmp:
        moto = subprocess.Popen(
            [str(ROOT / ".venv/bin/moto_server"), "-H", "127.0.0.1", "-p", str(port)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        try:
            wait_port(port, proc=moto)
            for n in range(args.tries):
                (Path(tmp) / f"try{n}").mkdir()
                out = trial(
                    Path(tmp) / f"try{n}",
                    f"http://127.0.0.1:{port}",
                    args.runs,
                    args.kill,
                    args.bus,
                    args.cancel,
                    args.gc,
                )
                print(
                    f"try {n + 1}: {args.runs} runs started over the API in {out['api']:.1f} s; all ended "
                    f"{out['wall']:.1f} s after the first start ({out['wall'] / IDEAL:.1f}x the ideal "
                    f"{IDEAL:.0f} s{', the worker SIGKILLed 2 s in' if args.kill else ''}); the web and worker "
                    f"processes' CPU {out['cpu']:.1f} s ({1000 * out['cpu'] / args.runs:.0f} ms a run: the web's "
                    f"{1000 * out['web'] / args.runs:.0f}, the workers' {1000 * (out['cpu'] - out['web']) / args.runs:.0f}); wrong outcomes "
                    f"{len(out['wrong'])}; runs the sweep re-drove {out['redriven']}; deliveries whose view lacked "
                    f"their event {out['lacked']}"
                )
                if args.cancel:
                    st = out["stopped"]
                    print(
                        f"    cancelled over the API: {len(st)} runs ended cancelled; from the cancel asked "
                        f"to the run's end p50 {1000 * st[len(st) // 2]:.0f} ms, p90 "
                        f"{1000 * st[int(len(st) * 0.9)]:.0f} ms, max {1000 * st[-1]:.0f} ms"
                        if st
                        else "    no run ended cancelled"
                    )
                print(
                    f"    the processes' logs: {sum(out['said'].values())} warnings and errors"
                    + "".join(f"\n      {n:5d} x {line}" for line, n in out["said"].most_common(8))
                )
                for name, values in out["stretches"].items():
                    values.sort()
                    print(
                        f"    {name:52s} p50 {1000 * values[len(values) // 2]:8.1f} ms  "
                        f"p90 {1000 * values[int(len(values) * 0.9)]:8.1f} ms  max {1000 * values[-1]:8.1f} ms"
                    )
                if args.slowest:
                    run_id, took, timeline, told = out["slowest"]
                    print(
                        f"    the slowest run, {run_id}, {took:.1f} s:"
                        + "".join(f"\n      {at:7.2f} s {kind}" for kind, at in timeline)
                        + "".join(f"\n      {line}" for line in told[:20])
                    )
                if out["wrong"]:
                    print(
                        f"    why the {len(out['wrong'])} wrong outcomes ended so:"
                        + "".join(f"\n      {n:5d} x {line}" for line, n in out["why"].most_common(8))
                    )
                assert not out["wrong"], out["wrong"][:10]
        finally:
            moto.terminate()
            moto.wait()


if __name__ == "__main__":
    main()
