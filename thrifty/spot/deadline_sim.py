"""Replay spot availability against a run with a deadline, per policy, from many start points at once (numpy).

The model is the paper's: the run needs ``work_s`` of compute by ``deadline_s``; every start of an instance (the
first, a move between markets, a spot restart after a preemption) costs ``changeover_s`` of billed time without
progress; a preemption keeps the progress (the job checkpoints on its notice). Time runs in the trace's ticks: spot
goes or comes at a tick, and the policy (``thrifty.spot.deadline``, the function the watch loop asks) decides once
per tick, so a tick is also the decision gap. As in the watch loop, a job on on-demand does not see the spot market:
it learns whether spot is back by going there (``spot_maybe``). A job waiting for spot pays nothing. Dollars are
billed seconds at the spot price (the trace's own per tick when it has prices) or the on-demand price.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from thrifty.spot.deadline import Margins, wants_on_demand
from thrifty.spot.traces import AvailabilityTrace

NONE, SPOT, ON_DEMAND = 0, 1, 2


@dataclass(frozen=True)
class DeadlineJob:
    """The run: its compute, its deadline, what a changeover costs, its prices (the whole job, every node)."""

    work_s: float
    deadline_s: float
    changeover_s: float
    spot_usd_per_hour: float
    on_demand_usd_per_hour: float
    margins: Margins

    @property
    def on_demand_meets(self) -> bool:
        """On-demand from the start (one start-up, then the work) makes the deadline."""
        return self.changeover_s + self.work_s <= self.deadline_s

    @property
    def on_demand_usd(self) -> float:
        return (self.changeover_s + self.work_s) / 3600.0 * self.on_demand_usd_per_hour


@dataclass(frozen=True)
class Replay:
    """One policy on one trace, one entry per start point."""

    policy: str
    trace: str
    starts: np.ndarray  # tick index of each start
    cost_usd: np.ndarray
    finish_s: np.ndarray  # from the start to the end of the work
    spot_s: np.ndarray  # billed seconds on spot
    on_demand_s: np.ndarray  # billed seconds on on-demand
    switches: np.ndarray  # moves between the markets
    preemptions: np.ndarray
    deadline_s: float

    @property
    def met(self) -> np.ndarray:
        return self.finish_s <= self.deadline_s * (1 + 1e-9)

    @property
    def spot_share(self) -> float:
        """Spot's share of the billed hours."""
        total = float(self.spot_s.sum() + self.on_demand_s.sum())
        return float(self.spot_s.sum()) / total if total else 0.0


def start_points(trace: AvailabilityTrace, deadline_s: float, count: int) -> np.ndarray:
    """``count`` start ticks spread evenly over the trace, each leaving the whole deadline inside it (fewer when the
    trace is short; ValueError when it is shorter than the deadline)."""
    span = math.ceil(deadline_s / trace.gap_s)
    last = len(trace.available) - span
    if last < 0:
        raise ValueError(f"{trace.name} covers {trace.hours:.1f} h, less than the {deadline_s / 3600:g} h deadline")
    return np.unique(np.linspace(0, last, num=max(1, count)).round().astype(np.int64))


