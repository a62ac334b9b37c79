"""What a run cost, what the same work would have cost the naive way, and which lever saved what.

The naive way does the same work (the steps the run trained, or for a warm start the steps a from-scratch run
needed to reach its metric) on on-demand instances, in fp32, with no preprocessing cache. Each lever is priced from
the run's own ledger and summary, and says how (measured, or "assumed" with its factor). Early stopping is not in
that headline: what it left unspent (the planned steps not trained, at the run's own rate) is a line of its own,
since nobody meant to pay for all of them.
"""

from __future__ import annotations

from dataclasses import dataclass

from typing import Any

from pydantic import BaseModel, ConfigDict, ValidationError

from thrifty.money.budget import spend_usd
from thrifty.money.estimate import FP32_SLOWDOWN_ON_GPU
from thrifty.money.levers import MeasuredFactor
from thrifty.money.pricing import PricingError, age_note, find_instance
from thrifty.money.ledger import Attempt
from thrifty.runs import RunSummary, run_key
from thrifty.storage import NotFound, Store
from thrifty.numbers import money


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


class EarlyStop(BaseModel):
    """Work early stopping left undone: its own line, never part of the headline (nobody meant to train it all)."""

    model_config = ConfigDict(frozen=True)

    steps_skipped: int  # planned steps not trained
    epochs_skipped: float | None  # the same in epochs (None: a script that reports no epochs)
    usd: float  # at this run's own rate: its spend per step trained

    def line(self) -> str:
        what = (f"{self.epochs_skipped:g} epochs before max_epochs" if self.epochs_skipped is not None
                else f"{self.steps_skipped} steps before its planned end")
        return f"stopped {what}; at this run's rate that is {money(self.usd)} not spent"


BASIS_VERSION = 2  # 2: the headline compares the same work (early stopping apart); 1 counted skipped epochs in it


class SavingsReport(BaseModel):
    """``runs/<run_id>/savings.json``: what a run cost against the same work done the naive way, by lever."""

    model_config = ConfigDict(frozen=True)

    run_id: str
    state: str = "completed"  # completed | stopped_early | rung | budget | bad_input | failed | cancelled | crashed |
    #                           running | interrupted
    actual_usd: float  # the ledger's spend: every attempt of every job
    naive_usd: float  # the same work on-demand, in fp32, without the cache
    saved_usd: float
    saved_fraction: float
    levers_usd: dict[str, float]  # spot, precision, cache: what each made cheaper in the same work
    preemption_waste: Waste
    attempts: int
    instance_hours: float
    assumptions: list[str]
    lever_basis: dict[str, str] = {}  # how each lever was priced: measured from what, or "assumed" with its factor
    early_stop: EarlyStop | None = None  # work not done, apart from the headline
    basis_version: int = 1
    end: str = ""  # how the run ended, its spend and what to do next (thrifty.report.ends), as its report says it
    tags: dict[str, str] = {}  # the run's cost allocation tags, from its ledger rows
    started_unix: float | None = None  # its first attempt's start: the month a team's report files it under

    @property
    def on_demand_usd(self) -> float:
        """The same instance-hours at on-demand prices."""
        return self.actual_usd + self.levers_usd["spot"]


def early_stop_saving(summary: RunSummary | None, actual_usd: float) -> EarlyStop | None:
    """What stopping early left unspent: the planned steps not trained, at this run's spend per step trained."""
    if summary is None or not summary.stopped_early or summary.steps <= 0 or summary.total_steps <= summary.steps:
        return None
    skipped = summary.total_steps - summary.steps
    epochs = round(skipped * summary.epochs / summary.steps, 2) if summary.epochs > 0 else None
    return EarlyStop(steps_skipped=skipped, epochs_skipped=epochs, usd=round(actual_usd / summary.steps * skipped, 6))


