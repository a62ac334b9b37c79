"""Replay spot preemptions against a planned run: Monte Carlo over checkpoint intervals (pure, seeded).

A run is ``work_s`` of compute (steps x step time). Every ``interval`` steps it saves a checkpoint
(``save_s``), and once more at the end. A preemption throws away the work and the save in flight since
the last complete checkpoint; the next instance costs ``restart_s`` (provisioning, start-up, loading the
checkpoint) before work resumes, and may itself be preempted during it. Time between preemptions is
drawn from a :class:`Exponential` (a mean, the model Young/Daly assume) or a :class:`RunLengths` model
(the shipped traces' run-length quantiles: many short lives and a long tail, as measured). Every
trial of every interval uses the same random stream (common random numbers), so intervals are
compared on the same luck. Dollars are wall time at the spot price, restarts included (a new
instance bills from boot); on-demand runs the same checkpoints and is never preempted.
"""

from __future__ import annotations

import bisect
import functools
import itertools
import math
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np

from thrifty.spot.daly import daly_expected_wall_s, daly_interval_s
from thrifty.spot.preemption import TraceStats

MAX_WALL_FACTOR = 200.0  # a trial still unfinished after this many times its work never finishes at that interval


class PreemptionModel(Protocol):
    name: str

    @property
    def mean_s(self) -> float: ...
    def draw(self, rng: np.random.Generator) -> float: ...
    def describe(self) -> str: ...


@dataclass(frozen=True)
class Exponential:
    """Preemptions as a Poisson process: lifetimes exponential with mean ``mean_s`` (what Young/Daly assume)."""

    mean_s: float
    name: str = "exponential"

    def draw(self, rng: np.random.Generator) -> float:
        return float(rng.exponential(self.mean_s))

    def describe(self) -> str:
        return f"exponential lifetimes, mean {self.mean_s / 3600:.2f} h"


def quantile_piece(p50_s: float, p90_s: float, mean_s: float) -> tuple[float, float, float]:
    """(p50, p90, the mean of the exponential tail beyond p90) so that the piecewise quantile function's mean is
    ``mean_s``; a trace whose quantiles outweigh its mean gets a thin tail."""
    body = 0.25 * p50_s + 0.2 * (p50_s + p90_s)  # the mean's share below p90
    return p50_s, p90_s, max((mean_s - body) / 0.1 - p90_s, 0.05 * p90_s)


@dataclass(frozen=True)
class RunLengths:
    """Lifetimes resampled from the traces' run-length quantiles: a mixture over traces (weighted by their runs),
    each a piecewise-uniform quantile function through 0, p50 and p90 with an exponential tail beyond p90 whose
    mean makes the trace's mean lifetime come out right."""

    pieces: tuple[tuple[float, float, float, float], ...]  # (weight, p50_s, p90_s, tail mean beyond p90 in s)
    name: str = "quantiles"
    note: str = ""

    @classmethod
    def from_stats(cls, stats: TraceStats) -> "RunLengths":
        pieces = []
        for r in stats.rows:
            if not r.preemptions or r.up_p50_h is None or r.up_p90_h is None or r.M_hours is None:
                continue
            pieces.append((float(r.preemptions), *quantile_piece(r.up_p50_h * 3600, r.up_p90_h * 3600,
                                                                  r.M_hours * 3600)))
        if not pieces:
            raise ValueError(f"the shipped statistics of {stats.cloud} {stats.instance} have no run-length quantiles "
                             "with a preemption")
        total = sum(p[0] for p in pieces)
        return cls(tuple((w / total, a, b, t) for w, a, b, t in pieces), note=stats.describe())

    @property
    def mean_s(self) -> float:
        return sum(w * (0.25 * p50 + 0.2 * (p50 + p90) + 0.1 * (p90 + tail)) for w, p50, p90, tail in self.pieces)

    @functools.cached_property
    def _cumulative(self) -> list[float]:
        return list(itertools.accumulate(p[0] for p in self.pieces))

    def draw(self, rng: np.random.Generator) -> float:
        u = rng.random()
        i = min(bisect.bisect_right(self._cumulative, rng.random()), len(self.pieces) - 1)
        _, p50, p90, tail = self.pieces[i]
        if u < 0.5:
            return p50 * u / 0.5
        if u < 0.9:
            return p50 + (p90 - p50) * (u - 0.5) / 0.4
        return p90 + float(rng.exponential(tail))

    def describe(self) -> str:
        return f"run lengths resampled from {len(self.pieces)} trace(s)' quantiles, mean {self.mean_s / 3600:.2f} h"


@dataclass(frozen=True)
class RunPlan:
    """The run being planned: its compute, its checkpoint and restart costs, its prices."""

    total_steps: int
    step_s: float  # seconds per optimizer step on the instance
    save_s: float  # seconds per checkpoint on the step path
    restart_s: float  # preemption -> training again: provisioning, start-up, loading the checkpoint
    spot_usd_per_hour: float  # the whole job (every node)
    on_demand_usd_per_hour: float

    @property
    def work_s(self) -> float:
        return self.total_steps * self.step_s

    def saves(self, interval: int) -> int:
        return math.ceil(self.total_steps / interval)


@dataclass(frozen=True)
class IntervalResult:
    interval_steps: int
    interval_s: float
    wall_s: float  # mean over trials (inf: some trial never finished)
    wall_stderr_s: float
    wall_p90_s: float
    lost_s: float  # mean compute and saves thrown away by preemptions
    restarts: float  # mean preemptions survived
    usd: float  # mean dollars at the spot price
    daly_wall_s: float | None = None  # closed form, exponential model only

    @property
    def finishes(self) -> bool:
        return math.isfinite(self.wall_s)


