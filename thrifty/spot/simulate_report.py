"""``thrifty simulate``'s output: the table per checkpoint interval, and the chart as a hand-written SVG."""

from __future__ import annotations

import math
from html import escape

from thrifty.spot.simulate import Simulation
from thrifty.numbers import money


def _h(seconds: float) -> str:
    return f"{seconds / 3600:.3f}" if math.isfinite(seconds) else "never"


def _every(seconds: float) -> str:
    if seconds < 60:
        return f"{seconds:.3g} s"
    return f"{seconds / 60:.3g} min" if seconds < 5400 else f"{seconds / 3600:.3g} h"


TIME_TICKS_S = (1, 2, 5, 10, 20, 30, 60, 120, 300, 600, 1200, 1800, 3600, 7200, 18000, 36000, 86400)


def _nice(raw: float) -> float:
    """The round step (1, 2 or 5 times a power of ten) at or above ``raw``."""
    mag = 10 ** math.floor(math.log10(raw)) if raw > 0 else 1.0
    return next(m * mag for m in (1, 2, 5, 10) if m * mag >= raw)


def table_text(sim: Simulation) -> str:
    """The table (one row per interval, on-demand last), the chosen interval and how it compares."""
    p = sim.plan
    daly = any(r.daly_wall_s is not None for r in sim.results)
    head = (f"{'every (steps)':>13} {'every':>10} {'wall h':>8} {'+-95%':>7} {'p90 h':>8} "
            + (f"{'Daly h':>8} " if daly else "") + f"{'$':>9} {'lost h':>7} {'restarts':>8}")
    lines = [
        f"run: {p.total_steps} steps x {p.step_s:.4g} s = {p.work_s / 3600:.3f} h of compute; save {p.save_s:.4g} s, "
        f"restart {p.restart_s:.4g} s; spot ${p.spot_usd_per_hour:.4g}/h, on-demand ${p.on_demand_usd_per_hour:.4g}/h",
        f"preemptions: {sim.model_text}; {sim.trials} trials per interval, seed {sim.seed}",
        *sim.notes, "", head]
    for r in sim.results:
        mark = "  <- chosen" if r is sim.chosen else ("  (Daly)" if r.interval_steps == sim.daly_steps else "")
        lines.append(
            f"{r.interval_steps:>13} {_every(r.interval_s):>10} {_h(r.wall_s):>8} {1.96 * r.wall_stderr_s / 3600:>7.3f} "
            f"{_h(r.wall_p90_s):>8} " + (f"{_h(r.daly_wall_s or math.nan):>8} " if daly else "")
            + (f"{r.usd:>9.3f}" if r.finishes else f"{'never':>9}") + f" {r.lost_s / 3600:>7.3f} {r.restarts:>8.2f}"
            + mark)
    c = sim.chosen
    lines.append(f"{'on-demand':>13} {_every(c.interval_s):>10} {_h(sim.on_demand_wall_s):>8} {0:>7.3f} "
                 f"{_h(sim.on_demand_wall_s):>8} " + (f"{_h(sim.on_demand_wall_s):>8} " if daly else "")
                 + f"{sim.on_demand_usd:>9.3f} {0:>7.3f} {0:>8.2f}")
    saved = 1 - c.usd / sim.on_demand_usd if sim.on_demand_usd else 0.0
    lines += ["", f"chosen: checkpoint_every: {c.interval_steps} (~{_every(c.interval_s)} of compute): expected "
                  f"{c.wall_s / 3600:.3f} h and {money(c.usd)} on spot, {c.restarts:.1f} preemptions, "
                  f"{c.lost_s / 3600:.3f} h lost; on-demand {money(sim.on_demand_usd)} in {sim.on_demand_wall_s / 3600:.3f} h "
                  f"({saved:.0%} {'saved' if saved >= 0 else 'more'} on spot). Daly's interval for a mean of "
                  f"{sim.mean_between_s / 3600:.2f} h: {sim.daly_steps} steps."]
    if c.daly_wall_s is not None:
        worst = max(abs(r.wall_s / r.daly_wall_s - 1) for r in sim.results if r.finishes and r.daly_wall_s)
        lines.append(f"check: simulated wall time within {worst:.2%} of Daly's closed form at every interval.")
    return "\n".join(lines) + "\n"


