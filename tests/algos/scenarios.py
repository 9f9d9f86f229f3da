"""Every built-in algorithm taken to each outcome it can reach, with the fake model.

A scenario is ``async (duplicate, *, cache=None, store=None) -> Result``: the same run
on a normal bus or one that delivers every event twice, optionally with another fold
holder (fold counts) or store (crash and resume). Run ids are fixed, so two runs of a
scenario can be compared id for id, and the golden logs (``tests/golden/``) are
recordings of the scenarios in :data:`GOLDEN`.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any, Awaitable, Callable, Iterable

from aaa_django.algos import (
    FSM,
    GenerateTestRepair,
    GeneratorCritic,
    PlanAndExecute,
    ReAct,
    SelfConsistency,
    ToolLoop,
    WorkflowGraph,
)
from aaa_django.llm.fake import text, tool_call, tool_calls
from aaa_django.runtime import Budget
from aaa_django.tools import ToolRegistry, tool
from tests.runtime.helpers import make_engine, tool_messages
from tests.runtime.scenarios import Result, finish

RUN = "run-algos"

Scenario = Callable[..., Awaitable[Result]]


@dataclass
class Case:
    """A scenario: start ``build()`` on ``input`` with ``model`` and ``tools``; ``act``
    (if given) does something to the running run."""

    build: Callable[[], Any]
    input: Any
    model: Callable | None
    tools: list[Any]
    act: Callable[[Any, dict], Awaitable[None]] | None = None
    start: dict[str, Any] = field(default_factory=dict)

    def engine(self, *, duplicate: bool = False, store: Any = None):
        registry = ToolRegistry(self.tools) if self.tools else None
        return make_engine(self.model, registry, duplicate=duplicate, store=store)

    async def __call__(self, duplicate: bool = False, *, cache: Any = None, store: Any = None) -> Result:
        async with self.engine(duplicate=duplicate, store=store) as engine:
            if cache is not None:
                engine.cache = cache
            seen: dict = {}
            r = await engine.start(self.build(), self.input, run_id=RUN, **self.start)
            if self.act is not None:
                await self.act(r, seen)
            result = await finish(engine, [RUN], seen)
            children = sorted({e.data["child"] for e in result.log if e.type == "aaa.child.requested"})
            for child in children:
                result.seen.setdefault("children", {})[child] = await engine.outcome(child)
            return result


def scenario(
    build: Callable[[], Any],
    input: Any,
    model: Callable | None,
    tools: Iterable[Any] = (),
    *,
    act: Callable[[Any, dict], Awaitable[None]] | None = None,
    **start: Any,
) -> Case:
    return Case(build, input, model, list(tools), act, start)


def tagged(request) -> tuple[str, int]:
    """``("generate", 2)`` of the tag ``generate-2``."""
    kind, _, n = (request.tag or "").rpartition("-")
    return kind, int(n) if n.isdigit() else 0


def last_user(request) -> str:
    return next(m.content for m in reversed(request.messages) if m.role == "user") or ""


def down(request):
    raise ConnectionError("the provider is down")


# == GenerateTestRepair ======================================================================

WRONG = "```python\ndef add(a, b):\n    return a - b\n```"
RIGHT = "Here it is:\n\n```python\ndef add(a, b):\n    return a + b\n```\n"
BROKEN = "```python\ndef add(a, b)\n    return a + b\n```"


@tool(inline=True)
def run_tests(candidate: str) -> dict:
    """Runs the tests of ``add(a, b)`` on a candidate (raises if it does not load).

    Args:
        candidate: Python source defining add(a, b)
    """
    namespace: dict = {}
    exec(compile(candidate, "<candidate>", "exec"), namespace)  # a test tool does this
    got = namespace["add"](2, 3)
    return {"passed": got == 5, "feedback": f"add(2, 3) returned {got}, expected 5"}


def writes(*replies: str):
    """A generator model: reply ``replies[N-1]`` to ``generate-N`` (the last one after)."""

    def model(request):
        _, n = tagged(request)
        return text(replies[min(n, len(replies)) - 1])

    return model


def gtr(**config):
    return lambda: GenerateTestRepair(test_tool=run_tests, **config)


ADD = {"task": "Write add(a, b) in Python."}

gtr_repaired = scenario(gtr(), ADD, writes(WRONG, RIGHT), [run_tests])
gtr_broken_then_fixed = scenario(gtr(), ADD, writes(BROKEN, RIGHT), [run_tests])
gtr_no_solution = scenario(gtr(max_repairs=2), ADD, writes(WRONG), [run_tests])
gtr_model_down = scenario(gtr(), ADD, down, [run_tests])
gtr_no_test_tool = scenario(lambda: GenerateTestRepair(test_tool="missing"), ADD, writes(RIGHT), [run_tests])


# == GeneratorCritic =========================================================================


def reviewed(approve_at: int | None):
    """Drafts ``Draft N``; the critic approves the ``approve_at``-th (never if None)."""

    def model(request):
        kind, n = tagged(request)
        if kind == "generate":
            return text(f"Draft {n}: Lyon has about 520,000 inhabitants.")
        if approve_at is not None and n >= approve_at:
            return text("APPROVED\nSourced and precise.")
        return text("Say which census year the figure comes from.")

    return model


def critic_down(request):
    if tagged(request)[0] == "critique":
        raise ConnectionError("the critic's provider is down")
    return text("Draft: Lyon has about 520,000 inhabitants.")


LYON = {"task": "How many people live in Lyon?"}

gc_approved = scenario(lambda: GeneratorCritic(max_iterations=3), LYON, reviewed(2))
gc_no_solution = scenario(lambda: GeneratorCritic(max_iterations=2), LYON, reviewed(None))
gc_critic_down = scenario(lambda: GeneratorCritic(), LYON, critic_down)


async def gc_cancelled(duplicate: bool = False, *, cache: Any = None, store: Any = None) -> Result:
    """Cancelled while the generator is writing: the late reply is not recorded (nothing
    follows a run's end)."""
    writing = asyncio.Event()

    async def model(request):
        writing.set()
        await asyncio.sleep(0.3)
        return text("too late")

    async with make_engine(model, duplicate=duplicate, store=store) as engine:
        if cache is not None:
            engine.cache = cache
        run = await engine.start(GeneratorCritic(), LYON, run_id=RUN)
        await asyncio.wait_for(writing.wait(), 5)
        await run.cancel("not needed", by="tester")
        return await finish(engine, [RUN])


# == PlanAndExecute ==========================================================================

PLAN_1 = '["Find the population of Lyon", "Find the population of Porto", "Add the two numbers"]'
PLAN_2 = 'Here is the new plan:\n```json\n["Estimate Porto from the 2021 census", "Add the two numbers"]\n```'
FACTS = {"Lyon": "Lyon: 522,000", "census": "Porto (2021 census): 232,000", "Add": "754,000 in total"}


def planner(*plans: str, porto_fails: bool = True, always_fail: bool = False):
    """Plans ``plans[N-1]`` for ``plan-N``; the executor knows Lyon, the census and
    sums, and cannot find Porto (unless ``porto_fails`` is False)."""

    def model(request):
        kind, n = tagged(request)
        if kind == "plan":
            return text(plans[min(n, len(plans)) - 1])
        step = last_user(request).rsplit("Step ", 1)[-1]
        if always_fail:
            return text("FAILED: the archive is closed")
        for key, fact in FACTS.items():
            if key in step:
                return text(fact)
        if "Porto" in step and not porto_fails:
            return text("Porto: 232,000")
        return text("FAILED: no source gives Porto's population")

    return model


TWO_CITIES = {"task": "How many people live in Lyon and Porto together?"}

pe_success = scenario(lambda: PlanAndExecute(), TWO_CITIES, planner(PLAN_1, porto_fails=False))
pe_replanned = scenario(lambda: PlanAndExecute(max_replans=2), TWO_CITIES, planner(PLAN_1, PLAN_2))
pe_no_solution = scenario(lambda: PlanAndExecute(max_replans=1), TWO_CITIES, planner(PLAN_1, PLAN_1, always_fail=True))
pe_rejected_then_made = scenario(
    lambda: PlanAndExecute(), TWO_CITIES, planner("Let me think about it.", PLAN_1, porto_fails=False)
)
pe_planner_down = scenario(lambda: PlanAndExecute(), TWO_CITIES, down)


@tool(inline=True)
def population(city: str) -> int:
    """The population of a city.

    Args:
        city: the city's name
    """
    known = {"Lyon": 522_000, "Porto": 232_000}
    if city not in known:
        raise LookupError(f"no data for {city}")
    return known[city]


def child_loops(request):
    """Each child ToolLoop looks the city of its step up, then reports."""
    if tagged(request)[0] == "plan":
        return text('["Look up Lyon", "Look up Porto"]')
    if tool_messages(request) == 0:
        city = "Lyon" if last_user(request).endswith("Lyon") else "Porto"
        return tool_call("population", city=city)
    return text(f"found {request.messages[-1].content}")


pe_children = scenario(
    lambda: PlanAndExecute(executor=ToolLoop(ToolRegistry([population]))), TWO_CITIES, child_loops, [population]
)


# == ToolLoop and ReAct (the population tool and the task above) =============================


def loop_model(request):
    """Two lookups at once (one fails: a city it does not know), the failed one again
    spelled right, then the answer."""
    n = tool_messages(request)
    if n == 0:
        return tool_calls(("population", {"city": "Lyon"}), ("population", {"city": "Oporto"}))
    if n == 2:
        return tool_call("population", city="Porto")
    return text("Lyon and Porto have 754,000 inhabitants together.")


def react_model(request):
    """A lookup, a reply out of format (the loop asks again), a lookup, the answer."""
    seen = sum(1 for m in request.messages if m.role == "user" and (m.content or "").startswith("Observation:"))
    if seen == 0:
        return text('Thought: Lyon first.\nAction: population\nAction Input: {"city": "Lyon"}')
    if seen == 1:
        return text("Lyon has 522,000 inhabitants; now Porto.")
    if seen == 2:
        return text('Thought: now Porto.\nAction: population\nAction Input: {"city": "Porto"}')
    return text("Thought: I have both.\nFinal Answer: 754,000")


tl_success = scenario(
    lambda: ToolLoop(ToolRegistry([population]), system="Answer briefly."), TWO_CITIES, loop_model, [population]
)
react_success = scenario(lambda: ReAct(ToolRegistry([population])), TWO_CITIES, react_model, [population])


async def _slow_steps(request):
    if tagged(request)[0] == "plan":
        return text(PLAN_1)
    await asyncio.sleep(1.0)
    return text("too late")


pe_timeout = scenario(lambda: PlanAndExecute(), TWO_CITIES, _slow_steps, deadline=0.5)


# == WorkflowGraph ==========================================================================


@tool(inline=True)
def lookup(topic: str) -> dict:
    """Facts about a topic.

    Args:
        topic: what to look up
    """
    return {"topic": topic, "facts": ["founded 43 BC", "two rivers"]}


@tool(name="lookup", inline=True)
def lookup_down(topic: str) -> dict:
    """Facts about a topic (the service is down)."""
    raise TimeoutError("the facts service did not answer")


ARTICLE = [
    {"id": "outline", "prompt": "Outline a short article about {task}."},
    {"id": "facts", "kind": "tool", "tool": "lookup", "args": {"topic": "{task}"}, "fallback": "recall"},
    {"id": "recall", "prompt": "List what you know about {task} ({error})."},
    {
        "id": "draft",
        "prompt": "Write the article.\nOutline:\n{outline}\nFacts:\n{facts}",
        "after": ["outline", "facts"],
    },
    {"id": "title", "prompt": "Give a title for this outline:\n{outline}", "after": ["outline"]},
]
NO_FALLBACK = [dict(n) for n in ARTICLE if n["id"] != "recall"]
for _n in NO_FALLBACK:
    _n.pop("fallback", None)


def writer(request):
    node = (request.tag or "").removeprefix("node-")
    return text(
        {
            "outline": "1. Origins\n2. Rivers",
            "recall": "Roman origins; the Rhone and the Saone.",
            "draft": "Lyon grew where two rivers meet. " + last_user(request).splitlines()[-1],
            "title": "Lyon, a city of two rivers",
        }[node]
    )


CITY = {"task": "Lyon"}

wf_success = scenario(lambda: WorkflowGraph(nodes=ARTICLE), CITY, writer, [lookup])
wf_fallback = scenario(lambda: WorkflowGraph(nodes=ARTICLE), CITY, writer, [lookup_down])


async def slow_writer(request):
    await asyncio.sleep(0.1)  # the failing tool answers first: the run ends before this
    return writer(request)


wf_failed = scenario(lambda: WorkflowGraph(nodes=NO_FALLBACK), CITY, slow_writer, [lookup_down])


def _child_node_graph():
    loop = ToolLoop(ToolRegistry([population]))
    return WorkflowGraph(
        nodes=[
            {"id": "count", "kind": "child", "algorithm": loop, "prompt": "Population of {task}?"},
            {"id": "report", "prompt": "Report: {count}", "after": ["count"]},
        ]
    )


def child_node_model(request):
    if request.tag == "node-report":
        return text(last_user(request).upper())
    if tool_messages(request) == 0:
        return tool_call("population", city="Porto")
    return text(f"{request.messages[-1].content} people")


wf_child = scenario(_child_node_graph, {"task": "Porto"}, child_node_model, [population])


# == FSM ======================================================================================

SUPPORT = {
    "states": {
        "triage": {
            "prompt": "Bug report or question?\n{task}",
            "transitions": {"bug": "reproduce", "question": "answer"},
        },
        "reproduce": {
            "kind": "tool",
            "tool": "reproduce",
            "args": {"report": "{task}"},
            "transitions": {"reproduced": "answer", "not_reproduced": "triage", "error": "answer"},
        },
        "answer": {"prompt": "Write the reply to the user. What we found: {last}", "transitions": {"sent": "done"}},
    },
    "initial": "triage",
    "finals": ["done"],
}
REPORT = {"task": "The app crashes when I open a file with an accent in its name."}


@tool(inline=True)
def reproduce(report: str) -> dict:
    """Tries to reproduce a bug report.

    Args:
        report: the user's report
    """
    return {"next": "reproduced", "output": "UnicodeDecodeError in the file dialog"}


@tool(name="reproduce", inline=True)
def reproduce_never(report: str) -> str:
    """Never reproduces anything."""
    return "not_reproduced"


@tool(name="reproduce", inline=True)
def reproduce_broken(report: str) -> str:
    """The reproduction rig is broken."""
    raise RuntimeError("no test device available")


def support_model(triage_label: str = "bug"):
    def model(request):
        prompt = last_user(request)
        if prompt.startswith("Bug report"):
            return text(f"Looks like a crash.\nNEXT: {triage_label}")
        return text("Thanks for the report: a fix ships in 1.2.\nNEXT: sent")

    return model


def fsm(**extra):
    return lambda: FSM(**{**SUPPORT, **extra})


fsm_success = scenario(fsm(), REPORT, support_model(), [reproduce])
fsm_error_transition = scenario(fsm(), REPORT, support_model(), [reproduce_broken])
fsm_unknown_transition = scenario(fsm(), REPORT, support_model("feature_request"), [reproduce])
fsm_max_transitions = scenario(fsm(max_transitions=4), REPORT, support_model(), [reproduce_never])
fsm_model_down = scenario(fsm(), REPORT, down, [reproduce])


# == SelfConsistency =========================================================================


def samples(*replies: str | None):
    """Sample ``i`` answers ``replies[i]``; None: that sample's call fails."""

    def model(request):
        reply = replies[tagged(request)[1]]
        if reply is None:
            raise ConnectionError("sample lost")
        return text(reply)

    return model


QUESTION = {"task": "What is 6 x 7?"}
MAJORITY = ("6 x 7 = 42.\nAnswer: 42", "Answer: 41", None, "It is forty-two.\nAnswer: 42.", "answer: 42")

sc_majority = scenario(lambda: SelfConsistency(n=5), QUESTION, samples(*MAJORITY))
sc_all_failed = scenario(lambda: SelfConsistency(n=3), QUESTION, samples(None, None, None))
sc_no_majority = scenario(
    lambda: SelfConsistency(n=3, min_votes=2), QUESTION, samples("Answer: 41", "Answer: 42", "Answer: 43")
)
sc_budget = scenario(lambda: SelfConsistency(n=5), QUESTION, samples(*MAJORITY), budget=Budget(model_calls=2))


# == what each scenario must produce ===========================================================

STARTED = ["aaa.run.started", "aaa.input.validated"]
#: a model call: its request, its attempt (on the log before it is sent), its result
LLM = ["aaa.llm.requested", "aaa.llm.attempted", "aaa.llm.completed"]
LLM_FAILED = ["aaa.llm.requested", "aaa.llm.attempted", "aaa.llm.failed"]
#: a model call in flight when its run ended: the end records it (a cut-off result)
LLM_CUT_OFF = ["aaa.llm.requested", "aaa.llm.attempted", "aaa.llm.failed"]
TOOL = ["aaa.tool.requested", "aaa.tool.completed"]
TOOL_FAILED = ["aaa.tool.requested", "aaa.tool.failed"]
DONE = ["aaa.run.completed"]
CHILD = ["aaa.child.requested", "aaa.child.completed"]
MADE = ["aaa.plan.made"]
ENTERED = ["aaa.fsm.entered"]


@dataclass(frozen=True)
class Expected:
    run: Scenario
    algorithm: str
    outcome: str
    #: the run's event types in log order (None: checked as a multiset, see ``bag``)
    types: list[str] | None = None
    #: for parallel work: the event types in any order (arrival order is the model's)
    bag: list[str] | None = None


EXPECTED: dict[str, Expected] = {
    # GenerateTestRepair
    "gtr_repaired": Expected(gtr_repaired, "GenerateTestRepair", "success", STARTED + LLM + TOOL + LLM + TOOL + DONE),
    "gtr_broken_then_fixed": Expected(
        gtr_broken_then_fixed, "GenerateTestRepair", "success", STARTED + LLM + TOOL_FAILED + LLM + TOOL + DONE
    ),
    "gtr_no_solution": Expected(
        gtr_no_solution, "GenerateTestRepair", "no_solution", STARTED + (LLM + TOOL) * 3 + DONE
    ),
    "gtr_model_down": Expected(gtr_model_down, "GenerateTestRepair", "failed", STARTED + LLM_FAILED + DONE),
    "gtr_no_test_tool": Expected(gtr_no_test_tool, "GenerateTestRepair", "failed", STARTED + LLM + TOOL_FAILED + DONE),
    # GeneratorCritic
    "gc_approved": Expected(gc_approved, "GeneratorCritic", "success", STARTED + LLM * 4 + DONE),
    "gc_no_solution": Expected(gc_no_solution, "GeneratorCritic", "no_solution", STARTED + LLM * 4 + DONE),
    "gc_critic_down": Expected(gc_critic_down, "GeneratorCritic", "failed", STARTED + LLM + LLM_FAILED + DONE),
    "gc_cancelled": Expected(
        gc_cancelled,
        "GeneratorCritic",
        "cancelled",
        STARTED + ["aaa.llm.requested", "aaa.llm.attempted", "aaa.cancel.requested", "aaa.llm.failed"] + DONE,
    ),
    # PlanAndExecute
    "pe_success": Expected(pe_success, "PlanAndExecute", "success", STARTED + LLM + MADE + LLM * 3 + DONE),
    "pe_replanned": Expected(
        pe_replanned, "PlanAndExecute", "success", STARTED + LLM + MADE + LLM * 2 + LLM + MADE + LLM * 2 + DONE
    ),
    "pe_no_solution": Expected(
        pe_no_solution, "PlanAndExecute", "no_solution", STARTED + (LLM + MADE + LLM) * 2 + DONE
    ),
    "pe_rejected_then_made": Expected(
        pe_rejected_then_made,
        "PlanAndExecute",
        "success",
        STARTED + LLM + ["aaa.plan.rejected"] + LLM + MADE + LLM * 3 + DONE,
    ),
    "pe_planner_down": Expected(pe_planner_down, "PlanAndExecute", "failed", STARTED + LLM_FAILED + DONE),
    "pe_children": Expected(pe_children, "PlanAndExecute", "success", STARTED + LLM + MADE + CHILD * 2 + DONE),
    "pe_timeout": Expected(pe_timeout, "PlanAndExecute", "timeout", STARTED + LLM + MADE + LLM_CUT_OFF + DONE),
    # WorkflowGraph
    "wf_success": Expected(wf_success, "WorkflowGraph", "success", bag=STARTED + LLM * 3 + TOOL + DONE),
    "wf_fallback": Expected(wf_fallback, "WorkflowGraph", "success", bag=STARTED + LLM * 4 + TOOL_FAILED + DONE),
    "wf_failed": Expected(
        wf_failed,
        "WorkflowGraph",
        "failed",
        STARTED
        + ["aaa.llm.requested", "aaa.llm.attempted", "aaa.tool.requested", "aaa.tool.failed", "aaa.llm.failed"]
        + DONE,
    ),
    "wf_child": Expected(wf_child, "WorkflowGraph", "success", STARTED + CHILD + LLM + DONE),
    # FSM
    "fsm_success": Expected(
        fsm_success, "FSM", "success", STARTED + ENTERED + LLM + ENTERED + TOOL + ENTERED + LLM + ENTERED + DONE
    ),
    "fsm_error_transition": Expected(
        fsm_error_transition,
        "FSM",
        "success",
        STARTED + ENTERED + LLM + ENTERED + TOOL_FAILED + ENTERED + LLM + ENTERED + DONE,
    ),
    "fsm_unknown_transition": Expected(fsm_unknown_transition, "FSM", "no_solution", STARTED + ENTERED + LLM + DONE),
    "fsm_max_transitions": Expected(
        fsm_max_transitions, "FSM", "no_solution", STARTED + (ENTERED + LLM + ENTERED + TOOL) * 2 + ENTERED + LLM + DONE
    ),
    "fsm_model_down": Expected(fsm_model_down, "FSM", "failed", STARTED + ENTERED + LLM_FAILED + DONE),
    # SelfConsistency
    "sc_majority": Expected(
        sc_majority,
        "SelfConsistency",
        "success",
        bag=STARTED
        + ["aaa.llm.requested", "aaa.llm.attempted"] * 5
        + ["aaa.llm.completed"] * 4
        + ["aaa.llm.failed"]
        + DONE,
    ),
    "sc_all_failed": Expected(
        sc_all_failed,
        "SelfConsistency",
        "failed",
        bag=STARTED + ["aaa.llm.requested", "aaa.llm.attempted"] * 3 + ["aaa.llm.failed"] * 3 + DONE,
    ),
    "sc_no_majority": Expected(
        sc_no_majority,
        "SelfConsistency",
        "no_solution",
        bag=STARTED + ["aaa.llm.requested", "aaa.llm.attempted"] * 3 + ["aaa.llm.completed"] * 3 + DONE,
    ),
    # five samples asked at once, two allowed: none is made (never a part of a decision)
    "sc_budget": Expected(sc_budget, "SelfConsistency", "budget_exceeded", STARTED + DONE),
}

#: one recorded run per algorithm: the golden logs (``tests/golden/<name>.jsonl``)
GOLDEN: dict[str, Scenario] = {
    "tool_loop": tl_success,
    "react": react_success,
    "generate_test_repair": gtr_repaired,
    "generator_critic": gc_approved,
    "plan_and_execute": pe_replanned,
    "workflow_graph": wf_fallback,
    "fsm": fsm_success,
    "self_consistency": sc_majority,
}
