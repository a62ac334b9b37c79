"""The search's caps (dollars, GPU-hours, wall clock) as arithmetic over its trials' ledgers. Pure.

The search keeps no second bookkeeping: a trial's spend is its run's ledger. A job is launched with
``budget.max_usd`` = what its run has spent + an allowance, and a run never spends past its own cap (the
watch loop and the node's meter enforce it). So a trial in flight can end up spending at most its cap, and

    committed = sum(cap of trials in flight) + sum(spent of the others) <= max_usd

is kept before every launch: the search's spend stays under its cap by construction, however many trials
run at once and whatever becomes of the flow. GPU-hours work the same way; the wall clock is a deadline no
launch's estimated end may pass.
"""

from __future__ import annotations

from dataclasses import dataclass

from thrifty.sweep.scheduler import TrialState
from thrifty.numbers import money


@dataclass(frozen=True)
class Need:
    """What one job (a trial, from where it stands to its next milestone) is given, with its reasoning."""

    usd: float  # the allowance: the job's budget.max_usd is the run's spend plus this
    gpu_hours: float
    hours: float  # estimated wall time, for the deadline
    why: str


def committed_usd(trials: list[TrialState]) -> float:
    """Dollars the search may end up having spent on trials as they stand: the cap of each job that may still be
    training (in flight, or left running by a killed search), the spend of the rest."""
    return sum(t.spent_usd if t.cap_usd is None else max(t.cap_usd, t.spent_usd) for t in trials)


def committed_gpu_hours(trials: list[TrialState]) -> float:
    return sum(t.gpu_hours if t.cap_gpu_hours is None else max(t.cap_gpu_hours, t.gpu_hours) for t in trials)


def need_for(estimate_usd: float, estimate_hours: float, reserve_usd: float, gpus: int, factor: float,
             epochs: int, measured_usd_per_epoch: float = 0.0, measured_hours_per_epoch: float = 0.0,
             first_checkpoint_usd: float = 0.0, stopped_usd: float = 0.0) -> Need:
    """A job's allowance: ``factor`` x the larger of the estimate (the budget gate's, to the milestone) and what
    the search's trials of its model shape measured per epoch, plus the stop reserve the run's cap holds back; never
    less than what reaching its first checkpoint may cost (``first_checkpoint_usd``, at the estimate's high end): a
    cap that stopped it before would buy nothing kept; and never less than twice what the jobs its own cap stopped
    on this milestone spent (``stopped_usd``) plus the reserve: the work they left undone cost at least that (a
    start-up a loaded machine or a slow node stretched, paid again by a relaunch with no checkpoint). Raised, the
    hours grow in proportion."""
    usd = max(estimate_usd, measured_usd_per_epoch * epochs)
    hours = max(estimate_hours, measured_hours_per_epoch * epochs)
    source = "measured by earlier trials of its shape" if measured_usd_per_epoch * epochs > estimate_usd else "estimated"
    why = (f"{money(usd)} {source} for {epochs} epoch(s) x {factor:g} headroom + {money(reserve_usd)} held back "
           "to stop in")
    base = factor * usd + reserve_usd
    allowance, raised = base, ""
    for floor, reason in ((first_checkpoint_usd, "what its first checkpoint may cost at the estimate's high end"),
                          (2.0 * stopped_usd + reserve_usd, f"twice the {money(stopped_usd)} its jobs stopped at "
                           "their cap spent on this milestone, + the reserve")):
        if floor > allowance:
            allowance, raised = floor, reason
    if raised:
        why += f", raised to {money(allowance)}: {raised}"
    scale = (allowance - reserve_usd) / (factor * usd) if allowance > base and factor * usd > 0 else 1.0
    return Need(usd=allowance, gpu_hours=factor * hours * gpus * scale, hours=factor * hours * scale, why=why)


def refusal(need: Need, trials: list[TrialState], max_usd: float, max_gpu_hours: float | None,
            deadline_unix: float | None, now: float) -> str | None:
    """Why the job cannot be launched under the caps, or None when it can."""
    left = max_usd - committed_usd(trials)
    if need.usd > left:
        return (f"the search's budget cannot cover it: {money(need.usd)} needed ({need.why}), {money(left)} of "
                f"max_usd ${max_usd:g} left after what the trials spent and what those in flight may spend")
    if max_gpu_hours is not None:
        gpu_left = max_gpu_hours - committed_gpu_hours(trials)
        if need.gpu_hours > gpu_left:
            return (f"the search's GPU-hours cannot cover it: {need.gpu_hours:.4f} needed, {gpu_left:.4f} of "
                    f"max_gpu_hours {max_gpu_hours:g} left")
    if deadline_unix is not None and now + need.hours * 3600.0 > deadline_unix:
        return (f"it would end after the search's deadline: ~{need.hours * 3600:.0f} s needed, "
                f"{max(0.0, deadline_unix - now):.0f} s left of max_wall_h")
    return None


def measured_per_epoch(trials: list[TrialState]) -> tuple[float, float]:
    """The dearest dollars and hours per epoch any trial has paid so far: its spend per epoch reached (start-up
    included) or its measured step time per epoch, whichever is more (conservative: a loaded machine counts)."""
    usd = max([t.spent_usd / t.reached for t in trials if t.reached and t.spent_usd > 0] +
              [t.epoch_usd for t in trials], default=0.0)
    hours = max([t.billed_hours / t.reached for t in trials if t.reached and t.spent_usd > 0] +
                [t.epoch_hours for t in trials], default=0.0)
    return usd, hours
