"""Spend, burn rate, projection, the stop reserve and alert decisions: pure functions of a cost ledger and a clock.

The launch task feeds it ledger rows (one per attempt) and training progress; it answers what
has been spent, what is burning now, where the run is heading, and which alerts are due. Alert
state (what already fired) is plain data the caller persists with the run, so each threshold
alerts once per run, across restarts of the watcher.

The cap rule, shared by the pre-launch gate (``thrifty.money.estimate``), the watch loop and the node
(``thrifty.money.meter``): a job is stopped while ``spend + burn x reserve <= max_usd``, where the
reserve covers everything billed after the decision: until the next look (one poll interval)
and the stop itself (``stop_margin_s``, after which the stop is made a hard one).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from thrifty.config import BudgetConfig, RunConfig
from thrifty.money.ledger import Attempt
from thrifty.money.pricing import find_instance
from thrifty.numbers import money

STOP_MARGIN_DEFAULT_S = {"local": 30.0, "skypilot": 240.0}  # budget.stop_margin_s when null
# billed after a stop is decided and the trainer is told, until the nodes are gone: the part of stop_margin_s the
# launcher keeps for ending the job for good (a kill and the process's exit here; tearing VMs down on a cloud)
TEARDOWN_S = {"local": 1.0, "skypilot": 90.0}


class BudgetExceeded(RuntimeError):
    """The run hit its hard cap and was stopped (with a checkpoint when one could be written)."""


def stop_margin_s(cfg: RunConfig) -> float:
    """The longest a stop at the cap may take, this launcher's default unless set."""
    m = cfg.budget.stop_margin_s
    return STOP_MARGIN_DEFAULT_S[cfg.compute.launcher] if m is None else m


def stop_reserve_s(cfg: RunConfig, poll_s: float) -> float:
    """Seconds of burn the watch loop holds back below the cap: one look's gap plus the stop itself."""
    return poll_s + stop_margin_s(cfg)


@dataclass(frozen=True)
class Snapshot:
    spend_usd: float
    burn_usd_per_hour: float  # what the running attempts cost per hour right now
    gpu_hours: float
    projected_usd: float  # spend + burn x estimated remaining time
    remaining_s: float | None
    fraction: float  # spend / max_usd
    measured: bool = False  # the projection comes from measured throughput (else from the pre-launch estimate)


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


def remaining_seconds(progress: dict[str, Any], steps_per_s: float | None,
                      estimated_step_s: float | None = None) -> tuple[float | None, bool]:
    """Time left, and whether it was measured: from measured throughput when known, else from the pre-launch
    estimate's seconds per step (None when neither is known)."""
    step = progress.get("step") or 0
    total = progress.get("total_steps") or progress.get("estimated_steps")
    if not total:
        return None, False
    if steps_per_s and progress.get("total_steps"):
        return max(0, total - step) / steps_per_s, True
    if estimated_step_s is not None:
        return max(0, int(total) - step) * estimated_step_s, False
    return None, False


def snapshot(attempts: list[Attempt], progress: dict[str, Any], steps_per_s: float | None,
             budget: BudgetConfig, gpus_per_node: int, now: float | None = None,
             estimated_step_s: float | None = None, planned_usd_per_hour: float = 0.0) -> Snapshot:
    """Where the money stands. Until throughput is measured the projection uses the estimate, at the burn of
    the running attempts or, before one runs, the rate the job was planned at."""
    now = time.time() if now is None else now
    spent = spend_usd(attempts, now)
    burn = burn_rate_usd_per_hour(attempts)
    left, measured = remaining_seconds(progress, steps_per_s, estimated_step_s)
    projected = spent + max(burn, planned_usd_per_hour) * (left or 0.0) / 3600.0
    return Snapshot(spent, burn, gpu_hours(attempts, gpus_per_node, now), projected, left, spent / budget.max_usd,
                    measured)


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


def over_cap(spend: float, burn_usd_per_hour: float, reserve_s: float, max_usd: float) -> bool:
    """The cap rule: stop once what is spent plus the reserve's burn reaches the cap."""
    return spend + burn_usd_per_hour * reserve_s / 3600.0 >= max_usd


def due_alerts(snap: Snapshot, budget: BudgetConfig, state: AlertState, run_id: str,
               now: float | None = None, reserve_s: float = 0.0, reserve_burn: float | None = None) -> list[Alert]:
    """The alerts to send now, updating ``state``. The cap itself is the 'exceeded' alert: due once spend plus
    ``reserve_s`` of burn (``reserve_burn`` $/h, default the current burn) reaches it."""
    now = time.time() if now is None else now
    base = {"run_id": run_id, "spend_usd": round(snap.spend_usd, 6), "projected_usd": round(snap.projected_usd, 6),
            "burn_usd_per_hour": round(snap.burn_usd_per_hour, 4), "max_usd": budget.max_usd,
            "gpu_hours": round(snap.gpu_hours, 6)}
    projection = "projected" if snap.measured else "estimated"
    out: list[Alert] = []
    for t in budget.thresholds:
        key = f"threshold:{t}@{budget.max_usd}"  # a new budget (a resumed run) has thresholds of its own
        if snap.fraction >= t and key not in state.fired:
            state.fired.append(key)
            out.append(Alert("threshold", f"run {run_id} has spent {money(snap.spend_usd)}, {t:.0%} of its "
                                          f"${budget.max_usd:g} budget ({projection} {money(snap.projected_usd)})",
                             {**base, "threshold": t}))
    rate = budget.burn_rate_alert_usd_per_hour
    if rate is not None and snap.burn_usd_per_hour > rate and (
            state.last_burn_alert_unix is None or now - state.last_burn_alert_unix >= budget.burn_rate_alert_every_s):
        state.last_burn_alert_unix = now
        out.append(Alert("burn_rate", f"run {run_id} burns {money(snap.burn_usd_per_hour)}/hour, above the "
                                      f"${rate:g}/hour alert level", {**base, "alert_usd_per_hour": rate}))
    burn = snap.burn_usd_per_hour if reserve_burn is None else max(reserve_burn, snap.burn_usd_per_hour)
    over_gpu = budget.max_gpu_hours is not None and snap.gpu_hours >= budget.max_gpu_hours
    if over_cap(snap.spend_usd, burn, reserve_s, budget.max_usd) or over_gpu:
        what = (f"{money(snap.spend_usd)} of its ${budget.max_usd:g} cap (holding back {reserve_s:.0f} s of burn to "
                "stop in)" if not over_gpu else f"{snap.gpu_hours:.3f} of its {budget.max_gpu_hours:g} GPU-hour cap")
        out.append(Alert("exceeded", f"run {run_id} reached {what}; stopping it", {**base, "reserve_s": reserve_s}))
    return out
