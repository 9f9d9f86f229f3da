"""The field test: the example site (project/) run as it is deployed, under load, while
its infrastructure fails (tests/field/site.py starts it).

PostgreSQL and Redis of the test's own (so they can be restarted), the site's web
server (gunicorn, two worker processes), two Celery workers (``celery -A project
worker``, as the README says), S3 for blobs, and a small OpenAI-compatible model
server with latency (tests/field/model_server.py) that asks for two tool calls at
once, then answers with a fingerprint of the task.

It starts 30 runs at once over the REST API, with inputs from 1 KB to 1 MB, as a client
does (an ``Idempotency-Key`` per run, so a request answered 503 is sent again and names
the same run). While they run it restarts PostgreSQL, restarts Redis (no persistence:
what was queued is lost) and SIGKILLs a worker and its children (its supervisor starts
another). The model server holds every call until the faults have struck, so each
strikes runs in flight whatever the machine's pace (unheld, the small runs ended before
the big ones had started, and on a quick start every run had ended before the worker
was killed): calls waiting in a worker's loop, messages queued in Redis, a run's
appends. The site's sweep looks for stalled runs every few seconds
(``AAA_STALL_AFTER``, see :data:`STALL_AFTER`). Then, with no one touching anything:

- every run ends with its right outcome: ``success``, with the answer the model gives
  for that very input;
- nothing is lost or duplicated: each run's log has dense seqs, unique ids, one
  ``aaa.run.completed`` (the last event) and one result per model or tool request;
- the web server answered nothing but 2xx and, during an outage, 503 with
  ``Retry-After``.
"""

from __future__ import annotations

import random
import string
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from aaa_django.runtime.event_types import (
    LLM_COMPLETED,
    LLM_FAILED,
    LLM_REQUESTED,
    RUN_COMPLETED,
    TOOL_COMPLETED,
    TOOL_FAILED,
    TOOL_REQUESTED,
    result_id,
)

from .model_server import answer
from .site import Site

pytestmark = [pytest.mark.slow]

RUNS = 30
#: input sizes from 1 KB to 1 MB (a body, JSON and all, under the API's 1 MiB limit)
SIZES = [round(1000 * 1000 ** (i / (RUNS - 1))) for i in range(RUNS)]
#: what project/api_demo.py's lookup_population says of Lyon and Porto
POPULATIONS = [522_250, 231_800]
TOOLS = [
    {
        "name": "lookup_population",
        "description": "The population of a city.",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    }
]
#: the site's AAA["STALL_AFTER"]: a run whose messages the Redis restart or the SIGKILL
#: lost is re-driven by the workers' sweep (every STALL_AFTER / 2 s) once it has had no
#: new event for this long. The default, 60 s, would re-drive it 60 to 90 s after its
#: last event: most of DEADLINE.
STALL_AFTER = 15
#: seconds for every run to end once the last fault has struck and the model answers
#: again (recovery included): it only catches a run that never ends (every run does
#: all its work in that time; on a loaded 2-core machine it took most of a minute)
DEADLINE = 180


def task_text(i: int, size: int) -> str:
    rng = random.Random(i)
    return "".join(rng.choices(string.ascii_letters + " ", k=size))


@pytest.mark.campaign
def test_the_site_under_load_survives_its_infrastructure_failing(tmp_path, s3_endpoint):
    tasks = [task_text(i, size) for i, size in enumerate(SIZES)]
    started: dict[int, str] = {}
    with Site(
        tmp_path, s3_endpoint, bus="celery", workers=2, model=True, web_workers=2, stall_after=STALL_AFTER
    ) as site:
        client = site.client

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
                headers={"Idempotency-Key": f"field-run-{i}"},
            )
            assert status in (200, 201), (status, body)
            started[i] = body["id"]

        def unfinished() -> int:
            return sum(client.call("GET", f"/runs?status={s}&limit=1")[1]["count"] for s in ("pending", "running"))

        t0 = time.monotonic()
        hit: dict[str, int] = {}  # runs in flight when each fault struck
        site.hold_model()  # no run ends before the faults have struck
        with ThreadPoolExecutor(RUNS) as pool:
            futures = [pool.submit(start, i) for i in range(RUNS)]
            # A third of the runs started, the rest starting: break things under them
            # (a start answered 503 meanwhile is sent again).
            until(lambda: len(started) >= RUNS // 3, timeout=DEADLINE)
            hit["postgres"] = unfinished()
            site.pg.restart()
            for f in futures:
                f.result()
        hit["redis"] = unfinished()
        site.redis.restart()  # what was queued is lost
        hit["worker"] = unfinished()
        site.workers[0].kill()  # with its deliveries in hand
        site.start_worker()  # its supervisor starts another
        site.hold_model(False)
        struck = time.monotonic()
        print(f"\n{RUNS} runs started, faults struck: {struck - t0:.1f} s; in flight: {hit}")

        ended: dict[int, dict] = {}
        while len(ended) < RUNS:
            for i, run_id in started.items():
                if i not in ended:
                    status, run = client.call("GET", f"/runs/{run_id}")
                    assert status == 200, run
                    if run["status"] == "completed":
                        ended[i] = run
            if len(ended) < RUNS:
                stuck = sorted(started[i] for i in started if i not in ended)
                assert time.monotonic() - struck < DEADLINE, f"{len(stuck)} runs never ended: {stuck}\n{site.logs()}"
                time.sleep(0.5)
        print(f"every run ended {time.monotonic() - struck:.1f} s after the last fault")
        logs = {i: events(client, run_id) for i, run_id in started.items()}

    assert all(hit.values()), f"a fault struck no run in flight: {hit}"
    wrong = {
        started[i]: (r["outcome"], str(r["value"])[:300])
        for i, r in ended.items()
        if (r["outcome"], r["value"]) != ("success", {"text": answer(tasks[i], POPULATIONS)})
    }
    assert wrong == {}, "runs that ended otherwise than with their right answer"
    for i, log in logs.items():
        check_log(started[i], log)
    assert client.bad_answers() == [], "answers that are neither 2xx nor a 503 with Retry-After"


def until(check, timeout: float = 60) -> None:
    end = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < end, "condition not met in time"
        time.sleep(0.05)


def events(client, run_id: str) -> list[dict]:
    out, after = [], 0
    while True:
        status, page = client.call("GET", f"/runs/{run_id}/events?after={after}&limit=1000")
        assert status == 200, page
        out += page["items"]
        if not page["has_more"]:
            return out
        after = page["next_after"]


def check_log(run_id: str, log: list[dict]) -> None:
    """Dense seqs, unique ids, one completion (the last event), one result per request."""
    types = [e["type"] for e in log]
    assert [e["seq"] for e in log] == list(range(1, len(log) + 1)), (run_id, types)
    assert len({e["id"] for e in log}) == len(log), (run_id, types)
    assert types.count(RUN_COMPLETED) == 1 and types[-1] == RUN_COMPLETED, (run_id, types)
    requests = [e["id"] for e in log if e["type"] in (LLM_REQUESTED, TOOL_REQUESTED)]
    results = [e["id"] for e in log if e["type"] in (LLM_COMPLETED, LLM_FAILED, TOOL_COMPLETED, TOOL_FAILED)]
    assert sorted(results) == sorted(result_id(r) for r in requests), (run_id, types)