def chart_svg(sim: Simulation, width: int = 720, height: int = 420) -> str:
    """Expected dollars against the checkpoint interval (log scale): simulated points, Daly's closed form where it
    applies, the on-demand cost as a dashed line, the chosen interval marked."""
    rows = [r for r in sim.results if r.finishes]
    left, right, top, bottom = 70, 20, 40, 55
    pw, ph = width - left - right, height - top - bottom
    xs = [math.log10(r.interval_s) for r in rows]
    x0, x1 = min(xs), max(xs) if max(xs) > min(xs) else min(xs) + 1
    ys = [r.usd for r in rows] + [sim.on_demand_usd] + [r.daly_wall_s / 3600 * sim.plan.spot_usd_per_hour
                                                        for r in rows if r.daly_wall_s]
    y0, y1 = 0.0, max(ys) * 1.08

    def px(x: float) -> float:
        return left + (x - x0) / (x1 - x0) * pw

    def py(y: float) -> float:
        return top + ph - (y - y0) / (y1 - y0) * ph

    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" font-family="sans-serif" '
           f'font-size="12"><rect width="100%" height="100%" fill="white"/>',
           f'<text x="{left}" y="22" font-size="14">Expected cost by checkpoint interval '
           f'({escape(sim.model_text)})</text>',
           f'<line x1="{left}" y1="{top + ph}" x2="{left + pw}" y2="{top + ph}" stroke="black"/>',
           f'<line x1="{left}" y1="{top}" x2="{left}" y2="{top + ph}" stroke="black"/>']
    step = _nice(y1 / 5)
    for k in range(int(y1 / step) + 1):  # y ticks
        v = k * step
        out.append(f'<line x1="{left - 4}" y1="{py(v):.1f}" x2="{left}" y2="{py(v):.1f}" stroke="black"/>'
                   f'<text x="{left - 8}" y="{py(v) + 4:.1f}" text-anchor="end">${v:g}</text>')
    for t in TIME_TICKS_S:  # x ticks at round durations
        x = math.log10(t)
        if x0 - 1e-9 <= x <= x1 + 1e-9:
            out.append(f'<line x1="{px(x):.1f}" y1="{top + ph}" x2="{px(x):.1f}" y2="{top + ph + 4}" stroke="black"/>'
                       f'<text x="{px(x):.1f}" y="{top + ph + 17}" text-anchor="middle">{_every(t)}</text>')
    out.append(f'<text x="{left + pw / 2}" y="{height - 12}" text-anchor="middle">checkpoint interval '
               f'(compute between saves, log scale)</text>')
    od = py(sim.on_demand_usd)
    out.append(f'<line x1="{left}" y1="{od:.1f}" x2="{left + pw}" y2="{od:.1f}" stroke="#888" stroke-dasharray="6,4"/>'
               f'<text x="{left + pw - 4}" y="{od - 5:.1f}" text-anchor="end" fill="#555">on-demand '
               f'{money(sim.on_demand_usd)}</text>')
    daly = [(px(x), py(r.daly_wall_s / 3600 * sim.plan.spot_usd_per_hour)) for x, r in zip(xs, rows) if r.daly_wall_s]
    if daly:
        out.append('<polyline fill="none" stroke="#d62728" stroke-width="1.5" stroke-dasharray="2,3" points="'
                   + " ".join(f"{a:.1f},{b:.1f}" for a, b in daly) + '"/>')
    out.append('<polyline fill="none" stroke="#1f77b4" stroke-width="2" points="'
               + " ".join(f"{px(x):.1f},{py(r.usd):.1f}" for x, r in zip(xs, rows)) + '"/>')
    for x, r in zip(xs, rows):
        out.append(f'<circle cx="{px(x):.1f}" cy="{py(r.usd):.1f}" r="3" fill="#1f77b4">'
                   f'<title>every {r.interval_steps} steps: {money(r.usd)}, {r.wall_s / 3600:.3f} h</title></circle>')
    c = sim.chosen
    cx, cy = px(math.log10(c.interval_s)), py(c.usd)
    out.append(f'<circle cx="{cx:.1f}" cy="{cy:.1f}" r="7" fill="none" stroke="#2ca02c" stroke-width="2"/>'
               f'<text x="{cx:.1f}" y="{cy + 22:.1f}" text-anchor="middle" fill="#2ca02c">chosen: every '
               f'{c.interval_steps} steps, {money(c.usd)}</text>')
    legend = [("#1f77b4", "simulated (spot)", "")] + ([("#d62728", "Daly closed form", "2,3")] if daly else [])
    for i, (color, text, dash) in enumerate(legend):
        y = top + 12 + 16 * i
        out.append(f'<line x1="{left + 10}" y1="{y}" x2="{left + 34}" y2="{y}" stroke="{color}" stroke-width="2"'
                   + (f' stroke-dasharray="{dash}"' if dash else "") + f'/><text x="{left + 40}" y="{y + 4}">{text}</text>')
    out.append("</svg>")
    return "\n".join(out) + "\n"
