"""Every model attempt is on the log, and paid once unless the log says otherwise: the
example site (project/) on the Celery bus, started as it is deployed (tests/field/site.py),
against a model server that counts the calls it receives (``GET /calls``: each call's
task and turn, tests/field/model_server.py). A killed worker's runs are adopted by the
next one (its process is known gone) and re-driven; what is asserted is what the site
decided, never how long it took.

- A worker SIGKILLed with every run's first model call in flight (the model holds its
  answers): a new worker takes the runs over, records each call abandoned, and asks
  again; every run ends with its right answer, and for each run and each turn the
  attempts on its log are the calls the model server received. Runs started after,
  with nothing broken, have one attempt a call, one call received.
- A worker killed on every attempt of one call (a crash loop): after three abandoned
  attempts the run ends ``failed``, the three calls received are the three attempts on
  its log, and its spend counts them at their estimates.
"""

from __future__ import annotations

from collections import Counter

import pytest

from .model_server import answer
from .site import Site
from .test_field import POPULATIONS, TOOLS, check_log, events, until

pytestmark = [pytest.mark.slow]

#: seconds for something the site does by itself to happen: it only catches one that
#: never does (a loaded 2-core machine has needed most of a minute for a worker to start)
PATIENCE = 240
CONFIG = {"tools": TOOLS, "max_turns": 4}


def task(i: int) -> str:
    return f"Field run {i}: how many people live in Lyon and Porto together?"


def start(site: Site, numbers: list[int]) -> dict[int, str]:
    """Start a run of each task numbered; run number -> its id (each batch its own
    idempotency keys: the site keys a start by the batch's key and its index in it)."""
    return dict(zip(numbers, site.start_runs([task(i) for i in numbers], CONFIG, f"attempts-{numbers[0]}")))


def received(site: Site) -> Counter:
    """The calls the model server received, by (task, turn): 1 before any tool result,
    2 after the lookups."""
    return Counter((c["task"], c["turn"]) for c in site.model_calls())


def attempts_by_turn(log: list[dict]) -> dict[int, list[int]]:
    """The attempt numbers on a run's log for each of its model calls, by the turn the
    model server counts it under (1: the first call; 2: after the two lookups)."""
    requests = [e["id"] for e in log if e["type"] == "aaa.llm.requested"]
    turns = {rid: 1 if i == 0 else 2 for i, rid in enumerate(requests)}
    out: dict[int, list[int]] = {turns[rid]: [] for rid in requests}
    for e in log:
        if e["type"] == "aaa.llm.attempted":
            out[turns[e["data"]["request_id"]]].append(e["data"]["attempt"])
    return out


def kill_and_replace(site: Site) -> None:
    """SIGKILL the site's worker and everything under it; its supervisor starts another."""
    site.workers[-1].kill()
    site.wait_ready(site.start_worker())


