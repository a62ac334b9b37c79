"""What a run will cost before it is launched, and the gate that refuses a plan the budget cannot carry.

One estimate, with its basis and a range: measured from the store's history of the same model on the same
hardware (``thrifty.money.history``), scaled from the smoke test's CPU measurement, or unknown. It prices what the
watch loop and the node will enforce: the steps with their evaluation and checkpoints, the start-up billed before
the first step, and the reserve held back below the cap (one poll interval and the stop itself). The gate refuses
a plan only when even the low end of its range is over the budget (the hard cap holds whatever the estimate
said), and a budget too small to reach even one checkpoint always (``allow_over_budget`` cannot help: the money
would buy nothing kept), naming the smallest budget that can make progress. The price is an input (``usd_per_hour``):
where it comes from is the caller's.
"""

from __future__ import annotations

import math
from typing import Literal

from pydantic import BaseModel, ConfigDict

from thrifty.money.budget import accelerator_count
from thrifty.money.history import JobHistory
from thrifty.money.throughput import Speeds, speeds_for
from thrifty.numbers import money

FP32_SLOWDOWN_ON_GPU = 2.0  # assumed: fp32 takes this much longer than bf16/fp16 autocast on a GPU
PROVISIONING_S = {"local": 5.0, "skypilot": 300.0}  # assumed start-up billed before training, until measured
# assumed: torch.compile's one-off compilation of a model's training step (train.compile on), billed like start-up,
# until compiled runs of the model are in the store's history (bench/bench_levers_compile.py measures it)
COMPILE_ASSUMED_S = 60.0
AUTO_FIRST_CHECKPOINT_STEPS = 10  # checkpoint_every: auto saves first after this many steps (to time a save)
# how far the actual spend may fall from the estimate, by how the estimate was made: the store's history of this
# model on this hardware (bench/bench_estimate.py: within 30 %), a CPU measurement scaled (within 3x), or nothing
RANGE = {"measured": (0.75, 1.3), "scaled": (1 / 3, 3.0), "unknown": (0.0, math.inf)}
BASIS = {"measured": "measured on this hardware from the store's history",
         "scaled": "scaled from a CPU measurement (no run of this model on this hardware in the store yet)",
         "unknown": "unknown (nothing measured)"}
Basis = Literal["measured", "scaled", "unknown"]


class OverBudgetPlan(ValueError):
    """The pre-launch estimate exceeds the budget, or the budget cannot buy one checkpoint."""


