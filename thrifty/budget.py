"""Spend, burn rate, projection and alert decisions: pure functions of a cost ledger and a clock.

The launch task feeds it ledger rows (one per attempt) and training progress; it answers
what has been spent, what is burning now, where the run is heading, and which alerts are
due. Alert state (what already fired) is plain data the caller persists with the run, so
each threshold alerts once per run, across restarts of the watcher.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from pydantic import BaseModel, ConfigDict

from thrifty.config import BudgetConfig, RunConfig
from thrifty.pricing import find_instance
from thrifty.runs import Attempt

# Assumed throughput of one accelerator relative to this project's CPU smoke test (same code,
# same batch). Rough public-benchmark ratios for small transformer/MLP training; they only
# set the pre-launch estimate, and the report states that they were assumed.
GPU_SPEEDUP_VS_CPU = {"T4": 8.0, "L4": 14.0, "A10G": 16.0, "A10": 16.0, "V100": 20.0, "A100": 45.0, "H100": 80.0}
FP32_SLOWDOWN_ON_GPU = 2.0  # assumed: fp32 takes this much longer than bf16/fp16 autocast on a GPU
PROVISIONING_S = {"local": 5.0, "skypilot": 300.0}  # assumed start-up time billed before training


class BudgetExceeded(RuntimeError):
    """The run hit its hard cap and was stopped gracefully (its checkpoint is kept)."""


class OverBudgetPlan(ValueError):
    """The pre-launch estimate exceeds the budget."""


@dataclass(frozen=True)
class Snapshot:
    spend_usd: float
    burn_usd_per_hour: float  # what the running attempts cost per hour right now
    gpu_hours: float
    projected_usd: float  # spend + burn x estimated remaining time
    remaining_s: float | None
    fraction: float  # spend / max_usd


def accelerator_count(accelerator: str) -> int:
    """'A10G:4' -> 4, 'T4' -> 1."""
    return int(accelerator.partition(":")[2] or 1)


def gpus_per_node(cfg: RunConfig) -> int:
    """GPUs on each node: the emulated instance's (local) or the first candidate's (cloud)."""
    if cfg.compute.launcher == "local":
        cloud, _, instance = cfg.compute.emulate.partition(":")
        return accelerator_count(find_instance(cloud, instance).accelerator)
    return accelerator_count(cfg.compute.accelerators[0])


def world_size(cfg: RunConfig) -> int:
    """Training processes of the job: one per node locally, one per GPU on a cloud node."""
    return cfg.compute.num_nodes * (1 if cfg.compute.launcher == "local" else gpus_per_node(cfg))


def spend_usd(attempts: list[Attempt], now: float | None = None) -> float:
    """Dollars the attempts cost, open ones up to ``now``: the one sum every report and check uses."""
    now = time.time() if now is None else now
    return sum(a.cost_usd(now) for a in attempts)


def burn_rate_usd_per_hour(attempts: list[Attempt]) -> float:
    return sum(a.usd_per_hour * a.nodes for a in attempts if a.ended_unix is None)


def gpu_hours(attempts: list[Attempt], gpus_per_node: int, now: float) -> float:
    return sum(a.hours(now) * a.nodes * gpus_per_node for a in attempts)


def remaining_seconds(progress: dict[str, Any], steps_per_s: float | None) -> float | None:
    """Time left from measured throughput and remaining steps; None until throughput is known."""
    step, total = progress.get("step"), progress.get("total_steps")
    if step is None or not total or not steps_per_s:
        return None
    return max(0, total - step) / steps_per_s


def snapshot(attempts: list[Attempt], progress: dict[str, Any], steps_per_s: float | None,
             budget: BudgetConfig, gpus_per_node: int, now: float | None = None) -> Snapshot:
    now = time.time() if now is None else now
    spent = spend_usd(attempts, now)
    burn = burn_rate_usd_per_hour(attempts)
    left = remaining_seconds(progress, steps_per_s)
    projected = spent + burn * (left or 0.0) / 3600.0
    return Snapshot(spent, burn, gpu_hours(attempts, gpus_per_node, now), projected, left, spent / budget.max_usd)


@dataclass
class Alert:
    kind: str  # threshold | burn_rate | exceeded
    message: str
    payload: dict[str, Any]


@dataclass
class AlertState:
    """What already fired for this run; persisted beside the ledger so nothing alerts twice."""

    fired: list[str] = field(default_factory=list)
    last_burn_alert_unix: float | None = None


def due_alerts(snap: Snapshot, budget: BudgetConfig, state: AlertState, run_id: str,
               now: float | None = None) -> list[Alert]:
    """The alerts to send now, updating ``state``. The cap itself is the 'exceeded' alert."""
    now = time.time() if now is None else now
    base = {"run_id": run_id, "spend_usd": round(snap.spend_usd, 6), "projected_usd": round(snap.projected_usd, 6),
            "burn_usd_per_hour": round(snap.burn_usd_per_hour, 4), "max_usd": budget.max_usd,
            "gpu_hours": round(snap.gpu_hours, 6)}
    out: list[Alert] = []
    for t in budget.thresholds:
        key = f"threshold:{t}@{budget.max_usd}"  # a new budget (a resumed run) has thresholds of its own
        if snap.fraction >= t and key not in state.fired:
            state.fired.append(key)
            out.append(Alert("threshold", f"run {run_id} has spent ${snap.spend_usd:.4f}, {t:.0%} of its "
                                          f"${budget.max_usd:g} budget (projected ${snap.projected_usd:.4f})",
                             {**base, "threshold": t}))
    rate = budget.burn_rate_alert_usd_per_hour
    if rate is not None and snap.burn_usd_per_hour > rate and (
            state.last_burn_alert_unix is None or now - state.last_burn_alert_unix >= budget.burn_rate_alert_every_s):
        state.last_burn_alert_unix = now
        out.append(Alert("burn_rate", f"run {run_id} burns ${snap.burn_usd_per_hour:.2f}/hour, above the "
                                      f"${rate:g}/hour alert level", {**base, "alert_usd_per_hour": rate}))
    # stop early enough that checkpointing and teardown (stop_margin_s of burn) still fit under the cap
    margin_usd = snap.burn_usd_per_hour * budget.stop_margin_s / 3600.0
    over_gpu = budget.max_gpu_hours is not None and snap.gpu_hours >= budget.max_gpu_hours
    if snap.spend_usd + margin_usd >= budget.max_usd or over_gpu:
        what = (f"${snap.spend_usd:.4f} of its ${budget.max_usd:g} cap" if not over_gpu
                else f"{snap.gpu_hours:.3f} of its {budget.max_gpu_hours:g} GPU-hour cap")
        out.append(Alert("exceeded", f"run {run_id} reached {what}; stopping it gracefully", base))
    return out


class Estimate(BaseModel):
    """The pre-launch cost estimate of a run, and how it was made."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    usd: float
    hours: float
    steps: int
    usd_per_hour: float
    assumption: str
    price_source: str = ""


