"""The graph of a WorkflowGraph or FSM run and the path it took, as a small picture
model: a pure function of the algorithm's definition (the run's config) and the run's
events; :func:`aaa_django.admin.pictures.graph` draws it.

- :func:`workflow_picture`: a node per workflow node, an edge per input (``after``) and
  per fallback; each node not reached, running, done, failed, or stopped (the run ended
  while it ran), numbered in the order the run started it.
- :func:`fsm_picture`: a node per state (finals too), an edge per transition (the labels
  that lead from one state to another on one edge); the states entered, in order, and
  how often the run went along each edge.

Both read only what a claim-checked event keeps in its stub (request tags and call ids,
a result's id, a child's run id), so drawing a run never reads a blob, except a child
run's end, whose outcome the stub does not keep (:data:`NEEDS_PAYLOAD`). Nodes are
placed in columns (``rank``, left to right along the edges) and rows.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from aaa_django.algos.common import tag_index
from aaa_django.algos.control import (
    FSM,
    FSM_ENTERED,
    FSMConfig,
    WorkflowGraph,
    WorkflowGraphConfig,
    node_of,
)
from aaa_django.events import Event
from aaa_django.runtime.event_types import (
    CHILD_COMPLETED,
    CHILD_REQUESTED,
    LLM_COMPLETED,
    LLM_FAILED,
    LLM_REQUESTED,
    RUN_COMPLETED,
    TOOL_COMPLETED,
    TOOL_FAILED,
    TOOL_REQUESTED,
    result_id,
)

#: the event types a picture reads (the admin asks the log for these only)
TYPES = (
    LLM_REQUESTED,
    LLM_COMPLETED,
    LLM_FAILED,
    TOOL_REQUESTED,
    TOOL_COMPLETED,
    TOOL_FAILED,
    CHILD_REQUESTED,
    CHILD_COMPLETED,
    FSM_ENTERED,
    RUN_COMPLETED,
)
#: ... and those whose payload it needs when they are claim-checked
NEEDS_PAYLOAD = (CHILD_COMPLETED,)

#: what becomes of a node the run was still running when it ended, by outcome
_ENDED = {"success": "done", "failed": "failed", "no_solution": "failed"}


@dataclass(frozen=True)
class GraphNode:
    """A node of the picture: a workflow node or a state."""

    id: str
    #: ``llm``, ``tool`` or ``child``; ``final`` for an FSM's final state
    kind: str
    #: what it does, in a few words (the tool's or child algorithm's name)
    detail: str
    #: ``idle`` (not reached), ``running``, ``done``, ``failed`` or ``stopped``
    status: str
    rank: int
    row: int
    #: when the run started (entered) it: 1 for the first, in order
    steps: tuple[int, ...] = ()


@dataclass(frozen=True)
class GraphEdge:
    """``src`` to ``dst``: ``after`` (``dst`` takes ``src``'s result), ``fallback``
    (``dst`` runs when ``src`` fails) or ``transition`` (labelled by ``label``)."""

    src: str
    dst: str
    kind: str
    label: str = ""
    #: how many times the run went along it
    taken: int = 0


@dataclass(frozen=True)
class GraphPicture:
    kind: str  # "workflow" or "fsm"
    nodes: tuple[GraphNode, ...]
    edges: tuple[GraphEdge, ...]
    #: the nodes in the order the run started (entered) them
    path: tuple[str, ...]
    #: the run's outcome, once it has ended
    outcome: str | None = None
    #: why the run ended where it did, in a line ("" while it goes on)
    note: str = ""

    def node(self, node_id: str) -> GraphNode:
        return next(n for n in self.nodes if n.id == node_id)


def draws(algorithm: type) -> bool:
    """Is there a picture of ``algorithm``'s runs (a WorkflowGraph or an FSM)?"""
    return issubclass(algorithm, (WorkflowGraph, FSM))


def is_fsm(algorithm: type) -> bool:
    return issubclass(algorithm, FSM)


def graph_picture(algorithm: type, config: object, events: Sequence[Event]) -> GraphPicture | None:
    """The picture of a run of ``algorithm`` (a WorkflowGraph or FSM class, or a
    subclass) with ``config`` (the run's, as started), or None for another algorithm.
    Raises ``pydantic.ValidationError`` for a config the algorithm refuses."""
    if issubclass(algorithm, WorkflowGraph):
        return workflow_picture(algorithm.Config.model_validate(config or {}), events)
    if issubclass(algorithm, FSM):
        return fsm_picture(algorithm.Config.model_validate(config or {}), events)
    return None


def _ending(events: Iterable[Event]) -> tuple[str | None, object]:
    end = next((e for e in events if e.type == RUN_COMPLETED), None)
    return (end.data.get("outcome"), end.data.get("value")) if end is not None else (None, None)


def _short(text: object, limit: int = 120) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


# == WorkflowGraph ==========================================================================


def workflow_picture(cfg: WorkflowGraphConfig, events: Sequence[Event]) -> GraphPicture:
    """The workflow's nodes and edges; which nodes the run started, in which order, and
    how each ended (a model or tool call's result by its id, a child run by its run
    id)."""
    known = {n.id for n in cfg.nodes}
    order: list[str] = []
    status: dict[str, str] = {}
    by_result: dict[str, str] = {}  # result id -> node
    by_child: dict[str, str] = {}  # child run id -> node
    field = {LLM_REQUESTED: "tag", TOOL_REQUESTED: "call_id", CHILD_REQUESTED: "key"}
    for e in events:
        if e.type in field:
            node = node_of(e.data.get(field[e.type]))
            if node not in known or node in status:
                continue
            order.append(node)
            status[node] = "running"
            by_result[result_id(e.id)] = node
            if e.type == CHILD_REQUESTED:
                by_child[str(e.data.get("child"))] = node
        elif e.type in (LLM_COMPLETED, TOOL_COMPLETED, LLM_FAILED, TOOL_FAILED):
            if (node := by_result.get(e.id)) is not None and not e.data.get("cut_off"):
                # (a call the run's end cut off is "stopped" with the run, below)
                status[node] = "done" if e.type in (LLM_COMPLETED, TOOL_COMPLETED) else "failed"
        elif e.type == CHILD_COMPLETED:
            if (node := by_child.get(str(e.data.get("child")))) is not None:
                status[node] = "done" if e.data.get("outcome") == "success" else "failed"
    outcome, value = _ending(events)
    if outcome is not None:  # what was still running was cancelled with the run
        status = {n: "stopped" if s == "running" else s for n, s in status.items()}

    primaries = cfg.primaries()
    by_id = {n.id: n for n in cfg.nodes}
    rank: dict[str, int] = {}
    for n in _ordered(primaries):  # a node's column: one past its furthest input
        rank[n.id] = 1 + max((rank[a] for a in n.after), default=-1)
    columns: dict[int, list[str]] = {}
    for r in sorted(set(rank.values())):
        mine = [n for n in primaries if rank[n.id] == r]
        mine.sort(key=lambda n: _mean_row(n.after, columns, rank))  # near its inputs
        column = columns.setdefault(r, [])
        for n in mine:
            column.append(n.id)
            fb = n.fallback
            while fb:  # a fallback under the node it replaces
                rank[fb] = r
                column.append(fb)
                fb = by_id[fb].fallback
    row = {node: i for column in columns.values() for i, node in enumerate(column)}
    steps = {node: (i + 1,) for i, node in enumerate(order)}
    nodes = tuple(
        GraphNode(
            id=n.id,
            kind=n.kind,
            detail={
                "llm": "model",
                "tool": f"tool {n.tool}",
                "child": f"child {n.algorithm.algorithm if n.algorithm else ''}",
            }[n.kind],
            status=status.get(n.id, "idle"),
            rank=rank[n.id],
            row=row[n.id],
            steps=steps.get(n.id, ()),
        )
        for n in cfg.nodes
    )
    edges = [GraphEdge(a, n.id, "after", taken=int(n.id in status)) for n in cfg.nodes for a in n.after]
    edges += [
        GraphEdge(n.id, n.fallback, "fallback", "on failure", taken=int(n.fallback in status))
        for n in cfg.nodes
        if n.fallback
    ]
    note = ""
    if outcome == "failed" and isinstance(value, dict):
        note = _short(f"{value.get('node')} failed: {value.get('error')}")
    return GraphPicture("workflow", nodes, tuple(edges), tuple(order), outcome, note)


def _ordered(primaries: list[Any]) -> list[Any]:
    """The nodes, each after its inputs (the config's validation ruled out cycles)."""
    done: set[str] = set()
    out: list[Any] = []
    todo = list(primaries)
    while todo:
        ready = [n for n in todo if set(n.after) <= done]
        out += ready
        done.update(n.id for n in ready)
        todo = [n for n in todo if n.id not in done]
    return out


def _mean_row(inputs: Iterable[str], columns: dict[int, list[str]], rank: dict[str, int]) -> float:
    """Where a node's inputs sit in their columns (placed already), on average: a node
    goes near its inputs, and edges cross less; -1 for a node without inputs."""
    rows = [columns[rank[a]].index(a) for a in inputs]
    return sum(rows) / len(rows) if rows else -1.0


# == FSM ======================================================================================


def fsm_picture(cfg: FSMConfig, events: Sequence[Event]) -> GraphPicture:
    """The machine's states and transitions; the states the run entered, in order (its
    ``aaa.fsm.entered`` events), the edges it went along (with the label it followed),
    and how the last state ended."""
    path: list[str] = []
    went: dict[tuple[str, str], int] = {}
    asked: str | None = None  # the result id of the current state's action
    failed = False  # the current state's model call failed (the run fails with it)
    for e in events:
        if e.type == FSM_ENTERED:
            state = str(e.data.get("state"))
            if path:
                went[(path[-1], state)] = went.get((path[-1], state), 0) + 1
            path.append(state)
            asked, failed = None, False
        elif e.type in (LLM_REQUESTED, TOOL_REQUESTED):
            tag = e.data.get("tag" if e.type == LLM_REQUESTED else "call_id")
            if path and tag_index(tag, "fsm") == len(path) - 1:
                asked = result_id(e.id)
        elif e.type == LLM_FAILED and e.id == asked and not e.data.get("cut_off"):
            failed = True
    outcome, value = _ending(events)

    names = [*cfg.states, *(f for f in cfg.finals if f not in cfg.states)]
    status = {s: "done" for s in path}
    if path:
        current = path[-1]
        if outcome is None:
            status[current] = "failed" if failed else "running"
        else:
            status[current] = _ENDED.get(outcome, "stopped")
    edges: dict[tuple[str, str], list[str]] = {}
    for name, node in cfg.states.items():
        for label, target in node.transitions.items():
            edges.setdefault((name, target), []).append(label)
    rank, met = _levels(cfg.initial, names, edges)
    rows: dict[int, int] = {}
    row = {}
    for name in met:
        row[name] = rows.get(rank[name], 0)
        rows[rank[name]] = row[name] + 1
    steps: dict[str, list[int]] = {}
    for i, s in enumerate(path):
        steps.setdefault(s, []).append(i + 1)
    nodes = tuple(
        GraphNode(
            id=name,
            kind="final" if name not in cfg.states else cfg.states[name].kind,
            detail="final"
            if name not in cfg.states
            else ("model" if cfg.states[name].kind == "llm" else f"tool {cfg.states[name].tool}"),
            status=status.get(name, "idle"),
            rank=rank[name],
            row=row[name],
            steps=tuple(steps.get(name, ())),
        )
        for name in names
    )
    return GraphPicture(
        "fsm",
        nodes,
        tuple(
            GraphEdge(a, b, "transition", " / ".join(labels), went.get((a, b), 0)) for (a, b), labels in edges.items()
        ),
        tuple(path),
        outcome,
        _fsm_note(outcome, value),
    )


def _levels(
    initial: str, names: list[str], edges: dict[tuple[str, str], list[str]]
) -> tuple[dict[str, int], list[str]]:
    """A state's column: how few transitions from the initial state it is (breadth
    first; states it cannot reach go in a column after the others); and the order the
    walk meets the states (their rows)."""
    rank, met, frontier = {initial: 0}, [initial], [initial]
    while frontier:
        reached = []
        for a in frontier:
            for src, dst in edges:
                if src == a and dst not in rank:
                    rank[dst] = rank[a] + 1
                    reached.append(dst)
        met += reached
        frontier = reached
    last = max(rank.values()) + 1
    met += [n for n in names if n not in rank]
    return {name: rank.get(name, last) for name in names}, met


def _fsm_note(outcome: str | None, value: object) -> str:
    if outcome is None or not isinstance(value, dict):
        return ""
    if value.get("reason") == "unknown_transition":
        return _short(f"{value.get('state')}: the label {value.get('label')!r} names no transition")
    if value.get("reason") == "max_transitions":
        return _short(f"stopped at {value.get('state')}: max_transitions reached")
    if outcome == "failed" and isinstance(value.get("error"), dict):
        error = value["error"]
        return _short(f"{value.get('state')}: {error.get('reason') or 'error'}: {error.get('error') or ''}")
    return ""
