"""Tokens and cost per day over the run list, drawn as inline SVG (no script, no CDN).

- :func:`spend_per_day`: one aggregate query over the run index (``aaa_run`` keeps each
  run's spend, so nothing is folded at request time): the runs the list shows (its
  filters, search, date drill-down and who may see what) grouped by the day they
  started, in the site's time zone.
- :func:`buckets`: those days on a continuous axis (a day without runs is a zero), by
  week or by month when the range is too long for a bar per day.
- :func:`spend_chart`: the SVG: input and output tokens stacked, and cost, per bar; an
  empty list is drawn too (the axes and a line saying no run matches).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import date, timedelta

from django.db.models import Count, QuerySet, Sum
from django.db.models.functions import TruncDate
from django.utils.html import format_html, format_html_join
from django.utils.safestring import SafeString

#: bars drawn at most: past this many days the chart goes by week, then by month
MAX_BARS = 62
WIDTH, LEFT, RIGHT = 760, 64, 8
TOKENS_TOP, TOKENS_H, COST_TOP, COST_H, AXIS = 20, 100, 148, 60, 222


@dataclass(frozen=True)
class Spend:
    """What the runs that started in one period (a day, a week or a month) spent."""

    start: date
    runs: int = 0
    tokens_in: int = 0
    tokens_out: int = 0
    cost: float = 0.0

    @property
    def tokens(self) -> int:
        return self.tokens_in + self.tokens_out


def spend_per_day(runs: QuerySet) -> list[Spend]:
    """The spend of ``runs`` (a ``RunRecord`` queryset, filtered as the list is) per
    day they started, oldest first; days without runs are absent. One query:
    ``SELECT day, COUNT, SUM(...) ... GROUP BY day`` over the rows the filters keep."""
    rows = (
        runs.order_by()
        .annotate(day=TruncDate("started_at"))
        .values("day")
        .annotate(n=Count("pk"), tin=Sum("tokens_in"), tout=Sum("tokens_out"), usd=Sum("cost"))
        .order_by("day")
        .values_list("day", "n", "tin", "tout", "usd")
    )
    return [Spend(day, n, tin or 0, tout or 0, usd or 0.0) for day, n, tin, tout, usd in rows]


def _week(d: date) -> date:
    return d - timedelta(days=d.weekday())


def _month(d: date) -> date:
    return d.replace(day=1)


def _next(d: date, unit: str) -> date:
    if unit == "day":
        return d + timedelta(days=1)
    if unit == "week":
        return d + timedelta(days=7)
    return (d.replace(day=28) + timedelta(days=4)).replace(day=1)


def buckets(days: list[Spend]) -> tuple[str, list[Spend]]:
    """``days`` (from :func:`spend_per_day`) on a continuous axis from the first to the
    last: ``("day", [...])``, or by ``"week"`` (from Mondays) or ``"month"`` when a bar
    per day would be more than ``MAX_BARS``."""
    if not days:
        return "day", []
    first, last = days[0].start, days[-1].start
    unit, key = "day", (lambda d: d)
    if (last - first).days + 1 > MAX_BARS:
        unit, key = "week", _week
        if (_week(last) - _week(first)).days // 7 + 1 > MAX_BARS:
            unit, key = "month", _month
    sums: dict[date, list] = {}
    for d in days:
        s = sums.setdefault(key(d.start), [0, 0, 0, 0.0])
        s[0] += d.runs
        s[1] += d.tokens_in
        s[2] += d.tokens_out
        s[3] += d.cost
    out, at = [], key(first)
    while at <= last:
        out.append(Spend(at, *sums.get(at, (0, 0, 0, 0.0))))
        at = _next(at, unit)
    return unit, out


def _tokens(n: float) -> str:
    for size, suffix in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
        if n >= size:
            return f"{n / size:.3g}{suffix}"
    return f"{n:.0f}"


def _usd(x: float) -> str:
    return f"${x:,.2f}" if x >= 1 else f"${x:.4f}" if x else "$0"


def _label(start: date, unit: str) -> str:
    return {"day": start.isoformat(), "week": f"week of {start.isoformat()}", "month": start.strftime("%Y-%m")}[unit]


def spend_chart(days: list[Spend]) -> SafeString:
    """The SVG of :func:`buckets` of ``days``: tokens (in and out, stacked) above cost,
    a bar per period; each bar's ``<title>`` says its runs, tokens and cost."""
    unit, bars = buckets(days)
    track = WIDTH - LEFT - RIGHT
    parts: list[SafeString] = [
        format_html(
            '<text x="0" y="12" class="aaa-chart-title">tokens per {} '
            '(<tspan class="aaa-tokens-in-key">■ in</tspan> <tspan class="aaa-tokens-out-key">■ out</tspan>)</text>'
            '<text x="0" y="{}" class="aaa-chart-title">cost per {}</text>',
            unit,
            COST_TOP - 8,
            unit,
        )
    ]
    for top, height in ((TOKENS_TOP, TOKENS_H), (COST_TOP, COST_H)):
        parts.append(
            format_html(
                '<line x1="{}" x2="{}" y1="{}" y2="{}" class="aaa-grid-line"/>'
                '<line x1="{}" x2="{}" y1="{}" y2="{}" class="aaa-grid-line"/>',
                LEFT,
                WIDTH - RIGHT,
                top,
                top,
                LEFT,
                WIDTH - RIGHT,
                top + height,
                top + height,
            )
        )
    if not bars:
        parts.append(
            format_html(
                '<text x="{}" y="{}" class="aaa-axis aaa-chart-empty" text-anchor="middle">'
                "No runs match: nothing spent.</text>",
                LEFT + track / 2,
                TOKENS_TOP + TOKENS_H / 2,
            )
        )
        return _svg(parts, 0, unit)
    most_tokens = max(b.tokens for b in bars) or 1
    most_cost = max(b.cost for b in bars) or 1.0
    parts.append(
        format_html(
            '<text x="{}" y="{}" class="aaa-axis" text-anchor="end">{}</text>'
            '<text x="{}" y="{}" class="aaa-axis" text-anchor="end">0</text>'
            '<text x="{}" y="{}" class="aaa-axis" text-anchor="end">{}</text>'
            '<text x="{}" y="{}" class="aaa-axis" text-anchor="end">$0</text>',
            LEFT - 4,
            TOKENS_TOP + 9,
            _tokens(most_tokens),
            LEFT - 4,
            TOKENS_TOP + TOKENS_H,
            LEFT - 4,
            COST_TOP + 9,
            _usd(most_cost),
            LEFT - 4,
            COST_TOP + COST_H,
        )
    )
    step = track / len(bars)
    gap = 1.0 if step > 3 else 0.0
    for i, b in enumerate(bars):
        x = LEFT + i * step
        h_in = TOKENS_H * b.tokens_in / most_tokens
        h_out = TOKENS_H * b.tokens_out / most_tokens
        h_cost = COST_H * b.cost / most_cost
        title = (
            f"{_label(b.start, unit)}: {b.runs:,} run{'s' if b.runs != 1 else ''}, "
            f"{b.tokens:,} tokens ({b.tokens_in:,} in / {b.tokens_out:,} out), {_usd(b.cost)}"
        )
        parts.append(
            format_html(
                '<g class="aaa-period" data-start="{}" data-runs="{}" data-tokens="{}" data-cost="{}">'
                "<title>{}</title>"
                '<rect x="{}" y="{}" width="{}" height="{}" class="aaa-period-hover"/>'
                '<rect x="{}" y="{}" width="{}" height="{}" class="aaa-tokens-in"/>'
                '<rect x="{}" y="{}" width="{}" height="{}" class="aaa-tokens-out"/>'
                '<rect x="{}" y="{}" width="{}" height="{}" class="aaa-cost"/></g>',
                b.start.isoformat(),
                b.runs,
                b.tokens,
                f"{b.cost:.6f}",
                title,
                f"{x:.1f}",
                TOKENS_TOP,
                f"{step:.1f}",
                COST_TOP + COST_H - TOKENS_TOP,
                f"{x:.1f}",
                f"{TOKENS_TOP + TOKENS_H - h_in:.1f}",
                f"{step - gap:.1f}",
                f"{h_in:.1f}",
                f"{x:.1f}",
                f"{TOKENS_TOP + TOKENS_H - h_in - h_out:.1f}",
                f"{step - gap:.1f}",
                f"{h_out:.1f}",
                f"{x:.1f}",
                f"{COST_TOP + COST_H - h_cost:.1f}",
                f"{step - gap:.1f}",
                f"{h_cost:.1f}",
            )
        )
    ticks = sorted({0, len(bars) // 2, len(bars) - 1})
    for i in ticks:
        anchor = "start" if i == 0 else "end" if i == len(bars) - 1 else "middle"
        x = LEFT + i * step + (step / 2 if anchor == "middle" else step if anchor == "end" else 0)
        parts.append(
            format_html(
                '<text x="{}" y="{}" class="aaa-axis" text-anchor="{}">{}</text>',
                f"{x:.1f}",
                AXIS - 4,
                anchor,
                _label(bars[i].start, unit),
            )
        )
    return _svg(parts, len(bars), unit)


def _svg(parts: Iterable[SafeString], bars: int, unit: str) -> SafeString:
    return format_html(
        '<svg class="aaa-spend" role="img" aria-label="Tokens and cost per {}" data-unit="{}" '
        'data-bars="{}" width="{}" height="{}" viewBox="0 0 {} {}" xmlns="http://www.w3.org/2000/svg">{}</svg>',
        unit,
        unit,
        bars,
        WIDTH,
        AXIS,
        WIDTH,
        AXIS,
        format_html_join("", "{}", ((p,) for p in parts)),
    )
