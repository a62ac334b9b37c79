"""What the search reports: the leaderboard, what pruning saved against training every trial to the end, and the
metric-against-spend chart. Pure functions of the trials' states (and their rung results' times and spend).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any
from xml.sax.saxutils import escape

from pydantic import BaseModel

from thrifty.numbers import metric as fmt_metric
from thrifty.report.chart import HEIGHT, PAD_B, PAD_L, PAD_R, PAD_T, TEXT, WIDTH, fmt_usd, frame, scale
from thrifty.sweep.scheduler import TrialState

POINT_COLOUR, BEST_COLOUR = "#2563eb", "#16a34a"


class Saving(BaseModel):
    """The search's spend against every trial it drew trained to the full budget (each priced from what its own
    epochs cost, or what its shape's trials measured when it never trained)."""

    spent_usd: float
    full_usd: float  # every trial drawn, trained to max_epochs (finished ones at what they cost)
    trials: int  # the trials counted: every one drawn (paused, out of budget, pruned, failed and never run too)

    @property
    def saved_usd(self) -> float:
        return max(0.0, self.full_usd - self.spent_usd)

    @property
    def saved_fraction(self) -> float:
        return self.saved_usd / self.full_usd if self.full_usd > 0 else 0.0


def saving(trials: list[TrialState], full_epochs: int) -> Saving:
    """Every trial the search drew, trained on in one go to the full budget: what it spent plus its remaining epochs
    at its own measured cost per epoch (the median of the measured trials' for one that never measured one: never
    launched, refused for money, stopped before its first epoch). A trial that finished cost what it cost."""
    measured = sorted(t.epoch_usd for t in trials if t.epoch_usd > 0)
    typical = measured[len(measured) // 2] if measured else 0.0
    full = sum(t.spent_usd + (0 if t.status == "finished" else
                              max(0, full_epochs - t.reached) * (t.epoch_usd or typical)) for t in trials)
    return Saving(spent_usd=sum(t.spent_usd for t in trials), full_usd=full, trials=len(trials))


def leaderboard(trials: list[TrialState], mode: str, metric: str) -> list[dict[str, Any]]:
    """One row per trial that was drawn, the best first: its values, the rung it reached, its metric there, cost,
    the search's cumulative spend in trial order, and how it ended."""
    sign = 1.0 if mode == "min" else -1.0

    def key(t: TrialState) -> tuple:
        score = t.ranking_value()
        return (t.status != "finished", -t.reached, sign * score if score is not None else float("inf"), t.index)

    cumulative, rows = 0.0, []
    spent_before = {}
    for t in sorted(trials, key=lambda t: t.index):
        cumulative += t.spent_usd
        spent_before[t.index] = cumulative
    for t in sorted(trials, key=key):
        score = t.ranking_value()
        rows.append({"trial": t.run_name, **{k: v for k, v in t.values.items()}, "epochs": t.reached,
                     metric: round(score, 5) if score is not None else None, "cost $": round(t.spent_usd, 6),
                     "cumulative $": round(spent_before[t.index], 6), "state": t.status, "note": t.note})
    return rows


@dataclass(frozen=True)
class ChartPoint:
    spend_usd: float  # the search's cumulative spend when this result came in
    value: float  # the metric
    label: str


def svg(points: list[ChartPoint], mode: str, metric: str, max_usd: float | None = None) -> str:
    """Each rung result as a dot at the search's spend when it came in, and the best so far as a step line."""
    if not points:
        return ""
    points = sorted(points, key=lambda p: p.spend_usd)
    top_usd = max(max(p.spend_usd for p in points) * 1.05, 1e-12)  # the points fill the axis; the cap is in words
    x = scale(0.0, top_usd, PAD_L, WIDTH - PAD_R)
    lo, hi = min(p.value for p in points), max(p.value for p in points)
    y = scale(lo, hi, HEIGHT - PAD_B, PAD_T)
    better = (lambda a, b: a < b) if mode == "min" else (lambda a, b: a > b)
    best, line = None, []
    for p in points:
        if best is None or better(p.value, best):
            if best is not None:
                line.append(f"{x(p.spend_usd):.1f},{y(best):.1f}")
            best = p.value
        line.append(f"{x(p.spend_usd):.1f},{y(best):.1f}")
    bottom, right = HEIGHT - PAD_B, WIDTH - PAD_R
    text = TEXT
    parts = frame(POINT_COLOUR) + [
        f'<text x="{PAD_L}" y="18" {text} fill="{POINT_COLOUR}">{escape(metric)} at each milestone; best so far '
        f'{fmt_metric(best)}</text>',
        f'<text x="{PAD_L - 6}" y="{PAD_T + 4}" {text} fill="{POINT_COLOUR}" text-anchor="end">{hi:.3g}</text>',
        f'<text x="{PAD_L - 6}" y="{bottom}" {text} fill="{POINT_COLOUR}" text-anchor="end">{lo:.3g}</text>',
        f'<text x="{PAD_L}" y="{HEIGHT - 12}" {text} fill="#374151">$0</text>',
        f'<text x="{(PAD_L + right) / 2:.0f}" y="{HEIGHT - 12}" {text} fill="#374151" text-anchor="middle">'
        "the search's cumulative spend</text>",
        f'<text x="{right}" y="{HEIGHT - 12}" {text} fill="#374151" text-anchor="end">{escape(fmt_usd(top_usd))}'
        + (f" (cap {escape(fmt_usd(max_usd))})" if max_usd else "") + "</text>",
        f'<polyline points="{" ".join(line)}" fill="none" stroke="{BEST_COLOUR}" stroke-width="2"/>',
    ]
    parts += [f'<circle cx="{x(p.spend_usd):.1f}" cy="{y(p.value):.1f}" r="3.5" fill="{POINT_COLOUR}">'
              f'<title>{escape(p.label)}</title></circle>' for p in points]
    return "".join(parts + ["</svg>"])


class SweepResult(BaseModel):
    """The sweep flow's return value (what ``thrifty sweep`` prints)."""

    name: str
    metric: str
    mode: str
    best_run: str | None = None
    best_values: dict[str, Any] = {}
    best_value: float | None = None
    best_epochs: int = 0
    best_config: dict[str, Any] | None = None  # the winner's RunConfig as JSON, to train or deploy
    gold: str | None = None  # the key prefix marked gold (kept hot by archival)
    spent_usd: float
    max_usd: float
    full_usd: float  # the same trials, each trained to max_epochs
    saved_fraction: float
    leaderboard: list[dict[str, Any]]