def test_a_killed_workers_calls_are_abandoned_asked_again_and_each_attempt_is_a_call_received(tmp_path, s3_endpoint):
    struck = list(range(6))
    later = list(range(6, 9))
    with Site(tmp_path, s3_endpoint, bus="celery", workers=1, model=True, model_latency=(0.05, 0.1)) as site:
        site.hold_model()
        runs = start(site, struck)
        # every run's first call is in flight: received by the model, which holds it
        until(lambda: len(site.model_calls()) == len(struck), timeout=PATIENCE)
        kill_and_replace(site)
        site.hold_model(False)
        outcomes = site.until_ended(list(runs.values()), PATIENCE)
        # nothing broken from here on: the normal case
        runs.update(start(site, later))
        outcomes.update(site.until_ended([runs[i] for i in later], PATIENCE))
        logs = {i: events(site.client, run_id) for i, run_id in runs.items()}
        calls = received(site)
    print(
        f"\n{len(runs)} runs: {sum(calls.values())} calls received, "
        f"{sum(e['type'] == 'aaa.llm.attempted' for log in logs.values() for e in log)} attempts on the logs, "
        f"{sum(e['type'] == 'aaa.llm.abandoned' for log in logs.values() for e in log)} abandoned"
    )

    wrong = {
        runs[i]: (outcomes[runs[i]]["outcome"], outcomes[runs[i]]["value"])
        for i in runs
        if (outcomes[runs[i]]["outcome"], outcomes[runs[i]]["value"])
        != ("success", {"text": answer(task(i), POPULATIONS)})
    }
    assert wrong == {}
    for i, log in logs.items():
        check_log(runs[i], log)
        attempts = attempts_by_turn(log)
        # the calls the model server received, for this run, turn by turn, are its attempts
        assert {turn: len(numbers) for turn, numbers in attempts.items()} == {
            turn: calls[task(i), turn] for turn in attempts
        }, (runs[i], attempts)
        abandoned = [e["data"]["attempt"] for e in log if e["type"] == "aaa.llm.abandoned"]
        if i in struck:  # its first call died with the worker: abandoned once, asked again
            assert attempts == {1: [1, 2], 2: [1]} and abandoned == [1], (runs[i], attempts, abandoned)
            spend = outcomes[runs[i]]["spend"]
            estimate = next(e["data"]["estimate"] for e in log if e["type"] == "aaa.llm.attempted")
            replies = [e["data"] for e in log if e["type"] == "aaa.llm.completed"]
            assert spend["tokens_out"] == estimate["usage"]["output_tokens"] + sum(
                r["usage"]["output_tokens"] for r in replies
            )
        else:  # untouched: one attempt a call
            assert attempts == {1: [1], 2: [1]} and abandoned == [], (runs[i], attempts, abandoned)


def test_a_worker_killed_on_every_attempt_of_a_call_ends_the_run_failed_after_three(tmp_path, s3_endpoint):
    with Site(tmp_path, s3_endpoint, bus="celery", workers=1, model=True, model_latency=(0.05, 0.1)) as site:
        site.hold_model()  # no attempt ever comes back
        (run_id,) = start(site, [0]).values()
        for n in (1, 2, 3):
            until(lambda n=n: len(site.model_calls()) == n, timeout=PATIENCE)
            kill_and_replace(site)  # with the attempt in flight
        (run,) = site.until_ended([run_id], PATIENCE).values()
        log = events(site.client, run_id)
        calls = received(site)
        site.hold_model(False)
    print(
        f"\ncrash loop: {sum(calls.values())} calls received, "
        f"{sum(e['type'] == 'aaa.llm.attempted' for e in log)} attempts on the log, "
        f"{sum(e['type'] == 'aaa.llm.abandoned' for e in log)} abandoned; outcome {run['outcome']}"
    )

    assert (run["outcome"], run["value"]["reason"], run["value"]["abandoned"]) == ("failed", "abandoned_attempts", 3), (
        run["value"]
    )
    check_log(run_id, log)
    assert attempts_by_turn(log) == {1: [1, 2, 3]}
    assert calls == {(task(0), 1): 3}
    assert [e["data"]["attempt"] for e in log if e["type"] == "aaa.llm.abandoned"] == [1, 2, 3]
    types = [e["type"] for e in log]
    assert types[-2:] == ["aaa.llm.failed", "aaa.run.completed"]
    assert log[-2]["data"]["reason"] == "abandoned" and log[-2]["data"]["cut_off"] is True
    # the spend counts the three attempts at their estimates (the prompt, the reply's limit)
    estimates = [e["data"]["estimate"]["usage"] for e in log if e["type"] == "aaa.llm.attempted"]
    assert run["spend"]["tokens_out"] == sum(u["output_tokens"] for u in estimates) > 0
    assert run["spend"]["tokens_in"] == sum(u["input_tokens"] for u in estimates) > 0
    assert run["spend"]["model_calls"] == 1  # one call asked for, three times
