"""What a run cost, what it would have cost the naive way, and which lever saved what.

The naive way: on-demand instances, fp32, no early stopping, no preprocessing cache. Each lever
is priced from the run's own ledger and summary; the assumptions are returned with the figures
so reports can state them.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, ValidationError

from thrifty.money.budget import spend_usd
from thrifty.money.estimate import FP32_SLOWDOWN_ON_GPU
from thrifty.money.pricing import PricingError, age_note, find_instance
from thrifty.money.ledger import Attempt
from thrifty.runs import RunSummary, run_key
from thrifty.storage import NotFound, Store


def _on_demand_price(a: Attempt) -> float:
    try:
        return find_instance(a.cloud, a.instance).on_demand_usd_per_hour
    except PricingError:
        return a.usd_per_hour  # unknown to the table: assume it was paid at on-demand


def recomputed_steps(metrics: list[dict[str, Any]]) -> int:
    """Steps trained twice because an attempt died after its last checkpoint (preemption waste)."""
    waste, reached = 0, None
    for rec in metrics:
        if rec.get("event") == "start":
            if reached is not None and rec["step"] < reached:
                waste += reached - rec["step"]
            reached = rec["step"]
        elif "step" in rec and reached is not None:
            reached = max(reached, rec["step"])
    return waste


class Waste(BaseModel):
    model_config = ConfigDict(frozen=True)

    steps: int
    usd: float


class SavingsReport(BaseModel):
    """``runs/<run_id>/savings.json``: what a run cost against the naive way, by lever."""

    model_config = ConfigDict(frozen=True)

    run_id: str
    state: str = "completed"  # completed | stopped_early | budget | failed | cancelled | running | interrupted
    actual_usd: float
    naive_usd: float
    saved_usd: float
    saved_fraction: float
    levers_usd: dict[str, float]
    preemption_waste: Waste
    attempts: int
    instance_hours: float
    assumptions: list[str]

    @property
    def on_demand_usd(self) -> float:
        """The same instance-hours at on-demand prices."""
        return self.actual_usd + self.levers_usd["spot"]


def breakdown(run_id: str, attempts: list[Attempt], summary: RunSummary | None, cache_hit: bool,
              cold_preprocess_s: float, metrics: list[dict[str, Any]], state: str | None = None) -> SavingsReport:
    """The figures for a run however it ended (``state``; by default its summary's status)."""
    actual = spend_usd(attempts)
    on_demand = sum(a.hours() * _on_demand_price(a) * a.nodes for a in attempts)
    hours = sum(a.hours() for a in attempts)
    od_rate = on_demand / hours if hours else 0.0  # $/h of the same nodes on-demand
    mixed_on_gpu = summary is not None and summary.precision in ("bf16", "fp16") and summary.device == "cuda"
    fp32_factor = FP32_SLOWDOWN_ON_GPU if mixed_on_gpu else 1.0
    od_fp32 = on_demand * fp32_factor
    steps, planned = (summary.steps, summary.total_steps) if summary else (0, 0)
    early = od_fp32 * (planned - steps) / steps if summary and summary.stopped_early and steps else 0.0
    cache = cold_preprocess_s / 3600.0 * od_rate if cache_hit else 0.0
    waste_steps = recomputed_steps(metrics)
    sec_per_step = summary.wall_time_s / steps if summary and steps else 0.0
    levers = {
        "spot": on_demand - actual,
        "precision": od_fp32 - on_demand,
        "early_stopping": early,
        "cache": cache,
    }
    naive = actual + sum(levers.values())
    return SavingsReport(
        run_id=run_id,
        state=state or (summary.status if summary else run_state(attempts, None)),
        actual_usd=round(actual, 6),
        naive_usd=round(naive, 6),
        saved_usd=round(naive - actual, 6),
        saved_fraction=round((naive - actual) / naive, 4) if naive else 0.0,
        levers_usd={k: round(v, 6) for k, v in levers.items()},
        preemption_waste=Waste(steps=waste_steps,
                               usd=round(waste_steps * sec_per_step / 3600.0 * (actual / hours if hours else 0.0), 6)),
        attempts=len(attempts),
        instance_hours=round(hours, 6),
        assumptions=[
            f"naive = on-demand, fp32, no early stopping, no preprocessing cache; on-demand at the offline table's "
            f"list price ({age_note()})",
            f"fp32 assumed {FP32_SLOWDOWN_ON_GPU:g}x slower than bf16/fp16 on a GPU (no precision saving on CPU)",
            "early stopping saves the skipped steps at the run's average step cost",
            "a cache hit saves the cold preprocessing time at the node's on-demand price",
        ],
    )


def write(store: Store, figures: SavingsReport) -> None:
    store.put_bytes(run_key(figures.run_id, "savings.json"), figures.model_dump_json(indent=2).encode())


def read(store: Store, run_id: str) -> SavingsReport | None:
    try:
        return SavingsReport.model_validate_json(store.get_bytes(run_key(run_id, "savings.json")))
    except (NotFound, ValidationError):
        return None


def run_state(attempts: list[Attempt], summary: RunSummary | None) -> str:
    """How a run stands, from its ledger and summary alone (for runs whose flow wrote no report)."""
    if any(a.ended_unix is None for a in attempts):
        return "running"
    if summary is not None:
        return summary.status
    last = attempts[-1].end_reason if attempts else None
    return {"budget": "budget", "cancelled": "cancelled", "failed": "failed"}.get(last or "", "interrupted")


def read_all(store: Store) -> list[SavingsReport]:
    """One report per run that has a ledger row, whatever its end, oldest run first: the cross-run table.

    A run's ``savings.json`` is used while it accounts for the whole ledger; a run without one (a
    flow that crashed, was cancelled or killed) or with spend since is figured from its ledger now,
    so the table's total is every dollar the store's runs spent.
    """
    from thrifty.money.ledger import read_attempts
    from thrifty.runs import read_summary

    run_ids: dict[str, None] = {}
    for obj in store.list("runs/"):
        parts = obj.key.split("/")
        if len(parts) >= 3 and (parts[2] in ("ledger", "meter") or parts[2] == "ledger.jsonl"):
            run_ids.setdefault(parts[1])
    rows = []
    for run_id in run_ids:
        attempts = read_attempts(store, run_id)
        if not attempts:
            continue
        saved = read(store, run_id)
        if saved is not None and abs(saved.actual_usd - spend_usd(attempts)) < 1e-6:
            rows.append(saved)
            continue
        try:
            summary = read_summary(store, run_id)
        except ValueError:
            summary = None
        state = run_state(attempts, summary)
        if saved is not None and state not in ("running",) and summary is None:
            state = saved.state
        rows.append(breakdown(run_id, attempts, summary, False, 0.0, [], state))
    return rows


def table(all_figures: list[SavingsReport]) -> list[dict[str, Any]]:
    """One row per run: the cross-run table (Prefect artifact and `thrifty report`)."""
    return [{"run": f.run_id, "state": f.state, "actual_usd": f.actual_usd, "naive_usd": f.naive_usd,
             "saved_usd": f.saved_usd, "saved": f"{f.saved_fraction:.0%}",
             **{f"{k}_usd": v for k, v in f.levers_usd.items()},
             "recomputed_steps": f.preemption_waste.steps, "attempts": f.attempts}
            for f in all_figures]
