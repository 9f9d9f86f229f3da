"""Pictures on the admin's run page, drawn here as inline SVG (no script, no CDN).

- :func:`budget_bars`: a bar per budgeted dimension (tokens, cost, model calls, tool
  calls), how much of its limit the run has used; amber from 80 %, red over the limit.

Every text in a picture is escaped (``format_html``); the pictures carry ``<title>``s,
so a screen reader and a hover say what a bar is.
"""

from __future__ import annotations

from typing import Any

from django.utils.html import format_html, format_html_join
from django.utils.safestring import SafeString

#: (dimension, label) in the order the bars are drawn
DIMENSIONS = (("tokens", "tokens"), ("cost", "cost"), ("model_calls", "model calls"),
              ("tool_calls", "tool calls"))
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
        parts.append(format_html(
            '<g class="aaa-bar aaa-{}" data-dimension="{}" data-share="{}">'
            "<title>{}: {}</title>"
            '<text x="0" y="{}" class="aaa-bar-label">{}</text>'
            '<rect x="{}" y="{}" width="{}" height="12" rx="2" class="aaa-bar-track"/>'
            '<rect x="{}" y="{}" width="{}" height="12" rx="2" class="aaa-bar-fill"/>'
            '<text x="{}" y="{}" class="aaa-bar-value">{}</text></g>',
            state, dimension, f"{share:.4f}", label, text,
            y + 15, label,
            LABEL, y + 5, track,
            LABEL, y + 5, f"{track * min(share, 1.0):.1f}",
            LABEL + track + 6, y + 15, text,
        ))
    height = len(rows) * ROW
    return format_html(
        '<svg class="aaa-budget" role="img" aria-label="Budget use" width="{}" height="{}" '
        'viewBox="0 0 {} {}" xmlns="http://www.w3.org/2000/svg">{}</svg>',
        WIDTH, height, WIDTH, height, format_html_join("", "{}", ((p,) for p in parts)),
    )