class Estimate(BaseModel):
    """The pre-launch cost estimate of a run (what is left of it): one figure, its range and how it was made."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    usd: float  # start-up plus the steps left (evaluation and checkpoints included), at the job's rate
    hours: float
    steps: int  # steps left to train
    usd_per_hour: float  # the whole job (every node)
    assumption: str
    price_source: str = ""
    step_s: float = 0.0  # estimated seconds per optimizer step on the target, evaluation and checkpoints included
    startup_s: float = 0.0  # billed before the first step
    total_steps: int = 0  # the whole run's steps (steps + those already checkpointed)
    accelerator: str | None = None  # NAME:COUNT priced; None: this machine's CPU (the local launcher)
    speeds: Speeds | None = None  # every candidate accelerator's speed for this model (ranks the SkyPilot task)
    choice: str = ""  # why this hardware: the candidate the run costs least on, against the cheapest per hour
    basis: Basis = "scaled"  # how it was made: RANGE says how far the actual spend may fall from it
    low_usd: float = 0.0  # the range the actual spend is expected in
    high_usd: float = 0.0
    overhead_s: float = 0.0  # of the training time, what evaluation and checkpoints take

    def summary(self) -> str:
        """The one figure set every surface prints for this plan: estimate, range, what it covers, its basis."""
        high = "?" if math.isinf(self.high_usd) else money(self.high_usd)
        return (f"{money(self.usd)} (range {money(self.low_usd)}-{high}) for {self.steps} steps: {self.startup_s:.0f} s of "
                f"start-up + {self.hours * 3600 - self.startup_s:.0f} s of training (evaluation and checkpoints "
                f"{self.overhead_s:.0f} s of it), at {money(self.usd_per_hour)}/h"
                + (f" from {self.price_source}" if self.price_source else "") + f"; {BASIS[self.basis]}: {self.assumption}")


def estimate_run(steps: int, cpu_seconds_per_example: float, examples_per_step: int, usd_per_hour: float,
                 nodes: int, accelerator: str | None, launcher: str, price_source: str = "",
                 total_steps: int | None = None, speeds: Speeds | None = None, choice: str = "",
                 history: JobHistory | None = None, cpu_overhead_s_per_step: float = 0.0,
                 overhead_note: str = "", compiled: bool = False) -> Estimate:
    """Cost of ``steps`` on ``accelerator`` (None: this machine's CPU, the local launcher), at ``usd_per_hour`` a
    node. With ``history`` (the store's earlier jobs of this model on this hardware) each step costs what they paid
    per step all in and the start-up is theirs: "measured". Else the training step is the smoke test's CPU speed
    (scaled by ``speeds`` or the throughput table on a GPU), plus ``cpu_overhead_s_per_step`` of evaluation and
    checkpoints scaled the same way, plus the assumed start-up: "scaled". ``compiled`` (train.compile on) adds
    torch.compile's compilation to the start-up: measured in the history (compiled runs share their speed_key, their
    all-in rate holds it), else COMPILE_ASSUMED_S."""
    gpus = 1
    if accelerator is not None:
        name, gpus = accelerator.partition(":")[0], accelerator_count(accelerator)
        if speeds is None or name not in speeds.per_gpu:
            speeds = speeds_for([name], {}, 1.0 / cpu_seconds_per_example)  # ConfigError for an unknown GPU
    if history is not None:
        step_s, startup_s, basis = history.all_in_step_s, history.startup_s, "measured"
        overhead_s = steps * history.all_in_step_s * (1 - 1 / history.overhead)
        how = history.describe() + (" (compiled runs: their compilation is in it)" if compiled else "")
    else:
        if accelerator is None:
            step_s = examples_per_step * cpu_seconds_per_example
            how = "the run trains on this machine's CPU at the smoke test's measured speed"
        else:
            step_s = examples_per_step / (speeds.of(name) * gpus * nodes)
            how = f"{speeds.explain(name)}, x {gpus * nodes} GPU(s)"
        cpu_step_s = examples_per_step * cpu_seconds_per_example
        overhead_per_step = cpu_overhead_s_per_step * (step_s / cpu_step_s if cpu_step_s > 0 else 1.0)
        overhead_s = steps * overhead_per_step
        step_s += overhead_per_step
        startup_s, basis = PROVISIONING_S[launcher], ("scaled" if step_s > 0 else "unknown")
        how += (f"; {overhead_note}" if overhead_note else "") + f"; {startup_s:g} s of start-up assumed"
        if compiled:
            startup_s += COMPILE_ASSUMED_S
            how += f", + {COMPILE_ASSUMED_S:g} s of torch.compile (train.compile on)"
    hours = (steps * step_s + startup_s) / 3600.0
    usd = hours * usd_per_hour * nodes
    low, high = RANGE[basis]
    return Estimate(usd=usd, hours=hours, steps=steps, usd_per_hour=usd_per_hour * nodes, assumption=how,
                    price_source=price_source, step_s=step_s, startup_s=startup_s,
                    total_steps=steps if total_steps is None else total_steps, accelerator=accelerator, speeds=speeds,
                    choice=choice, basis=basis, low_usd=usd * low, high_usd=usd * high, overhead_s=overhead_s)


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
           f" + {reserve_s:g} s held back to stop in, at {money(estimate.usd_per_hour)}/h"
           + (f", on top of {money(spent_usd)} already spent" if spent_usd else ""))
    return usd, why


def gate(estimate: Estimate, max_usd: float, allow_over_budget: bool, reserve_s: float,
         checkpoint_every: int | str, spent_usd: float = 0.0) -> None:
    """Refuse a plan the budget cannot carry, saying what to change: one that cannot buy a single checkpoint,
    always; one whose estimate exceeds the budget only when even its low end does (the hard cap stops the run
    wherever the estimate erred)."""
    smallest, why = smallest_budget_usd(estimate, reserve_s, checkpoint_every, spent_usd)
    if max_usd < smallest:
        raise OverBudgetPlan(
            f"budget.max_usd ${max_usd:g} cannot buy a single checkpoint: the smallest budget that can make progress "
            f"is {money(smallest)} ({why}). Raise budget.max_usd to at least that, pick a cheaper instance, or lower "
            "budget.stop_margin_s; nothing was launched.")
    reserve_usd = reserve_s / 3600.0 * estimate.usd_per_hour
    low = spent_usd + estimate.low_usd + reserve_usd
    if low <= max_usd or allow_over_budget:
        return
    raise OverBudgetPlan(
        f"even the low end of the estimate exceeds budget.max_usd ${max_usd:g}: {money(low)} with {reserve_s:g} s held "
        f"back to stop in ({money(reserve_usd)})" + (f" and {money(spent_usd)} already spent" if spent_usd else "")
        + f". The estimate: {estimate.summary()}. Raise budget.max_usd, train fewer steps (train.max_epochs / train.max_steps), pick a cheaper instance, "
        "or set budget.allow_over_budget=true to launch anyway (the hard cap still stops the run, with a checkpoint)."
    )