def estimate_run(total_steps: int, cpu_seconds_per_example: float, examples_per_step: int, usd_per_hour: float,
                 nodes: int, accelerator: str | None, launcher: str, price_source: str = "") -> Estimate:
    """Cost of ``total_steps`` from the smoke test's CPU speed scaled to the target accelerator (stated)."""
    if accelerator is None:  # the local launcher trains on this CPU: no scaling
        speedup, how = 1.0, "the run trains on this machine's CPU at the smoke test's measured speed"
    else:
        name, count = accelerator.partition(":")[0], accelerator_count(accelerator)
        per_gpu = GPU_SPEEDUP_VS_CPU.get(name)
        if per_gpu is None:
            raise OverBudgetPlan(f"no throughput assumption for accelerator {name!r}; known: "
                                 f"{', '.join(GPU_SPEEDUP_VS_CPU)}")
        speedup = per_gpu * count * nodes
        how = f"the smoke test's CPU step time scaled by an assumed {per_gpu:g}x per {name} x {count * nodes} GPU(s)"
    seconds = total_steps * examples_per_step * cpu_seconds_per_example / speedup + PROVISIONING_S[launcher]
    hours = seconds / 3600.0
    return Estimate(usd=hours * usd_per_hour * nodes, hours=hours, steps=total_steps, usd_per_hour=usd_per_hour * nodes,
                    assumption=f"{how}, plus {PROVISIONING_S[launcher]:g} s of start-up", price_source=price_source)


def gate(estimate: Estimate, budget: BudgetConfig) -> None:
    """Refuse a plan whose estimate exceeds the budget, saying what to change."""
    if estimate.usd <= budget.max_usd or budget.allow_over_budget:
        return
    raise OverBudgetPlan(
        f"estimated cost ${estimate.usd:.4f} ({estimate.steps} steps, {estimate.hours:.3f} h at "
        f"${estimate.usd_per_hour:.3f}/h; {estimate.assumption}) exceeds budget.max_usd ${budget.max_usd:g}. "
        "Raise budget.max_usd, train fewer steps (train.max_epochs / train.max_steps), pick a cheaper instance, "
        "or set budget.allow_over_budget=true to launch anyway (the hard cap still stops the run)."
    )
