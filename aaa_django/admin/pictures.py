"""Pictures on the admin's run page, drawn here as inline SVG (no script, no CDN).

- :func:`budget_bars`: a bar per budgeted dimension (tokens, cost, model calls, tool
  calls), how much of its limit the run has used; amber from 80 %, red over the limit.
- :func:`timeline`: a run's model calls, tool calls and approval waits over time, one
  lane each, every call a bar from its request to its answer (or to the end / now).
- :func:`graph`: a WorkflowGraph's or FSM's nodes and edges and the path a run took
  (the picture model is :mod:`aaa_django.admin.graphs`).

Every text in a picture is escaped (``format_html``); the pictures carry ``<title>``s,
so a screen reader and a hover say what a bar is.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from django.utils.html import format_html, format_html_join
from django.utils.safestring import SafeString, mark_safe

if TYPE_CHECKING:
    from .graphs import GraphNode, GraphPicture

from aaa_django.runtime.event_types import (
    APPROVAL_DENIED,
    APPROVAL_EXPIRED,
    APPROVAL_REQUESTED,
    LLM_FAILED,
    LLM_REQUESTED,
    RUN_COMPLETED,
    TOOL_FAILED,
    TOOL_REQUESTED,
    decision_id,
    result_id,
)

#: (dimension, label) in the order the bars are drawn
DIMENSIONS = (("tokens", "tokens"), ("cost", "cost"), ("model_calls", "model calls"), ("tool_calls", "tool calls"))
WIDTH, ROW, LABEL, NUMBERS = 360, 22, 82, 120


def _amount(dimension: str, value: float) -> str:
    return f"${value:,.4f}" if dimension == "cost" else f"{int(value):,}"


def budget_bars(budget: Any, spend: Any) -> SafeString | None:
    """The run's budget use as an SVG, or None when the run has no limit."""
    if budget is None:
        return None
    rows = []
    for dimension, label in DIMENSIONS:
        limit = getattr(budget, dimension)
        if limit is None:
            continue
        used = getattr(spend, dimension)
        rows.append((dimension, label, used, limit))
    if not rows:
        return None
    track = WIDTH - LABEL - NUMBERS
    parts = []
    for i, (dimension, label, used, limit) in enumerate(rows):
        share = used / limit if limit else (1.0 if used else 0.0)
        state = "over" if share > 1 else "near" if share >= 0.8 else "ok"
        y = i * ROW
        text = f"{_amount(dimension, used)} / {_amount(dimension, limit)} ({share:.0%})"
        parts.append(
            format_html(
                '<g class="aaa-bar aaa-{}" data-dimension="{}" data-share="{}">'
                "<title>{}: {}</title>"
                '<text x="0" y="{}" class="aaa-bar-label">{}</text>'
                '<rect x="{}" y="{}" width="{}" height="12" rx="2" class="aaa-bar-track"/>'
                '<rect x="{}" y="{}" width="{}" height="12" rx="2" class="aaa-bar-fill"/>'
                '<text x="{}" y="{}" class="aaa-bar-value">{}</text></g>',
                state,
                dimension,
                f"{share:.4f}",
                label,
                text,
                y + 15,
                label,
                LABEL,
                y + 5,
                track,
                LABEL,
                y + 5,
                f"{track * min(share, 1.0):.1f}",
                LABEL + track + 6,
                y + 15,
                text,
            )
        )
    height = len(rows) * ROW
    return format_html(
        '<svg class="aaa-budget" role="img" aria-label="Budget use" width="{}" height="{}" '
        'viewBox="0 0 {} {}" xmlns="http://www.w3.org/2000/svg">{}</svg>',
        WIDTH,
        height,
        WIDTH,
        height,
        format_html_join("", "{}", ((p,) for p in parts)),
    )


# -- a run's timeline ----------------------------------------------------------------------

#: lane -> (label, request type)
LANES = (
    ("model", "model calls", LLM_REQUESTED),
    ("tool", "tool calls", TOOL_REQUESTED),
    ("approval", "approval waits", APPROVAL_REQUESTED),
)
TL_WIDTH, TL_LABEL, TL_ROW, TL_AXIS, MAX_ROWS = 760, 100, 14, 18, 6
#: the run page draws the timeline of runs up to this many events (it reads them all)
TIMELINE_EVENTS = 5000


