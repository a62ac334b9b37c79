"""The loss-and-spend chart of a run: its training curve (one point per step, the attempt that survived winning)
and the run's cumulative spend as training went on, drawn as a small SVG against the optimizer step.

The Prefect UI (3.8.8) strips inline ``<svg>`` from markdown artifacts but shows a markdown image whose source is
a ``data:image/svg+xml;base64`` URI, so :func:`markdown_image` is how the report embeds it (checked in a real
browser by tests/test_ui_browser.py). Pure functions, no plotting library.
"""

from __future__ import annotations

import base64
import math
from dataclasses import dataclass
from typing import Any, Iterable
from xml.sax.saxutils import escape

from thrifty.money.budget import spend_usd
from thrifty.numbers import metric
from thrifty.money.ledger import Attempt

WIDTH, HEIGHT = 640, 240
PAD_L, PAD_R, PAD_T, PAD_B = 56, 80, 28, 36  # room for the loss axis (left), the spend axis (right), title, time axis
LOSS_COLOUR, SPEND_COLOUR, EVAL_COLOUR = "#2563eb", "#d97706", "#059669"


@dataclass(frozen=True)
class Point:
    step: int
    time_unix: float
    loss: float
    spend_usd: float


def training_curve(metrics: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    """One loss record per step, in step order. A preempted attempt logs steps past its last checkpoint that the
    resumed attempt trains again: the later record of a step (the one the final weights descend from) wins."""
    by_step: dict[int, dict[str, Any]] = {}
    for rec in sorted((m for m in metrics if m.get("event") is None and "loss" in m and "step" in m),
                      key=lambda m: m.get("time_unix", 0.0)):
        by_step[int(rec["step"])] = rec
    return [by_step[s] for s in sorted(by_step)]


def spend_at(attempts: list[Attempt], t: float) -> float:
    """Dollars the run's attempts had cost by wall time ``t``."""
    return sum(a.cost_usd(now=t, until=t) for a in attempts if a.started_unix <= t)  # each interval at its price


def sample(rows: list[Any], points: int) -> list[Any]:
    """Up to ``points`` rows spread evenly, always the first and the last, none twice."""
    if len(rows) <= points:
        return list(rows)
    picked = sorted({round(i * (len(rows) - 1) / (points - 1)) for i in range(points)})
    return [rows[i] for i in picked]


def series(metrics: Iterable[dict[str, Any]], attempts: list[Attempt]) -> list[Point]:
    """The curve with the spend at each logged step; once every attempt has ended, a last point at the run's end
    carries what it spent in all (the ledger's figure: evaluation, the final checkpoint and shutdown come after the
    last logged step)."""
    points = [Point(int(r["step"]), float(r["time_unix"]), float(r["loss"]), spend_at(attempts, r["time_unix"]))
              for r in training_curve(metrics)]
    if points and attempts and all(a.ended_unix is not None for a in attempts):
        end = max(a.ended_unix for a in attempts if a.ended_unix is not None)
        total = spend_usd(attempts, end)
        if end > points[-1].time_unix and total > points[-1].spend_usd:
            points.append(Point(points[-1].step, end, points[-1].loss, total))
    return points


def scale(lo: float, hi: float, a: float, b: float):
    span = hi - lo or 1.0
    return lambda v: a + (v - lo) / span * (b - a)


TEXT = 'font-family="sans-serif" font-size="12"'  # the attributes of every label


def frame(left_axis_colour: str) -> list[str]:
    """The opening of a chart: the SVG element, a white ground, the x axis and the left axis in its series'
    colour (close it with ``</svg>``)."""
    bottom, right = HEIGHT - PAD_B, WIDTH - PAD_R
    return [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{HEIGHT}" viewBox="0 0 {WIDTH} {HEIGHT}">',
        f'<rect width="{WIDTH}" height="{HEIGHT}" fill="#ffffff"/>',
        f'<line x1="{PAD_L}" y1="{bottom}" x2="{right}" y2="{bottom}" stroke="#9ca3af"/>',
        f'<line x1="{PAD_L}" y1="{PAD_T}" x2="{PAD_L}" y2="{bottom}" stroke="{left_axis_colour}"/>',
    ]


def fmt_usd(v: float) -> str:
    return f"${v:.2f}" if v >= 1 else f"${v:.4f}" if v >= 0.0001 else f"${v:.6f}"


def _fmt_minutes(seconds: float) -> str:
    return f"{seconds / 60:.1f} min" if seconds >= 60 else f"{seconds:.0f} s"


def eval_curve(metrics: Iterable[dict[str, Any]]) -> tuple[str, list[tuple[int, float]]]:
    """The validation loss at each evaluated step (the later record of a step wins, as in the training curve): the
    first evaluation split's loss (``val_loss`` for most recipes), with its name."""
    evals = sorted((m for m in metrics if m.get("event") == "eval" and "step" in m), key=lambda m: m.get("time_unix", 0.0))
    names = [k for k in (evals[0] if evals else {}) if k.endswith("_loss")]
    if not names:
        return "", []
    name = "val_loss" if "val_loss" in names else names[0]
    by_step = {int(m["step"]): float(m[name]) for m in evals if isinstance(m.get(name), (int, float))}
    return name, sorted((s, v) for s, v in by_step.items() if math.isfinite(v))


CAP_ON_CHART = 4.0  # the cap is drawn as a line while it is at most this many times the run's spend
DECADES_FOR_LOG = 10.0  # a loss axis spanning this ratio or more is drawn on a log scale


def _loss_axis(values: list[float]) -> tuple[Any, float, float, bool]:
    """(value -> y, lowest, highest, log) over ``values``: linear, or log10 when they span a decade or more."""
    lo, hi = min(values), max(values)
    log = lo > 0 and hi / lo >= DECADES_FOR_LOG
    if log:
        to_y = scale(math.log10(lo), math.log10(hi), HEIGHT - PAD_B, PAD_T)
        return (lambda v: to_y(math.log10(max(v, lo)))), lo, hi, True
    return scale(lo, hi, HEIGHT - PAD_B, PAD_T), lo, hi, False


def svg(points: list[Point], max_usd: float | None = None, resumed_at_steps: Iterable[int] = (),
        evals: list[tuple[int, float]] = (), eval_name: str = "val_loss") -> str:
    """Training loss and the validation loss (left axis, log scale when they span a decade) and cumulative spend
    (right axis, with the cap as a dashed line when it is within reach) against the optimizer step, with the wall
    time the steps took; dashed verticals where an attempt resumed (spend jumps there: the restart was paid for)."""
    if not points:
        return ""
    t0 = points[0].time_unix
    t1 = max(p.time_unix for p in points)
    first, last = points[0].step, points[-1].step
    x = scale(first, last, PAD_L, WIDTH - PAD_R)
    evals = [(s, v) for s, v in evals if first <= s <= last]
    y_loss, lo, hi, log = _loss_axis([p.loss for p in points] + [v for _, v in evals])
    spent = max(max(p.spend_usd for p in points), 1e-12)
    cap_drawn = bool(max_usd) and max_usd <= CAP_ON_CHART * spent
    top_usd = max(spent, max_usd * 1.05) if cap_drawn else spent
    y_usd = scale(0.0, top_usd, HEIGHT - PAD_B, PAD_T)
    loss_line = " ".join(f"{x(p.step):.1f},{y_loss(p.loss):.1f}" for p in points)
    spend_line = " ".join(f"{x(p.step):.1f},{y_usd(p.spend_usd):.1f}" for p in points)
    bottom, right = HEIGHT - PAD_B, WIDTH - PAD_R
    text = TEXT
    budget = ""
    if max_usd:
        budget = f" of {escape(fmt_usd(max_usd))} cap" + ("" if cap_drawn else " (above the chart)")
    parts = frame(LOSS_COLOUR) + [
        f'<line x1="{right}" y1="{PAD_T}" x2="{right}" y2="{bottom}" stroke="{SPEND_COLOUR}"/>',
        f'<text x="{PAD_L}" y="18" {text} fill="{LOSS_COLOUR}">loss {metric(points[0].loss)} → '
        f'{metric(points[-1].loss)}' + (f'; {escape(eval_name)} {metric(evals[-1][1])}' if evals else "")
        + f' (step {points[-1].step})</text>',
        f'<text x="{right}" y="18" {text} fill="{SPEND_COLOUR}" text-anchor="end">spend '
        f'{escape(fmt_usd(points[-1].spend_usd))}{budget}</text>',
        f'<text x="{PAD_L - 6}" y="{PAD_T + 4}" {text} fill="{LOSS_COLOUR}" text-anchor="end">{metric(hi)}</text>',
        f'<text x="{PAD_L - 6}" y="{bottom}" {text} fill="{LOSS_COLOUR}" text-anchor="end">{metric(lo)}</text>',
        f'<text x="14" y="{(PAD_T + bottom) / 2:.0f}" {text} fill="{LOSS_COLOUR}" text-anchor="middle" '
        f'transform="rotate(-90 14 {(PAD_T + bottom) / 2:.0f})">loss{" (log scale)" if log else ""}</text>',
        f'<text x="{right + 6}" y="{PAD_T + 4}" {text} fill="{SPEND_COLOUR}">{escape(fmt_usd(top_usd))}</text>',
        f'<text x="{right + 6}" y="{bottom}" {text} fill="{SPEND_COLOUR}">$0</text>',
        f'<text x="{WIDTH - 8}" y="{(PAD_T + bottom) / 2:.0f}" {text} fill="{SPEND_COLOUR}" text-anchor="middle" '
        f'transform="rotate(90 {WIDTH - 8} {(PAD_T + bottom) / 2:.0f})">spend (USD)</text>',
        f'<text x="{PAD_L}" y="{HEIGHT - 12}" {text} fill="#374151">step {first}</text>',
        f'<text x="{(PAD_L + right) / 2:.0f}" y="{HEIGHT - 12}" {text} fill="#374151" text-anchor="middle">'
        f'optimizer step; {escape(_fmt_minutes(t1 - t0))} of wall time</text>',
        f'<text x="{right}" y="{HEIGHT - 12}" {text} fill="#374151" text-anchor="end">step {last}</text>',
    ]
    if cap_drawn:
        parts += [f'<line x1="{PAD_L}" y1="{y_usd(max_usd):.1f}" x2="{right}" y2="{y_usd(max_usd):.1f}" '
                  f'stroke="{SPEND_COLOUR}" stroke-dasharray="6 4"/>',
                  f'<text x="{right - 4}" y="{y_usd(max_usd) + 14:.1f}" {text} fill="{SPEND_COLOUR}" '
                  f'text-anchor="end">cap {escape(fmt_usd(max_usd))}</text>']
    for step in resumed_at_steps:
        if first < step <= last:
            parts.append(f'<line x1="{x(step):.1f}" y1="{PAD_T}" x2="{x(step):.1f}" y2="{bottom}" stroke="#6b7280" '
                         f'stroke-dasharray="4 3"/>')
            parts.append(f'<text x="{x(step) + 4:.1f}" y="{bottom - 6}" {text} fill="#6b7280">resumed</text>')
    parts += [
        f'<polyline points="{spend_line}" fill="none" stroke="{SPEND_COLOUR}" stroke-width="2"/>',
        f'<polyline points="{loss_line}" fill="none" stroke="{LOSS_COLOUR}" stroke-width="2"/>',
    ]
    if evals:
        parts.append(f'<polyline points="{" ".join(f"{x(s):.1f},{y_loss(v):.1f}" for s, v in evals)}" fill="none" '
                     f'stroke="{EVAL_COLOUR}" stroke-width="2" stroke-dasharray="5 3"/>')
        parts += [f'<circle cx="{x(s):.1f}" cy="{y_loss(v):.1f}" r="2.5" fill="{EVAL_COLOUR}"/>' for s, v in evals]
        parts.append(f'<text x="{PAD_L + 6}" y="{PAD_T + 14}" {text} fill="{EVAL_COLOUR}">- - {escape(eval_name)}'
                     f'</text>')
    return "".join(parts + ["</svg>"])


def markdown_image(svg_text: str, alt: str) -> str:
    """A markdown image of ``svg_text`` as a data URI: what the Prefect UI renders (inline SVG it strips)."""
    return f"![{alt}](data:image/svg+xml;base64,{base64.b64encode(svg_text.encode()).decode()})"
