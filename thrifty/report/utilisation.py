"""The report's utilisation section: what the hardware did, what its idle time and its operators cost, MFU,
and right-size advice when the GPU was mostly idle."""

from __future__ import annotations

import json
from typing import Any

from thrifty.money.ledger import Attempt
from thrifty.money.pricing import accelerator_of
from thrifty.money.utilisation import right_size
from thrifty.runs import RunSummary, run_key
from thrifty.storage import NotFound, Store, StoreError
from thrifty.numbers import money

TOP_OPS = 8


def read_profile(store: Store, run_id: str) -> dict[str, Any] | None:
    """``runs/<run>/profile.json`` (train.profile_steps), or None when the run was not profiled."""
    try:
        return json.loads(store.get_bytes(run_key(run_id, "profile.json")))
    except (NotFound, StoreError, ValueError):
        return None


def utilisation_rows(u: dict[str, Any], run_usd: float) -> list[tuple[str, str]]:
    """(measure, value) rows out of a summary's ``utilisation``; what was not measured has no row."""
    rows = []
    if "gpu_busy_pct" in u:
        rows.append(("GPU busy", f"{u['gpu_busy_pct']:.0f} % of the time"))
    if "gpu_memory_used_gb" in u:
        rows.append(("GPU memory", f"{u['gpu_memory_used_gb']:.2f} GB mean"
                     + (f", {u['gpu_memory_peak_gb']:.2f} GB peak" if "gpu_memory_peak_gb" in u else "")))
    if "gpu_power_w" in u:
        rows.append(("GPU power", f"{u['gpu_power_w']:.0f} W mean"))
    if "cpu_pct" in u:
        rows.append(("process CPU", f"{u['cpu_pct']:.0f} % (100 = one core)"))
    if "data_wait_share" in u:
        rows.append(("waiting for data", f"{u['data_wait_share']:.1%} of step time, about "
                     f"{money(u['data_wait_share'] * run_usd)} of this run"))
    if "checkpoint_share" in u:
        rows.append(("checkpointing", f"{u['checkpoint_share']:.1%} of step time, about "
                     f"{money(u['checkpoint_share'] * run_usd)} of this run"))
    if "achieved_tflops" in u:
        mfu = (f"; MFU {u['mfu']:.1%} of the {u['mfu_basis']}" if "mfu" in u else
               f" on {u.get('device_name', 'this device')} (no peak in the table: no MFU)")
        rows.append(("achieved", f"{u['achieved_tflops']:.4g} TFLOPS{mfu}"))
    return rows


def cost_map_lines(profile: dict[str, Any], run_usd: float | None) -> list[str]:
    """'aten::addmm: 41 % of step time, about $12.30 of this run', the top operators first. Priced at the run's
    spend when it is known (assuming the profiled steps are typical), else at the node's projection."""
    ops = profile.get("ops") or []
    if not ops:
        return []
    lines = [f"Top operators by share of step time ({profile.get('time_basis', 'cpu')} time over "
             f"{profile.get('steps_profiled', 0)} profiled steps in {profile.get('windows', 0)} window(s)):", ""]
    for op in ops[:TOP_OPS]:
        usd = op["share"] * run_usd if run_usd else op.get("projected_usd")
        lines.append(f"- `{op['name']}`: {op['share']:.0%} of step time"
                     + (f", about {money(usd)} of this run" if usd is not None else ""))
    return lines + [""]


def section(store: Store, run_id: str, summary: RunSummary | None, attempts: list[Attempt], run_usd: float,
            clouds: list[str]) -> str:
    """Markdown: '## Utilisation' (rows, right-size advice) and '## Cost map'; '' when nothing was measured."""
    out: list[str] = []
    u = summary.utilisation if summary is not None and summary.utilisation else {}
    rows = utilisation_rows(u, run_usd)
    if rows:
        out += ["## Utilisation", "", "| measure | value |", "|---|---|", *[f"| {k} | {v} |" for k, v in rows], ""]
        last = attempts[-1] if attempts else None
        accelerator = accelerator_of(last.cloud, last.instance) if last else None
        advice = right_size(accelerator, u.get("gpu_busy_pct"), u.get("gpu_memory_peak_gb"),
                            sum(a.hours() for a in attempts), run_usd, last.spot, clouds) if accelerator else None
        if advice is not None:
            out += [f"Right-size: {advice.line}.", ""]
    profile = read_profile(store, run_id)
    lines = cost_map_lines(profile, run_usd) if profile else []
    if lines:
        out += ["## Cost map", "", *lines]
    return "\n".join(out) + ("\n" if out else "")