def timeline_spans(events: list[tuple[str, int, str, float, str]], now: float) -> tuple[list[dict], float, float]:
    """The bars of a run's timeline from its events ``(id, seq, type, epoch seconds,
    name)``: each model call, tool call and approval wait from its request to its result
    (``result_id`` / ``decision_id``), or to the run's end (or ``now``) when it has none.
    Returns the bars and the picture's time range."""
    if not events:
        return [], now, now
    by_id = {e[0]: e for e in events}
    start = events[0][3]
    end = next((e[3] for e in events if e[2] == RUN_COMPLETED), None)
    stop = end if end is not None else max(now, events[-1][3])
    bars = []
    for lane, _, request_type in LANES:
        for eid, seq, etype, at, name in events:
            if etype != request_type:
                continue
            answer = by_id.get(decision_id(eid) if lane == "approval" else result_id(eid))
            failed = answer is not None and answer[2] in (LLM_FAILED, TOOL_FAILED, APPROVAL_DENIED, APPROVAL_EXPIRED)
            bars.append(
                {
                    "lane": lane,
                    "seq": seq,
                    "name": name,
                    "start": at,
                    "end": answer[3] if answer is not None else stop,
                    "open": answer is None,
                    "failed": failed,
                    "answer": answer[2] if answer is not None else None,
                }
            )
    return bars, start, stop


def _rows(bars: list[dict]) -> int:
    """Give each bar of one lane a row where it overlaps no other (greedy; past
    ``MAX_ROWS`` rows, the row that frees first); returns the rows used."""
    ends: list[float] = []
    for bar in sorted(bars, key=lambda b: b["start"]):
        free = [i for i, end in enumerate(ends) if end <= bar["start"]]
        if free:
            row = free[0]
        elif len(ends) < MAX_ROWS:
            row = len(ends)
            ends.append(bar["end"])
        else:
            row = min(range(len(ends)), key=ends.__getitem__)
        ends[row] = max(ends[row], bar["end"])
        bar["row"] = row
    return max(len(ends), 1)


def _duration(seconds: float) -> str:
    if seconds < 1:
        return f"{seconds * 1000:.0f} ms"
    if seconds < 120:
        return f"{seconds:.1f} s"
    return f"{seconds / 60:.1f} min"


def timeline(events: list[tuple[str, int, str, float, str]], now: float) -> SafeString:
    """A run's model calls, tool calls and approval waits over time, as an SVG: one
    lane each (overlapping calls on rows of their own), each a bar from its request to
    its answer; a call still waiting is drawn faded to the run's end (or now)."""
    bars, start, stop = timeline_spans(events, now)
    span = max(stop - start, 1e-6)
    track = TL_WIDTH - TL_LABEL - 10
    parts, y = [], 0
    for lane, label, _ in LANES:
        mine = [b for b in bars if b["lane"] == lane]
        rows = _rows(mine)
        height = rows * TL_ROW + 6
        parts.append(
            format_html(
                '<text x="0" y="{}" class="aaa-lane-label">{} ({})</text>'
                '<line x1="{}" x2="{}" y1="{}" y2="{}" class="aaa-grid-line"/>',
                y + 12,
                label,
                len(mine),
                TL_LABEL,
                TL_WIDTH,
                y + height,
                y + height,
            )
        )
        for b in mine:
            x = TL_LABEL + (b["start"] - start) / span * track
            w = max((b["end"] - b["start"]) / span * track, 1.0)
            css = f"aaa-span-{'failed' if b['failed'] else lane}{' aaa-span-open' if b['open'] else ''}"
            what = b["name"] or lane
            answer = "waiting" if b["open"] else b["answer"]
            parts.append(
                format_html(
                    '<rect x="{}" y="{}" width="{}" height="{}" class="{}" data-seq="{}">'
                    "<title>#{} {}: {} ({})</title></rect>",
                    f"{x:.1f}",
                    y + 3 + b["row"] * TL_ROW,
                    f"{w:.1f}",
                    TL_ROW - 3,
                    css,
                    b["seq"],
                    b["seq"],
                    what,
                    _duration(b["end"] - b["start"]),
                    answer,
                )
            )
        y += height
    for i in range(5):  # the time axis: 0, a quarter, ... the whole run
        x = TL_LABEL + track * i / 4
        parts.append(
            format_html(
                '<line x1="{}" x2="{}" y1="0" y2="{}" class="aaa-grid-line"/>'
                '<text x="{}" y="{}" class="aaa-axis" text-anchor="{}">{}</text>',
                f"{x:.1f}",
                f"{x:.1f}",
                y,
                f"{x:.1f}",
                y + 13,
                "start" if i == 0 else "end" if i == 4 else "middle",
                _duration(span * i / 4) if bars else ("no model or tool calls yet" if i == 0 else ""),
            )
        )
    height = y + TL_AXIS
    return format_html(
        '<svg class="aaa-timeline" role="img" aria-label="The run over time" width="{}" height="{}" '
        'viewBox="0 0 {} {}" xmlns="http://www.w3.org/2000/svg">{}</svg>',
        TL_WIDTH,
        height,
        TL_WIDTH,
        height,
        format_html_join("", "{}", ((p,) for p in parts)),
    )


