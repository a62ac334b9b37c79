"""Asynchronous successive halving (ASHA): which trial trains to which milestone next. Pure and deterministic.

Every trial trains to the first rung; a trial is promoted to the next rung (eta times the epochs) as soon as it
is in the top 1/eta of the trials that have reached its rung. Once no trial can still reach a rung (none is
pending, running, or waiting below it), the rung is closed: its top max(1, n // eta) go on, the rest are pruned.
Promotions come before new trials, the highest rung first; ties break by trial index. A promotion is never taken
back: a job to the next rung that was interrupted (a killed search, a job its cap stopped) goes on first, from its
checkpoint, whatever came in since, so a killed search decides what the same search not killed would have.
"""

from __future__ import annotations

import math
from typing import Literal

from pydantic import BaseModel, Field

Status = Literal["pending", "running", "paused", "finished", "pruned", "failed", "out_of_budget"]
ACTIVE = ("pending", "running", "paused")  # may still train: a rung below them is not decided yet


class TrialState(BaseModel):
    """One trial as the search sees it (mutable: the search's own bookkeeping, saved in state.json)."""

    index: int
    run_name: str
    values: dict[str, object]
    status: Status = "pending"
    reached: int = 0  # epochs at the last milestone the trial reached (0: not started)
    target: int | None = None  # the milestone its current (or interrupted) job trains to
    metrics: dict[int, float] = Field(default_factory=dict)  # the ranking metric at each milestone reached
    spent_usd: float = 0.0  # from the run's ledger: the one bookkeeping
    gpu_hours: float = 0.0
    billed_hours: float = 0.0  # wall hours its attempts were billed (all nodes)
    epoch_usd: float = 0.0  # what one more epoch costs at its jobs' measured step time (no start-up)
    epoch_hours: float = 0.0  # and how long it takes
    cap_stops: int = 0  # jobs of this milestone its own cap stopped (the estimate was short): retried, then failed
    milestone_usd: float = 0.0  # its spend when it reached its last milestone: what it spent since is this one's
    cap_usd: float | None = None  # the running job's budget.max_usd: what the trial may have spent when it ends
    cap_gpu_hours: float | None = None
    launches: int = 0
    note: str = ""  # why it ended where it did (pruned at epoch 3, skipped: the budget could not cover ...)
    result: float | None = None  # trained to its end: what it is ranked by (its run's best, or last evaluation)
    result_step: int | None = None  # the step of the weights that scored ``result``: its gold checkpoint

    def score(self, epochs: int) -> float | None:
        """Its evaluation at the milestone ``epochs`` (the end of that epoch), when it reached it."""
        value = self.metrics.get(epochs)
        return value if value is not None and math.isfinite(value) else None

    def ranking_value(self) -> float | None:
        """What the leaderboard shows for it: its result once trained to its end, else its metric at the last
        milestone it reached."""
        if self.status == "finished" and self.result is not None and math.isfinite(self.result):
            return self.result
        return self.score(self.reached) if self.reached else None


def ranked(trials: list[TrialState], epochs: int, mode: str) -> list[TrialState]:
    """Trials with a finite metric at ``epochs``, best first (ties: lower index first)."""
    scored = [t for t in trials if t.score(epochs) is not None]
    sign = 1.0 if mode == "min" else -1.0
    return sorted(scored, key=lambda t: (sign * t.score(epochs), t.index))  # type: ignore[operator]


def rung_closed(trials: list[TrialState], rungs: list[int], k: int) -> bool:
    """No trial can still reach rung ``k``: every active trial is already at or past it."""
    return not any(t.status in ACTIVE and t.reached < rungs[k] for t in trials)


def keep_count(n: int, eta: int, closed: bool) -> int:
    return max(1, n // eta) if closed and n else n // eta


def promoted(t: TrialState) -> bool:
    """Its job to a higher milestone started and has not reached it yet (running, or interrupted and paused)."""
    return t.target is not None and t.target > t.reached


def settle(trials: list[TrialState], rungs: list[int], eta: int, mode: str) -> list[str]:
    """Prune the trials waiting at a closed rung outside its top (not one already promoted past it: see the module
    docstring); returns what was decided, for the log."""
    said = []
    for k, epochs in enumerate(rungs[:-1]):
        if not rung_closed(trials, rungs, k):
            break  # a higher rung cannot close before this one
        order = ranked(trials, epochs, mode)
        keep = {t.index for t in order[:keep_count(len(order), eta, True)]}
        for t in order:
            if t.index not in keep and t.status == "paused" and t.reached == epochs and not promoted(t):
                t.status, t.note = "pruned", f"pruned at epoch {epochs}: not in the top {len(keep)} of {len(order)}"
                said.append(f"{t.run_name}: {t.note}")
    return said


def next_job(trials: list[TrialState], rungs: list[int], eta: int, mode: str) -> tuple[int, int] | None:
    """(trial index, milestone) to launch next, or None when nothing can start now."""
    for t in trials:  # a job a killed search left unfinished goes first: it resumes from its checkpoint
        if t.status == "paused" and promoted(t):
            return t.index, t.target
    for k in reversed(range(len(rungs) - 1)):  # promotions, the highest rung first
        epochs = rungs[k]
        order = ranked(trials, epochs, mode)
        for t in order[:keep_count(len(order), eta, rung_closed(trials, rungs, k))]:
            if t.status == "paused" and t.reached == epochs:
                return t.index, rungs[k + 1]
    for t in trials:
        if t.status == "pending":
            return t.index, rungs[0]
    return None


def best_trial(trials: list[TrialState], mode: str) -> TrialState | None:
    """The best of the trials that trained to their end (the full budget, or stopped early there); None while none
    has: a trial paused, pruned or refused at a rung is never "the best" (``leader`` names the one ahead)."""
    done = [t for t in trials if t.status == "finished" and t.ranking_value() is not None]
    if not done:
        return None
    sign = 1.0 if mode == "min" else -1.0
    return sorted(done, key=lambda t: (sign * t.ranking_value(), t.index))[0]  # type: ignore[operator]


def leader(trials: list[TrialState], mode: str) -> TrialState | None:
    """The trial ahead at the highest milestone any reached (finished or not): what a search none of whose trials
    trained to its end can still say."""
    pool = [t for t in trials if t.reached and t.score(t.reached) is not None]
    if not pool:
        return None
    top = max(t.reached for t in pool)
    return ranked([t for t in pool if t.reached == top], top, mode)[0]