def breakdown(run_id: str, attempts: list[Attempt], summary: RunSummary | None, cache_hit: bool,
              cold_preprocess_s: float, metrics: list[dict[str, Any]], state: str | None = None,
              precision: MeasuredFactor | None = None) -> SavingsReport:
    """The figures for a run however it ended (``state``; by default its summary's status). The naive way does
    the same work: the steps this run trained, on-demand, in fp32, preprocessing from scratch."""
    actual = spend_usd(attempts)
    on_demand = sum(a.hours() * _on_demand_price(a) * a.nodes for a in attempts)
    hours = sum(a.hours() for a in attempts)
    od_rate = on_demand / hours if hours else 0.0  # $/h of the same nodes on-demand
    mixed_on_gpu = summary is not None and summary.precision in ("bf16", "fp16") and summary.device == "cuda"
    # what fp32 would have taken: measured on this accelerator (``precision``, thrifty.money.levers), else assumed
    fp32_factor = (precision.factor if precision else FP32_SLOWDOWN_ON_GPU) if mixed_on_gpu else 1.0
    od_fp32 = on_demand * fp32_factor
    warm = summary.init_from if summary else None  # steps a from-scratch run needed beyond this warm start's
    cache = cold_preprocess_s / 3600.0 * od_rate if cache_hit else 0.0
    waste_steps = recomputed_steps(metrics)
    steps = summary.steps if summary else 0
    sec_per_step = summary.wall_time_s / steps if summary and steps else 0.0
    levers = {"spot": on_demand - actual, "precision": od_fp32 - on_demand, "cache": cache}
    basis = {
        "spot": "measured: the run's instance-hours at the price table's on-demand price of the same instances",
        "precision": ("none: the run trained in fp32 or on a CPU" if not mixed_on_gpu else precision.basis if precision
                      else f"assumed: fp32 {FP32_SLOWDOWN_ON_GPU:g}x slower than {summary.precision} on a GPU (not "
                      "measured: no run of this model in fp32 on this accelerator in the store)"),
        "cache": (f"measured: the cold preprocessing ({cold_preprocess_s:.1f} s) at the node's on-demand price"
                  if cache_hit else "none: the preprocessing ran (a cache miss) or the run has none"),
    }
    if warm and warm.steps_not_trained is not None and steps:  # a warm start that saved nothing says so: $0
        levers["warm_start"] = od_fp32 * warm.steps_not_trained / steps
        basis["warm_start"] = (f"measured: the from-scratch run its weights descend from needed "
                               f"{warm.steps_not_trained} steps more to reach this run's best metric, at this run's average step cost")
    naive = actual + sum(levers.values())
    return SavingsReport(
        run_id=run_id,
        state=state or (summary.status if summary else run_state(attempts, None)),
        # 9 places: a figure shown to 5 decimals is then rounded once, as the ledger's own (never $0.00014 beside
        # the end sentence's $0.00013 for a spend of $0.0001348)
        actual_usd=round(actual, 9),
        naive_usd=round(naive, 9),
        saved_usd=round(naive - actual, 9),
        saved_fraction=round((naive - actual) / naive, 4) if naive else 0.0,
        levers_usd={k: round(v, 9) for k, v in levers.items()},
        preemption_waste=Waste(steps=waste_steps,
                               usd=round(waste_steps * sec_per_step / 3600.0 * (actual / hours if hours else 0.0), 6)),
        attempts=len(attempts),
        instance_hours=round(hours, 6),
        assumptions=[
            "naive = the same work (the steps this run trained) on-demand, in fp32, preprocessing from scratch; "
            f"on-demand at the offline table's list price ({age_note()})",
            *(f"{k}: {v}" for k, v in basis.items() if v.startswith("assumed")),
            "early stopping is not in the headline: the steps it skipped are priced apart, at this run's rate",
        ],
        lever_basis=basis,
        early_stop=early_stop_saving(summary, actual),
        basis_version=BASIS_VERSION,
        tags=next((a.tags for a in reversed(attempts) if a.tags), {}),
        started_unix=min(a.started_unix for a in attempts) if attempts else None,
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


def billed_runs(store: Store) -> list[str]:
    """The runs of the store with a ledger row or a node's meter record, oldest first as listed."""
    run_ids: dict[str, None] = {}
    for obj in store.list("runs/"):
        parts = obj.key.split("/")
        if len(parts) >= 3 and (parts[2] in ("ledger", "meter") or parts[2] == "ledger.jsonl"):
            run_ids.setdefault(parts[1])
    return list(run_ids)


def read_all(store: Store) -> list[SavingsReport]:
    """One report per run that has a ledger row, whatever its end, oldest run first: the cross-run table.

    A run's ``savings.json`` is used while it accounts for the whole ledger; a run without one (a
    flow that crashed, was cancelled or killed) or with spend since is figured from its ledger now,
    so the table's total is every dollar the store's runs spent.
    """
    from thrifty.money.ledger import read_attempts
    from thrifty.money.levers import precision_factor
    from thrifty.runs import read_metrics, read_summary

    rows = []
    for run_id in billed_runs(store):
        attempts = read_attempts(store, run_id)
        if not attempts:
            continue
        saved = read(store, run_id)
        if saved is not None and saved.basis_version == BASIS_VERSION and abs(saved.actual_usd - spend_usd(attempts)) < 1e-6:
            if saved.started_unix is None:  # written before reports filed runs by month and tag: from its ledger
                saved = saved.model_copy(update={"started_unix": min(a.started_unix for a in attempts),
                                                 "tags": next((a.tags for a in reversed(attempts) if a.tags), {})})
            rows.append(saved)
            continue
        try:
            summary = read_summary(store, run_id)
        except ValueError:
            summary = None
        state = run_state(attempts, summary)
        if saved is not None and state not in ("running",) and summary is None:
            state = saved.state
        rows.append(breakdown(run_id, attempts, summary, False, 0.0, [], state,
                              precision_factor(store, summary, read_metrics(store, run_id), attempts)))
    return rows


@dataclass(frozen=True)
class Totals:
    """The cross-run table's total row: the sums of its runs' figures."""

    runs: int
    actual_usd: float
    naive_usd: float

    @property
    def saved_usd(self) -> float:
        return self.naive_usd - self.actual_usd

    @property
    def saved_fraction(self) -> float:
        return self.saved_usd / self.naive_usd if self.naive_usd else 0.0


def totals(all_figures: list[SavingsReport]) -> Totals:
    return Totals(len(all_figures), round(sum(f.actual_usd for f in all_figures), 9),
                  round(sum(f.naive_usd for f in all_figures), 9))


def table(all_figures: list[SavingsReport]) -> list[dict[str, Any]]:
    """One row per run: the cross-run table (Prefect artifact and `thrifty report`)."""
    return [{"run": f.run_id, "state": f.state, "actual_usd": f.actual_usd, "naive_usd": f.naive_usd,
             "saved_usd": f.saved_usd, "saved": f"{f.saved_fraction:.0%}",
             **{f"{k}_usd": v for k, v in f.levers_usd.items()},
             "assumed": ", ".join(k for k, v in f.lever_basis.items() if v.startswith("assumed")) or "-",
             "early_stop_unspent_usd": f.early_stop.usd if f.early_stop else 0.0,
             "recomputed_steps": f.preemption_waste.steps, "attempts": f.attempts}
            for f in all_figures]