# -- the graph of a WorkflowGraph or FSM run -----------------------------------------------

G_W, G_H, G_GAP_X, G_GAP_Y, G_PAD, G_TOP, G_BOTTOM, G_LEGEND = 136, 42, 84, 30, 12, 36, 24, 46
#: (status, what the legend calls it)
STATUSES = (
    ("idle", "not reached"),
    ("running", "running"),
    ("done", "done"),
    ("failed", "failed"),
    ("stopped", "stopped with the run"),
)


def _box(node: GraphNode, top: float) -> tuple[float, float]:
    """The top left corner of a node's box (``top``: the room above the first row)."""
    return G_PAD + node.rank * (G_W + G_GAP_X), top + node.row * (G_H + G_GAP_Y)


def _edge_path(a: GraphNode, b: GraphNode, back: int, top: float) -> tuple[str, float, float]:
    """The SVG path of an edge from node ``a`` to node ``b`` and where its label goes:
    forward (a later column) from side to side; a loop above a node to itself; within
    a column from bottom to top (or top to bottom); backward over both boxes."""
    (ax, ay), (bx, by) = _box(a, top), _box(b, top)
    if a.id == b.id:
        x1, x2, y = ax + G_W * 0.7, ax + G_W * 0.3, ay
        return (
            f"M{x1:.1f},{y:.1f} C{x1 + 10:.1f},{y - 30:.1f} {x2 - 10:.1f},{y - 30:.1f} {x2:.1f},{y - 2:.1f}",
            ax + G_W / 2,
            y - 26,
        )
    if b.rank > a.rank:
        x1, y1, x2, y2 = ax + G_W, ay + G_H / 2, bx - 2, by + G_H / 2
        c = G_GAP_X / 2
        return (
            f"M{x1:.1f},{y1:.1f} C{x1 + c:.1f},{y1:.1f} {x2 - c:.1f},{y2:.1f} {x2:.1f},{y2:.1f}",
            (x1 + x2) / 2,
            (y1 + y2) / 2 - 4,
        )
    if b.rank == a.rank:
        down = b.row > a.row
        x = ax + G_W / 2
        y1, y2 = (ay + G_H, by - 2) if down else (ay, by + G_H + 2)
        bend = 28 * (abs(b.row - a.row) - 1)  # around the boxes between them
        return (
            f"M{x:.1f},{y1:.1f} C{x + bend:.1f},{y1:.1f} {x + bend:.1f},{y2:.1f} {x:.1f},{y2:.1f}",
            x + bend / 2 + 6,
            (y1 + y2) / 2 + 4,
        )
    x1, x2 = ax + G_W / 2 + 8, bx + G_W / 2 - 8
    y1, y2 = ay, by - 2
    high = min(y1, y2) - 18 - 8 * back
    return (
        f"M{x1:.1f},{y1:.1f} C{x1:.1f},{high:.1f} {x2:.1f},{high:.1f} {x2:.1f},{y2:.1f}",
        (x1 + x2) / 2,
        0.125 * (y1 + y2) + 0.75 * high - 3,
    )


