"""The committed golden logs (one run's events as JSON lines, recorded with the fake
model and a fixed run id, so every id in them is deterministic), and their replay
through the current code by the package's harness (:mod:`aaa_django.runtime.replay`,
which ``manage.py aaa_replay`` runs on exported production runs too).

Golden lines are normalised: no event times, no tracebacks (they name files on the
recording machine).
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any, Iterable

import aaa_django.algos  # noqa: F401  (registers the built-in algorithms)
from aaa_django.events import Event
from aaa_django.runtime.event_types import LLM_ATTEMPTED
from aaa_django.runtime.replay import FED, Replay, ReplayBus, decision, replay

__all__ = ["FED", "Replay", "ReplayBus", "decision", "dump", "load", "normalise", "path_of", "replay", "replay_file"]

HERE = Path(__file__).resolve().parent


def path_of(name: str) -> Path:
    return HERE / f"{name}.jsonl"


def normalise(e: Event) -> dict[str, Any]:
    """An event as a golden line: no time, no traceback, no model attempt's maker
    (machine-specific)."""
    d = e.to_dict()
    d.pop("time", None)
    d["data"] = {k: v for k, v in d["data"].items() if k != "traceback" and not (k == "by" and e.type == LLM_ATTEMPTED)}
    if not d["blobs"]:
        d.pop("blobs")
    return d


def dump(events: Iterable[Event]) -> str:
    return "".join(json.dumps(normalise(e), ensure_ascii=False, sort_keys=True) + "\n" for e in events)


def load(name: str) -> list[Event]:
    lines = path_of(name).read_text(encoding="utf-8").splitlines()
    return [Event.from_dict(json.loads(line)) for line in lines if line.strip()]


def replay_file(name: str) -> Replay:
    return asyncio.run(replay(load(name)))
