"""``thrifty simulate --deadline-h``'s output: per trace and pooled, each policy's cost, deadlines met, spot's share,
moves between markets; and a chart of the cost per policy (SVG, on the shared frame of ``thrifty.report.chart``)."""

from __future__ import annotations

from xml.sax.saxutils import escape

from thrifty.report.chart import HEIGHT, PAD_B, PAD_L, PAD_R, PAD_T, TEXT, WIDTH, fmt_usd, frame, scale
from thrifty.spot.deadline_sim import Study
from thrifty.numbers import money

COLOURS = {"uniform_progress": "#2563eb", "greedy": "#d97706", "on_demand": "#6b7280"}


def _row(name: str, usd: float, met: float, share: float, switches: float, preemptions: float, ref: float) -> str:
    vs = f"{usd / ref - 1:+.0%}" if ref else "-"
    return (f"{name:<18} {usd:>10.2f} {vs:>8} {met:>7.1%} {share:>7.0%} {switches:>9.1f} {preemptions:>7.1f}")


def table_text(study: Study) -> str:
    """Each trace's table, then every start of every trace pooled, then how uniform_progress compares."""
    j = study.job
    head = f"{'policy':<18} {'mean $':>10} {'vs o-d':>8} {'met':>7} {'spot':>7} {'switches':>9} {'preempt':>7}"
    lines = [f"run: {j.work_s / 3600:g} h of compute, deadline {j.deadline_s / 3600:g} h (job fraction "
             f"{j.work_s / j.deadline_s:.2f}), changeover {j.changeover_s / 3600:.3g} h; spot "
             f"${j.spot_usd_per_hour:.4g}/h, on-demand ${j.on_demand_usd_per_hour:.4g}/h; on-demand alone "
             f"{money(j.on_demand_usd)}" + ("" if j.on_demand_meets else ", which cannot make the deadline"),
             f"margins: safety {j.margins.safety_s / 3600:.3g} h beyond a changeover, hysteresis "
             f"{j.margins.hysteresis_s / 3600:.3g} h; "
             + ("an on-demand job sees the spot market (the paper's assumption)" if study.spot_visible else
                "an on-demand job learns that spot is back by going there, as the watch loop does"),
             *study.notes]
    for i, name in enumerate(study.traces):
        lines += ["", f"trace: {name}", head]
        for policy, rs in study.replays.items():
            r = rs[i]
            lines.append(_row(policy, float(r.cost_usd.mean()), float(r.met.mean()), r.spot_share,
                              float(r.switches.mean()), float(r.preemptions.mean()), j.on_demand_usd))
    pooled = {p: study.pooled(p) for p in study.replays}
    starts = int(next(iter(pooled.values()))["starts"]) if pooled else 0
    lines += ["", f"all traces ({len(study.traces)}, {starts} starts in all):", head]
    lines += [_row(p, s["usd"], s["met"], s["spot_share"], s["switches"], s["preemptions"], j.on_demand_usd)
              for p, s in pooled.items()]
    if "uniform_progress" in pooled:
        up = pooled["uniform_progress"]
        said = [f"uniform_progress: {money(up['usd'])} on average, {1 - up['usd'] / j.on_demand_usd:.0%} less than "
                f"on-demand ({money(j.on_demand_usd)})"]
        if "greedy" in pooled:
            g = pooled["greedy"]["usd"]
            said.append(f"{1 - up['usd'] / g:.0%} {'less' if up['usd'] <= g else 'more'} than greedy ({money(g)})")
        lines += ["", ", ".join(said) + f"; deadlines met {up['met']:.1%}."]
    return "\n".join(lines) + "\n"


def chart_svg(study: Study) -> str:
    """Mean cost per policy (bars), each trace's mean (dots), on-demand alone (dashed), the share of deadlines met
    under each bar."""
    j = study.job
    policies = list(study.replays)
    per_trace = {p: [float(r.cost_usd.mean()) for r in study.replays[p]] for p in policies}
    pooled = {p: study.pooled(p) for p in policies}
    top = max([j.on_demand_usd] + [v for vs in per_trace.values() for v in vs]) * 1.1 or 1.0
    bottom, right = HEIGHT - PAD_B, WIDTH - PAD_R
    y = scale(0.0, top, bottom, PAD_T)
    slot = (right - PAD_L) / max(1, len(policies))
    parts = frame("#374151") + [
        f'<text x="{PAD_L}" y="18" {TEXT} fill="#111827">{escape(_title(study))}</text>',
        f'<text x="{PAD_L - 6}" y="{PAD_T + 4}" {TEXT} fill="#374151" text-anchor="end">{escape(fmt_usd(top))}</text>',
        f'<text x="{PAD_L - 6}" y="{bottom}" {TEXT} fill="#374151" text-anchor="end">$0</text>',
    ]
    od = y(j.on_demand_usd)
    parts.append(f'<line x1="{PAD_L}" y1="{od:.1f}" x2="{right}" y2="{od:.1f}" stroke="#6b7280" '
                 f'stroke-dasharray="6 4"/><text x="{PAD_L + 4}" y="{od - 4:.1f}" {TEXT} fill="#6b7280">'
                 f'on-demand alone {escape(fmt_usd(j.on_demand_usd))}</text>')
    for i, p in enumerate(policies):
        x0 = PAD_L + i * slot + slot * 0.25
        w = slot * 0.5
        s = pooled[p]
        colour = COLOURS.get(p, "#111827")
        parts.append(f'<rect x="{x0:.1f}" y="{y(s["usd"]):.1f}" width="{w:.1f}" height="{bottom - y(s["usd"]):.1f}" '
                     f'fill="{colour}" fill-opacity="0.75"><title>{escape(p)}: mean {escape(fmt_usd(s["usd"]))}'
                     f'</title></rect>')
        n = len(per_trace[p])
        for k, v in enumerate(per_trace[p]):
            cx = x0 + w * (k + 0.5) / n
            parts.append(f'<circle cx="{cx:.1f}" cy="{y(v):.1f}" r="2.5" fill="#111827"/>')
        parts.append(f'<text x="{x0 + w / 2:.1f}" y="{y(s["usd"]) - 5:.1f}" {TEXT} text-anchor="middle" '
                     f'fill="{colour}">{escape(fmt_usd(s["usd"]))}</text>')
        parts.append(f'<text x="{x0 + w / 2:.1f}" y="{HEIGHT - 20}" {TEXT} text-anchor="middle" fill="#111827">'
                     f'{escape(p)}</text><text x="{x0 + w / 2:.1f}" y="{HEIGHT - 6}" {TEXT} text-anchor="middle" '
                     f'fill="#374151">met {s["met"]:.0%}, spot {s["spot_share"]:.0%}</text>')
    parts.append("</svg>")
    return "".join(parts) + "\n"


def _title(study: Study) -> str:
    j = study.job
    return (f"Mean cost by policy: {j.work_s / 3600:g} h of work by {j.deadline_s / 3600:g} h, "
            f"{len(study.traces)} trace(s) (dots: each trace)")