def _cut(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


def graph(picture: GraphPicture) -> SafeString:
    """A :class:`~aaa_django.admin.graphs.GraphPicture` as an SVG: a box per node (its
    status as its colour, the order the run reached it as ``#n``), an arrow per edge,
    the ones the run went along drawn strong (``×n`` when more than once), the path and
    why the run ended there written under it."""
    nodes = {n.id: n for n in picture.nodes}
    parts: list[SafeString] = [
        mark_safe(
            '<defs><marker id="aaa-arrow" viewBox="0 0 10 10" refX="9" refY="5" markerUnits="userSpaceOnUse" '
            'markerWidth="9" markerHeight="9" orient="auto-start-reverse"><path d="M0,0 L10,5 L0,10 z" class="aaa-arrow"/></marker>'
            '<marker id="aaa-arrow-taken" viewBox="0 0 10 10" refX="9" refY="5" markerUnits="userSpaceOnUse" '
            'markerWidth="10" markerHeight="10" orient="auto-start-reverse"><path d="M0,0 L10,5 L0,10 z" class="aaa-arrow-taken"/>'
            "</marker></defs>"
        )
    ]
    # arcs (a loop, an edge back) go over the boxes: over the first row, they need room
    arcs = [e for e in picture.edges if nodes[e.dst].rank < nodes[e.src].rank or e.src == e.dst]
    first_row = any(min(nodes[e.src].row, nodes[e.dst].row) == 0 for e in arcs)
    top = G_TOP + 8 * max(len(arcs) - 1, 0) if first_row else G_PAD
    back = 0
    for e in sorted(picture.edges, key=lambda e: e.taken > 0):  # the path's edges on top
        a, b = nodes[e.src], nodes[e.dst]
        is_back = b.rank < a.rank
        d, lx, ly = _edge_path(a, b, back, top)
        back += is_back
        label = e.label + (f" ×{e.taken}" if e.taken > 1 else "")
        parts.append(
            format_html(
                '<g class="aaa-edge aaa-edge-{}{}" data-src="{}" data-dst="{}" data-taken="{}">'
                "<title>{} → {}{}: {}</title>"
                '<path d="{}" marker-end="url(#{})"/>'
                '<text x="{}" y="{}" text-anchor="middle" class="aaa-edge-label">{}</text></g>',
                e.kind,
                " aaa-edge-taken" if e.taken else "",
                e.src,
                e.dst,
                e.taken,
                e.src,
                e.dst,
                f" ({e.label})" if e.label else "",
                f"taken {e.taken}×" if e.taken else "not taken",
                d,
                "aaa-arrow-taken" if e.taken else "aaa-arrow",
                f"{lx:.1f}",
                f"{ly:.1f}",
                _cut(label, 28),
            )
        )
    for n in picture.nodes:
        x, y = _box(n, top)
        steps = " ".join(f"#{s}" for s in n.steps[:3]) + (" …" if len(n.steps) > 3 else "")
        parts.append(
            format_html(
                '<g class="aaa-node aaa-node-{} aaa-kind-{}" data-node="{}" data-status="{}" data-steps="{}">'
                "<title>{} ({}): {}{}</title>"
                '<rect x="{}" y="{}" width="{}" height="{}" rx="6"/>'
                '<text x="{}" y="{}" class="aaa-node-name">{}</text>'
                '<text x="{}" y="{}" class="aaa-node-detail">{}</text>'
                '<text x="{}" y="{}" text-anchor="end" class="aaa-node-steps">{}</text></g>',
                n.status,
                n.kind,
                n.id,
                n.status,
                ",".join(map(str, n.steps)),
                n.id,
                n.detail,
                dict(STATUSES)[n.status],
                f", reached at step {', '.join(map(str, n.steps))}" if n.steps else "",
                f"{x:.1f}",
                f"{y:.1f}",
                G_W,
                G_H,
                f"{x + 8:.1f}",
                f"{y + 17:.1f}",
                _cut(n.id, 16),
                f"{x + 8:.1f}",
                f"{y + 33:.1f}",
                _cut(n.detail, 22),
                f"{x + G_W - 6:.1f}",
                f"{y + 17:.1f}",
                steps,
            )
        )
    columns = max((n.rank for n in picture.nodes), default=0) + 1
    rows = max((n.row for n in picture.nodes), default=0) + 1
    width = max(2 * G_PAD + columns * (G_W + G_GAP_X) - G_GAP_X, 560)
    y = top + rows * (G_H + G_GAP_Y) - G_GAP_Y + G_BOTTOM
    x = G_PAD
    for status, label in STATUSES:  # the legend
        parts.append(
            format_html(
                '<g class="aaa-node aaa-node-{}"><rect x="{}" y="{}" width="12" height="12" rx="2"/></g>'
                '<text x="{}" y="{}" class="aaa-axis">{}</text>',
                status,
                x,
                y,
                x + 16,
                y + 10,
                label,
            )
        )
        x += 24 + 6.2 * len(label)
    path = list(picture.path)
    shown = path if len(path) <= 12 else [*path[:8], "…", *path[-3:]]
    parts.append(
        format_html(
            '<text x="{}" y="{}" class="aaa-graph-path">{}</text>',
            G_PAD,
            y + 28,
            f"path: {' → '.join(shown)}" if path else "nothing started yet",
        )
    )
    if picture.note:
        parts.append(format_html('<text x="{}" y="{}" class="aaa-graph-note">{}</text>', G_PAD, y + 44, picture.note))
    height = y + G_LEGEND + (12 if picture.note else 0)
    return format_html(
        '<svg class="aaa-graph" role="img" aria-label="The {} and the path the run took" '
        'data-kind="{}" width="{}" height="{}" viewBox="0 0 {} {}" xmlns="http://www.w3.org/2000/svg">{}</svg>',
        "workflow" if picture.kind == "workflow" else "state machine",
        picture.kind,
        width,
        height,
        width,
        height,
        format_html_join("", "{}", ((p,) for p in parts)),
    )