@dataclass(frozen=True)
class Simulation:
    plan: RunPlan
    model_text: str
    mean_between_s: float
    trials: int
    seed: int
    results: tuple[IntervalResult, ...]
    on_demand_wall_s: float
    on_demand_usd: float
    chosen: IntervalResult
    daly_steps: int
    notes: tuple[str, ...] = field(default_factory=tuple)


def one_run(work_s: float, interval_s: float, save_s: float, restart_s: float, draw, max_wall_s: float
            ) -> tuple[float, float, int]:
    """One trial: (wall seconds, seconds thrown away, preemptions). ``draw()`` is one instance's lifetime.

    Whole segments that fit in the current instance's life are taken in one stride, so a trial costs one
    iteration per preemption, whatever the interval.
    """
    full, last = divmod(work_s, interval_s)
    full = int(full)
    n_segments = full + (1 if last > 1e-9 * interval_s else 0)
    seg_full = interval_s + save_s
    done = 0  # segments (work + its checkpoint) complete
    wall = lost = 0.0
    restarts = 0
    life = draw()  # the first instance starts training at once (start-up is not a restart)
    while done < n_segments:
        if done < full:
            k = min(full - done, int(life // seg_full))
            done += k
            wall += k * seg_full
            life -= k * seg_full
            if done == n_segments:
                break
        seg = seg_full if done < full else last + save_s
        if life >= seg:
            done += 1
            wall += seg
            life -= seg
            continue
        wall += life  # preempted inside this segment: its work and its save are lost
        lost += life
        while True:  # a new instance; it may be preempted before it has even restarted
            restarts += 1
            life = draw()
            if life >= restart_s:
                wall += restart_s
                life -= restart_s
                break
            wall += life
        if wall > max_wall_s:
            return math.inf, lost, restarts
    return wall, lost, restarts


def simulate_interval(plan: RunPlan, model: PreemptionModel, interval_steps: int, trials: int, seed: int
                      ) -> IntervalResult:
    """``trials`` runs at one interval, every one on the stream of ``seed`` (common random numbers)."""
    rng = np.random.default_rng(seed)
    interval_s = interval_steps * plan.step_s
    walls, losts, restarts = np.empty(trials), np.empty(trials), np.empty(trials)
    max_wall = MAX_WALL_FACTOR * (plan.work_s + plan.saves(interval_steps) * plan.save_s) + 100 * plan.restart_s
    for i in range(trials):
        walls[i], losts[i], restarts[i] = one_run(plan.work_s, interval_s, plan.save_s, plan.restart_s,
                                                  lambda: model.draw(rng), max_wall)
    finite = bool(np.isfinite(walls).all())
    wall = float(walls.mean()) if finite else math.inf
    daly = None
    if isinstance(model, Exponential):
        daly = daly_expected_wall_s(plan.work_s, interval_s, plan.save_s, plan.restart_s, model.mean_s)
    return IntervalResult(
        interval_steps=interval_steps, interval_s=interval_s, wall_s=wall,
        wall_stderr_s=float(walls.std(ddof=1) / math.sqrt(trials)) if finite and trials > 1 else 0.0,
        wall_p90_s=float(np.quantile(walls, 0.9)) if finite else math.inf,
        lost_s=float(losts.mean()), restarts=float(restarts.mean()),
        usd=wall / 3600.0 * plan.spot_usd_per_hour, daly_wall_s=daly)


def candidate_intervals(plan: RunPlan, mean_between_s: float, extra: tuple[int, ...] = ()) -> tuple[int, list[int]]:
    """Daly's interval in steps, and a geometric grid around it (1/16x to 16x) plus ``extra``, within the run."""
    daly_steps = max(1, round(daly_interval_s(plan.save_s, mean_between_s) / plan.step_s))
    grid = {max(1, min(plan.total_steps, round(daly_steps * 2 ** (k / 2)))) for k in range(-8, 9)}
    grid |= {min(plan.total_steps, e) for e in extra if e >= 1}
    return min(daly_steps, plan.total_steps), sorted(grid)


def simulate(plan: RunPlan, model: PreemptionModel, trials: int = 2000, seed: int = 0, extra: tuple[int, ...] = (),
             notes: tuple[str, ...] = ()) -> Simulation:
    """Every candidate interval simulated; the one with the lowest expected dollars chosen; on-demand beside it."""
    if plan.total_steps < 1 or plan.step_s <= 0 or plan.save_s < 0 or plan.restart_s < 0 or trials < 2:
        raise ValueError("a plan needs steps >= 1, step time > 0, save and restart times >= 0 and >= 2 trials")
    daly_steps, grid = candidate_intervals(plan, model.mean_s, extra)
    results = tuple(simulate_interval(plan, model, n, trials, seed) for n in grid)
    finishing = [r for r in results if r.finishes]
    if not finishing:
        raise ValueError("no interval finishes the run: preemptions come faster than a checkpoint can be saved "
                         "and the run restarted")
    chosen = min(finishing, key=lambda r: (r.usd, r.interval_steps))
    od_wall = plan.work_s + plan.saves(chosen.interval_steps) * plan.save_s
    return Simulation(plan, model.describe(), model.mean_s, trials, seed, results, od_wall,
                      od_wall / 3600.0 * plan.on_demand_usd_per_hour, chosen, daly_steps, notes)