def replay(policy: str, job: DeadlineJob, trace: AvailabilityTrace, starts: np.ndarray,
           spot_visible: bool = False) -> Replay:
    """``policy`` from every start in ``starts`` through ``trace`` (spot is gone after the trace's end).
    ``spot_visible``: an on-demand job sees the spot market too (the paper's assumption; the watch loop cannot)."""
    n, gap, d = len(starts), trace.gap_s, job.changeover_s
    avail_all, length = trace.available, len(trace.available)
    inst = np.full(n, NONE, dtype=np.int8)
    market = np.full(n, NONE, dtype=np.int8)  # the market chosen last (NONE before the first decision)
    startup = np.zeros(n)
    done = np.zeros(n)
    cost, spot_s, od_s = np.zeros(n), np.zeros(n), np.zeros(n)
    switches, preemptions = np.zeros(n, dtype=np.int64), np.zeros(n, dtype=np.int64)
    finish = np.full(n, math.inf)
    active = np.ones(n, dtype=bool)
    misses = np.zeros(n, dtype=np.int64)  # moves to spot in a row that found no capacity
    trying = np.zeros(n, dtype=bool)  # left on-demand for spot, no capacity found yet
    # past the deadline the safety net holds the job on on-demand, which ends it within a changeover and the work
    for k in range(math.ceil((job.deadline_s + d + job.work_s) / gap) + 2):
        if not active.any():
            break
        idx = starts + k
        inside = idx < length
        avail = np.where(inside, avail_all[np.minimum(idx, length - 1)], False)
        spot_price = (np.where(inside, trace.prices[np.minimum(idx, length - 1)], job.spot_usd_per_hour)
                      if trace.prices is not None else job.spot_usd_per_hour)
        elapsed = k * gap
        lost = active & (inst == SPOT) & ~avail  # spot went away: preempted, progress kept
        preemptions += lost
        inst[lost] = NONE
        on_od = inst == ON_DEMAND
        maybe = avail if spot_visible else on_od | avail
        want = wants_on_demand(policy, on_od, elapsed, job.deadline_s, job.work_s, done, maybe, d, gap,
                               job.margins, misses)
        chosen = np.where(want, ON_DEMAND, SPOT).astype(np.int8)
        switches += active & (market != NONE) & (market != chosen)
        market = np.where(active, chosen, market)
        leave = active & ~want & on_od
        inst[leave] = NONE
        start = active & ((want & ~on_od) | (~want & (inst == NONE) & avail))
        misses += start & want & trying  # back on on-demand without having found spot
        misses[start & ~want] = 0
        trying = (trying | leave) & ~start
        inst[start] = np.where(want[start], ON_DEMAND, SPOT)
        startup[start] = d
        running = active & (inst != NONE)
        progress = np.where(running, np.clip(gap - startup, 0.0, gap), 0.0)
        startup = np.where(running, np.maximum(0.0, startup - gap), startup)
        left = job.work_s - done
        ends = running & (progress >= left)
        billed = np.where(running, np.where(ends, gap - (progress - left), gap), 0.0)
        done = np.where(ends, job.work_s, done + progress)
        finish = np.where(ends, elapsed + billed, finish)
        on_spot = inst == SPOT
        cost += billed / 3600.0 * np.where(on_spot, spot_price, job.on_demand_usd_per_hour)
        spot_s += np.where(on_spot, billed, 0.0)
        od_s += np.where(on_spot, 0.0, billed)
        active &= ~ends
    return Replay(policy, trace.name, starts, cost, finish, spot_s, od_s, switches, preemptions, job.deadline_s)


@dataclass(frozen=True)
class Study:
    """Every policy over every trace, from the same start points per trace."""

    job: DeadlineJob
    replays: dict[str, list[Replay]]  # policy -> one Replay per trace, in the traces' order
    traces: tuple[str, ...]  # each trace's description
    spot_visible: bool = False
    notes: tuple[str, ...] = ()

    def pooled(self, policy: str) -> dict[str, float]:
        """A policy over every start of every trace: mean cost, deadlines met, spot's share, moves, preemptions."""
        rs = self.replays[policy]
        cost = np.concatenate([r.cost_usd for r in rs])
        spot, od = sum(float(r.spot_s.sum()) for r in rs), sum(float(r.on_demand_s.sum()) for r in rs)
        return {"usd": float(cost.mean()), "usd_max": float(cost.max()),
                "met": float(np.concatenate([r.met for r in rs]).mean()),
                "spot_share": spot / (spot + od) if spot + od else 0.0,
                "switches": float(np.concatenate([r.switches for r in rs]).mean()),
                "preemptions": float(np.concatenate([r.preemptions for r in rs]).mean()),
                "starts": float(len(cost))}


def run_study(job: DeadlineJob, traces: list[AvailabilityTrace], policies: list[str], starts: int,
              spot_visible: bool = False, notes: tuple[str, ...] = ()) -> Study:
    """``policies`` on each trace from ``starts`` start points (the same ones for every policy)."""
    replays: dict[str, list[Replay]] = {p: [] for p in policies}
    for trace in traces:
        points = start_points(trace, job.deadline_s, starts)
        for p in policies:
            replays[p].append(replay(p, job, trace, points, spot_visible))
    return Study(job, replays, tuple(t.describe() for t in traces), spot_visible, notes)
