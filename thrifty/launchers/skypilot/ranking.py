"""Candidates ranked by what the run costs on each (rate x estimated runtime, start-up included), not by $/hour.

A faster GPU at a higher rate often costs less per run. Each candidate's runtime is the steps left
at its accelerator's speed (``thrifty.money.throughput``: measured in the store first, the table after)
plus the start-up SkyPilot bills before the first step. ``compute.deadline_h`` leaves out the
candidates that cannot finish in time; none left is a ConfigError naming the fastest one's estimate.
Without a runtime (``thrifty plan`` with no measurement and no smoke test) candidates rank by
dollars per unit of work, and the deadline waits for the budget gate, which always has one.
"""

from __future__ import annotations

from dataclasses import dataclass

from thrifty.config import ConfigError, RunConfig
from thrifty.money.estimate import PROVISIONING_S
from thrifty.launchers.skypilot.candidates import Candidate
from thrifty.money.throughput import Speeds
from thrifty.numbers import money


@dataclass(frozen=True)
class Costed:
    """A candidate with its estimated runtime and cost for the run."""

    candidate: Candidate
    examples_per_s: float  # the whole job (every GPU of every node); relative units without a runtime
    hours: float | None  # start-up + steps; None without a runtime
    usd: float | None  # hours x the job's rate
    how: str  # where its speed came from

    @property
    def per_work_usd(self) -> float:
        """Dollars per example trained: the order when no runtime is known."""
        return self.candidate.usd_per_hour / self.examples_per_s

    def label(self) -> str:
        k = self.candidate
        return f"{k.accelerator} {k.market} on {k.infra}"

    def cost_text(self) -> str:
        if self.usd is None:
            return f"{money(self.candidate.usd_per_hour)}/h at {self.examples_per_s:.3g}x an A10G's speed"
        return f"{money(self.usd)} for ~{self.hours:.2g} h"


@dataclass(frozen=True)
class Ranking:
    """The feasible candidates, cheapest run first (spot before on-demand when on-demand is only a fallback), the
    ones the deadline left out, and why the first one wins."""

    ranked: list[Costed]
    excluded: list[Costed]  # cannot finish within compute.deadline_h
    examples: float | None  # examples left to train, priced; None without a runtime
    speeds: Speeds
    deadline_h: float | None
    spot_first: bool = False  # on-demand candidates follow every spot one (compute.on_demand_fallback)

    @property
    def winner(self) -> Costed:
        return self.ranked[0]

    def why(self) -> str:
        """Which candidate wins and why, in one sentence."""
        text = self._why()
        win = self.winner
        if self.spot_first and win.candidate.market != "on-demand":
            key = (lambda x: x.usd) if win.usd is not None else (lambda x: x.per_work_usd)
            cheaper = [x for x in self.ranked if x.candidate.market == "on-demand" and key(x) < key(win)]
            if cheaper:
                text += (f" (on-demand {cheaper[0].label()} would cost {cheaper[0].cost_text()}, but on-demand is only "
                         "the fallback; set compute.use_spot=false to rank it first)")
        return text

    def _why(self) -> str:
        win = self.winner
        basis = "per run" if win.usd is not None else "per unit of work (no runtime known: start-up not counted)"
        others = [c for c in self.ranked[1:] if c.candidate.accelerator != win.candidate.accelerator]
        if not others:
            return f"{win.label()} wins: {win.cost_text()}, the only accelerator left"
        cheaper_hourly = min(others, key=lambda c: c.candidate.usd_per_hour)
        if cheaper_hourly.candidate.usd_per_hour < win.candidate.usd_per_hour:
            speedup = win.examples_per_s / cheaper_hourly.examples_per_s
            return (f"{win.label()}: {win.cost_text()} beats {cheaper_hourly.label()}: {cheaper_hourly.cost_text()}; "
                    f"{cheaper_hourly.candidate.accelerator.split(':')[0]} is cheaper per hour "
                    f"({money(cheaper_hourly.candidate.usd_per_hour)}/h vs {money(win.candidate.usd_per_hour)}/h) but "
                    f"{win.candidate.accelerator.split(':')[0]} is ~{speedup:.1f}x faster, so it costs less {basis}")
        runner = others[0]
        return (f"{win.label()} wins: {win.cost_text()}, cheapest per hour and {basis}; next "
                f"{runner.label()}: {runner.cost_text()}")


def startup_s(cfg: RunConfig) -> float:
    return PROVISIONING_S[cfg.compute.launcher]


def rank(cfg: RunConfig, cands: list[Candidate], speeds: Speeds, examples: float | None) -> Ranking:
    """Order ``cands`` by the run's estimated cost on each, ``examples`` (steps left x examples per step: the same
    work whatever the GPU count) at each one's speed; apply ``compute.deadline_h`` (see the module docstring)."""
    c = cfg.compute
    timed = speeds.absolute and examples is not None
    costed = []
    for k in cands:
        name, _, count = k.accelerator.partition(":")
        job_speed = speeds.of(name) * int(count or 1) * k.nodes
        hours = usd = None
        if timed:
            hours = (examples / job_speed + startup_s(cfg)) / 3600.0
            usd = hours * k.usd_per_hour
        costed.append(Costed(k, job_speed, hours, usd, speeds.explain(name)))
    deadline = c.deadline_h
    excluded = [x for x in costed if timed and deadline is not None and x.hours > deadline]
    feasible = [x for x in costed if x not in excluded]
    if not feasible and excluded:
        fastest = min(excluded, key=lambda x: x.hours)
        raise ConfigError(
            f"'compute.deadline_h': no candidate can finish the run within {deadline:g} h; the fastest, "
            f"{fastest.label()}, needs ~{fastest.hours:.2f} h ({fastest.how}; {startup_s(cfg):g} s of start-up) at "
            f"{money(fastest.usd)}. Raise compute.deadline_h, add a faster accelerator to compute.accelerators, or "
            "train fewer steps (train.max_epochs / train.max_steps); nothing was launched.")
    spot_first = c.use_spot and c.on_demand_fallback  # on-demand is the fallback, not a peer
    # a Kubernetes candidate has no spot market, so it is never a fallback: it ranks among the spot ones
    feasible.sort(key=lambda x: (not x.candidate.within_cap, spot_first and x.candidate.market == "on-demand",
                                 x.usd if timed else x.per_work_usd, x.candidate.usd_per_hour,
                                 -x.examples_per_s))  # at equal cost (a free cluster), the faster first
    return Ranking(feasible, excluded, examples if timed else None, speeds, deadline, spot_first)
