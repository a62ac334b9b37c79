"""What a run will cost before it is launched, and the gate that refuses a plan the budget cannot carry.

The gate prices what the watch loop and the node will enforce: besides the training steps, the
start-up billed before the first step, and the reserve held back below the cap (one poll
interval and the stop itself). A budget too small to reach even one checkpoint is refused
always (``allow_over_budget`` cannot help: the money would buy nothing kept), naming the
smallest budget that can make progress.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict

from thrifty.money.budget import accelerator_count
from thrifty.money.throughput import Speeds, speeds_for

FP32_SLOWDOWN_ON_GPU = 2.0  # assumed: fp32 takes this much longer than bf16/fp16 autocast on a GPU
PROVISIONING_S = {"local": 5.0, "skypilot": 300.0}  # assumed start-up time billed before training
AUTO_FIRST_CHECKPOINT_STEPS = 10  # checkpoint_every: auto saves first after this many steps (to time a save)


class OverBudgetPlan(ValueError):
    """The pre-launch estimate exceeds the budget, or the budget cannot buy one checkpoint."""


class Estimate(BaseModel):
    """The pre-launch cost estimate of a run (what is left of it), and how it was made."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    usd: float  # start-up plus the steps left, at the job's rate
    hours: float
    steps: int  # steps left to train
    usd_per_hour: float  # the whole job (every node)
    assumption: str
    price_source: str = ""
    step_s: float = 0.0  # estimated seconds per optimizer step on the target
    startup_s: float = 0.0  # billed before the first step
    total_steps: int = 0  # the whole run's steps (steps + those already checkpointed)
    accelerator: str | None = None  # NAME:COUNT priced; None: this machine's CPU (the local launcher)
    speeds: Speeds | None = None  # every candidate accelerator's speed for this model (ranks the SkyPilot task)
    choice: str = ""  # why this hardware: the candidate the run costs least on, against the cheapest per hour


def estimate_run(steps: int, cpu_seconds_per_example: float, examples_per_step: int, usd_per_hour: float,
                 nodes: int, accelerator: str | None, launcher: str, price_source: str = "",
                 total_steps: int | None = None, speeds: Speeds | None = None, choice: str = "") -> Estimate:
    """Cost of ``steps`` on ``accelerator``: at its speed in ``speeds`` (measured, or scaled from the smoke test's
    CPU speed by the throughput table: ``thrifty.money.throughput``), or on this CPU at the smoke test's speed (stated)."""
    if accelerator is None:  # the local launcher trains on this CPU: no scaling
        step_s = examples_per_step * cpu_seconds_per_example
        how = "the run trains on this machine's CPU at the smoke test's measured speed"
    else:
        name, count = accelerator.partition(":")[0], accelerator_count(accelerator)
        if speeds is None or name not in speeds.per_gpu:
            speeds = speeds_for([name], {}, 1.0 / cpu_seconds_per_example)  # ConfigError for an unknown GPU
        step_s = examples_per_step / (speeds.of(name) * count * nodes)
        how = f"{speeds.explain(name)}, x {count * nodes} GPU(s)"
    startup_s = PROVISIONING_S[launcher]
    hours = (steps * step_s + startup_s) / 3600.0
    return Estimate(usd=hours * usd_per_hour * nodes, hours=hours, steps=steps, usd_per_hour=usd_per_hour * nodes,
                    assumption=f"{how}, plus {startup_s:g} s of start-up", price_source=price_source,
                    step_s=step_s, startup_s=startup_s, total_steps=steps if total_steps is None else total_steps,
                    accelerator=accelerator, speeds=speeds, choice=choice)


def first_checkpoint_steps(checkpoint_every: int | str, steps_left: int) -> int:
    """Steps trained before the first checkpoint of a job (a short run saves at its end)."""
    every = AUTO_FIRST_CHECKPOINT_STEPS if checkpoint_every == "auto" else int(checkpoint_every)
    return max(1, min(every, steps_left))


def smallest_budget_usd(estimate: Estimate, reserve_s: float, checkpoint_every: int | str,
                        spent_usd: float = 0.0) -> tuple[float, str]:
    """The least ``max_usd`` with which a job can make progress: what is spent, start-up, the steps to its first
    checkpoint, and the reserve the cap holds back; with the reasoning, for the error message."""
    steps = first_checkpoint_steps(checkpoint_every, estimate.steps)
    seconds = estimate.startup_s + steps * estimate.step_s + reserve_s
    usd = spent_usd + seconds / 3600.0 * estimate.usd_per_hour
    why = (f"{estimate.startup_s:g} s of start-up + {steps} step(s) to the first checkpoint (~{steps * estimate.step_s:.1f} s)"
           f" + {reserve_s:g} s held back to stop in, at ${estimate.usd_per_hour:.3f}/h"
           + (f", on top of ${spent_usd:.4f} already spent" if spent_usd else ""))
    return usd, why


def gate(estimate: Estimate, max_usd: float, allow_over_budget: bool, reserve_s: float,
         checkpoint_every: int | str, spent_usd: float = 0.0) -> None:
    """Refuse a plan the budget cannot carry, saying what to change."""
    smallest, why = smallest_budget_usd(estimate, reserve_s, checkpoint_every, spent_usd)
    if max_usd < smallest:
        raise OverBudgetPlan(
            f"budget.max_usd ${max_usd:g} cannot buy a single checkpoint: the smallest budget that can make progress "
            f"is ${smallest:.4f} ({why}). Raise budget.max_usd to at least that, pick a cheaper instance, or lower "
            "budget.stop_margin_s; nothing was launched.")
    full = spent_usd + estimate.usd + reserve_s / 3600.0 * estimate.usd_per_hour
    if full <= max_usd or allow_over_budget:
        return
    raise OverBudgetPlan(
        f"estimated cost ${full:.4f} ({estimate.steps} steps, {estimate.hours:.3f} h at "
        f"${estimate.usd_per_hour:.3f}/h" + (f" from {estimate.price_source}" if estimate.price_source else "")
        + f"; {estimate.assumption}; {reserve_s:g} s held back to stop in"
        + (f"; ${spent_usd:.4f} already spent" if spent_usd else "") + f") exceeds budget.max_usd ${max_usd:g}. "
        "Raise budget.max_usd, train fewer steps (train.max_epochs / train.max_steps), pick a cheaper instance, "
        "or set budget.allow_over_budget=true to launch anyway (the hard cap still stops the run, with a checkpoint)."
    )
