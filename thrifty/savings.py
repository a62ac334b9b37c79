"""What a run cost, what it would have cost the naive way, and which lever saved what.

The naive way: on-demand instances, fp32, no early stopping, no preprocessing cache. Each lever
is priced from the run's own ledger and summary; the assumptions are returned with the figures
so reports can state them.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, ValidationError

from thrifty.budget import FP32_SLOWDOWN_ON_GPU, spend_usd
from thrifty.pricing import PricingError, find_instance
from thrifty.runs import Attempt, RunSummary, run_key
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
              cold_preprocess_s: float, metrics: list[dict[str, Any]]) -> SavingsReport:
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
            "naive = on-demand, fp32, no early stopping, no preprocessing cache",
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


def read_all(store: Store) -> list[SavingsReport]:
    """Every run's savings in the store, oldest key first: the cross-run table."""
    rows = []
    for obj in store.list("runs/"):
        if obj.key.endswith("/savings.json") and obj.key.count("/") == 2:
            try:
                rows.append(SavingsReport.model_validate_json(store.get_bytes(obj.key)))
            except (NotFound, ValidationError):
                continue
    return rows


def table(all_figures: list[SavingsReport]) -> list[dict[str, Any]]:
    """One row per run: the cross-run table (Prefect artifact and `thrifty report`)."""
    return [{"run": f.run_id, "actual_usd": f.actual_usd, "naive_usd": f.naive_usd,
             "saved_usd": f.saved_usd, "saved": f"{f.saved_fraction:.0%}",
             **{f"{k}_usd": v for k, v in f.levers_usd.items()},
             "recomputed_steps": f.preemption_waste.steps, "attempts": f.attempts}
            for f in all_figures]
