"""``SelfConsistency``: ask the model the same question ``n`` times in parallel and
answer with the majority.

It decides from the projection :data:`SAMPLES`: the raw replies by sample, and how
many samples failed.
"""

from __future__ import annotations

import re
from collections import Counter

from pydantic import BaseModel, ConfigDict, Field, field_validator

from aaa_django.events import Event, Projection
from aaa_django.runtime import Ctx
from aaa_django.runtime.event_types import LLM_COMPLETED, LLM_FAILED, LLM_REQUESTED

from .base import Algorithm
from .common import QUIET, failure_text, opening, reply_text, tag_index
from .loops import TaskInput


class SamplesState(BaseModel):
    """The samples asked for, their replies and their failures."""

    requested: int = 0
    #: sample index -> the model's reply
    samples: dict[int, str] = Field(default_factory=dict)
    failures: int = 0
    #: sample index -> why it failed
    errors: dict[int, str] = Field(default_factory=dict)

    def __deepcopy__(self, memo: dict | None = None) -> SamplesState:
        new = self.model_copy()
        new.samples = dict(self.samples)
        new.errors = dict(self.errors)
        return new

    @property
    def answered(self) -> int:
        return len(self.samples) + self.failures


def apply(s: SamplesState, e: Event) -> SamplesState:
    t, d = e.type, e.data
    if t not in (LLM_REQUESTED, LLM_COMPLETED, LLM_FAILED):
        return s
    i = tag_index(d.get("tag"), "sample")
    if i is None:
        return s
    if t == LLM_REQUESTED:
        s.requested += 1
    elif t == LLM_COMPLETED:
        s.samples[i] = reply_text(d)
    else:
        s.failures += 1
        s.errors[i] = failure_text(d)
    return s


SAMPLES: Projection[SamplesState] = Projection(
    SamplesState,
    apply,
    name="aaa.algos.ensemble.SAMPLES",
    version=1,
    state_type=SamplesState,
    every=64,
)

SC_SYSTEM = (
    "Think the question through step by step, then give the final answer on its own last line as `Answer: <answer>`."
)
ANSWER_PATTERN = r"(?im)^\s*\**\s*(?:final\s+)?answer\s*\**\s*[:=]\s*\**\s*(.+?)\s*\**\s*$"


def extract_answer(reply: str, pattern: str = ANSWER_PATTERN) -> str:
    """The answer in a reply: the last match of ``pattern`` (its first group), else the
    last non-empty line."""
    matches = re.findall(pattern, reply)
    if matches:
        last = matches[-1]
        return (last[0] if isinstance(last, tuple) else last).strip()
    lines = [line.strip() for line in reply.splitlines() if line.strip()]
    return lines[-1] if lines else ""


def normalise(answer: str) -> str:
    """What two answers must share to count as the same vote."""
    return re.sub(r"\s+", " ", answer).strip().strip("`*\"'").rstrip(".").strip().casefold()


def vote(replies: dict[int, str], pattern: str = ANSWER_PATTERN) -> tuple[str, int, dict[str, int]]:
    """``(winning answer, its votes, votes per normalised answer)``; a tie goes to the
    answer of the lowest-numbered sample (never to arrival order)."""
    answers = [(i, extract_answer(replies[i], pattern)) for i in sorted(replies)]
    tally = Counter(normalise(a) for _, a in answers)
    first: dict[str, str] = {}
    for _, a in answers:
        first.setdefault(normalise(a), a)
    best = max(first, key=lambda k: tally[k])  # max keeps the first of equals
    return first[best], tally[best], dict(tally)


class SelfConsistencyConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    #: samples asked for, all at once
    n: int = Field(default=5, ge=1, le=64)
    #: the sampling temperature (None: the provider's default)
    temperature: float | None = Field(default=0.7, ge=0)
    system: str | None = SC_SYSTEM
    model: str | None = None
    #: how an answer is found in a reply (its first group); else the last line
    answer_pattern: str = ANSWER_PATTERN
    #: votes the winner needs; fewer: ``no_solution``
    min_votes: int = Field(default=1, ge=1)

    @field_validator("answer_pattern")
    @classmethod
    def _compiles(cls, value: str) -> str:
        try:
            re.compile(value)
        except re.error as exc:
            raise ValueError(f"answer_pattern is not a regular expression: {exc}") from None
        return value


class SelfConsistency(Algorithm):
    """Sample ``n`` answers in parallel (each on its own conversation thread) and vote.

    ``success`` with the most frequent answer (value ``{"answer", "votes", "samples",
    "failures", "tally"}``); samples that fail are left out of the vote; ``failed``
    when every sample fails (``{"reason": "all_samples_failed", "failures", "errors"}``);
    ``no_solution`` when the winner has fewer than ``min_votes`` votes.
    """

    projections = (SAMPLES,)

    name = "aaa.algos.SelfConsistency"
    ignores = QUIET
    Input = TaskInput
    Config = SelfConsistencyConfig
    cfg: SelfConsistencyConfig

    async def step(self, ctx: Ctx, event: Event) -> None:
        s = await ctx.project(SAMPLES)
        cfg = self.cfg
        if s.requested == 0:
            messages = opening(cfg.system, ctx.input.task)
            params = {"temperature": cfg.temperature} if cfg.temperature is not None else None
            for i in range(cfg.n):
                ctx.llm(
                    messages, tag=f"sample-{i}", key=("sample", i), thread=f"sample-{i}", model=cfg.model, params=params
                )
        elif s.answered < cfg.n:
            return  # samples still out
        elif not s.samples:
            ctx.complete(
                "failed",
                {
                    "reason": "all_samples_failed",
                    "failures": s.failures,
                    "errors": [s.errors[i] for i in sorted(s.errors)],
                },
            )
        else:
            answer, votes, tally = vote(s.samples, cfg.answer_pattern)
            value: dict[str, object] = {
                "answer": answer,
                "votes": votes,
                "samples": len(s.samples),
                "failures": s.failures,
                "tally": tally,
            }
            if votes < cfg.min_votes:
                ctx.complete("no_solution", {"reason": "no_majority", "min_votes": cfg.min_votes, **value})
            else:
                ctx.complete("success", value)
