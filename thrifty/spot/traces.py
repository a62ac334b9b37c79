"""Spot availability traces: one value per tick, 1 = spot capacity there (a count for a multi-node trace).

Two sources. A file (or a config's inline trace) in the public format of the Can't-Be-Late data set,
``{"metadata": {"gap_seconds": N}, "data": [1, 1, 0, ...], "prices": [...]}`` (``prices`` optional: spot USD/hour per
tick); a multi-node file holds counts, and a job of N nodes has spot when the count is at least N. Or a synthetic
trace generated from the shipped statistics (``thrifty/data/spot_stats.json``): runs of availability and of outage
drawn in turn from each zone's measured run-length quantiles and means. No raw trace is shipped (the public one
carries no licence). The local launcher follows a trace; ``thrifty simulate --deadline-h`` replays them.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from thrifty.config import ConfigError
from thrifty.spot.preemption import TraceRow, shipped_rows
from thrifty.spot.simulate import Exponential, RunLengths, quantile_piece

SYNTHETIC_TICK_S = 600.0  # the paper's probe interval (its traces were sampled every 10 minutes)


@dataclass(frozen=True)
class AvailabilityTrace:
    """Spot availability per tick of ``gap_s`` seconds from the trace's start, and the spot price if it has one."""

    name: str
    gap_s: float
    available: np.ndarray  # bool per tick
    prices: np.ndarray | None = None  # spot USD/hour per tick (one node)

    @property
    def hours(self) -> float:
        return len(self.available) * self.gap_s / 3600.0

    @property
    def available_fraction(self) -> float:
        return float(self.available.mean()) if len(self.available) else 0.0

    def at(self, seconds: float) -> bool:
        """Spot capacity ``seconds`` after the trace's start; the last tick holds after its end."""
        i = min(max(0, int(seconds // self.gap_s)), len(self.available) - 1)
        return bool(self.available[i])

    def describe(self) -> str:
        return (f"{self.name}: {self.hours:.0f} h at {self.gap_s:g} s ticks, spot available "
                f"{self.available_fraction:.0%} of the time, {outages(self.available)} outage(s)")


def outages(available: np.ndarray) -> int:
    """Times spot went away (available -> not)."""
    a = np.asarray(available, dtype=bool)
    return int(np.count_nonzero(a[:-1] & ~a[1:])) if len(a) > 1 else 0


def parse_trace(data: Any, nodes: int = 1, name: str = "trace") -> AvailabilityTrace:
    """A trace in the public format; ValueError saying what is wrong with it."""
    if not isinstance(data, dict) or not isinstance(data.get("metadata"), dict):
        raise ValueError('a trace is {"metadata": {"gap_seconds": N}, "data": [1, 1, 0, ...]}')
    gap = data["metadata"].get("gap_seconds")
    if isinstance(gap, bool) or not isinstance(gap, (int, float)) or not math.isfinite(gap) or gap <= 0:
        raise ValueError(f"metadata.gap_seconds must be a number of seconds > 0, not {gap!r}")
    values = data.get("data")
    if not isinstance(values, list) or not values:
        raise ValueError("data must be a non-empty list, one value per tick (1 = spot available, 0 = not)")
    bad = [v for v in values if isinstance(v, bool) or not isinstance(v, (int, float)) or v < 0 or v != int(v)]
    if bad:
        raise ValueError(f"data holds {bad[0]!r}: each tick is a count of available instances (0, 1, ... N)")
    prices = data.get("prices")
    if prices is not None:
        if not isinstance(prices, list) or len(prices) != len(values) or not all(
                isinstance(p, (int, float)) and not isinstance(p, bool) and math.isfinite(p) and p >= 0 for p in prices):
            raise ValueError("prices, when given, must list one spot price >= 0 (USD/hour) per tick of data")
    return AvailabilityTrace(name, float(gap), np.asarray(values, dtype=float) >= nodes,
                             None if prices is None else np.asarray(prices, dtype=float))


def load_trace(path: str, nodes: int = 1, setting: str = "--trace") -> AvailabilityTrace:
    """A trace file in the public format; ConfigError naming ``setting`` and the problem."""
    try:
        data = json.loads(Path(path).read_text())
    except OSError as exc:
        raise ConfigError(f"{setting} {path}: cannot read it ({exc.strerror})") from None
    except ValueError as exc:
        raise ConfigError(f"{setting} {path}: not JSON ({exc})") from None
    try:
        return parse_trace(data, nodes, Path(path).name)
    except ValueError as exc:
        raise ConfigError(f"{setting} {path}: {exc}") from None


def _lengths(p50_h: float | None, p90_h: float | None, mean_h: float | None) -> RunLengths | Exponential | None:
    if mean_h is None:
        return None
    if p50_h is None or p90_h is None:  # no quantiles: exponential with that mean
        return Exponential(mean_h * 3600.0)
    return RunLengths(((1.0, *quantile_piece(p50_h * 3600.0, p90_h * 3600.0, mean_h * 3600.0)),))


def synthetic_trace(row: TraceRow, hours: float, seed: int = 0, gap_s: float = SYNTHETIC_TICK_S) -> AvailabilityTrace:
    """``hours`` of availability for ``row``'s zone: runs of capacity and of outage in turn, each drawn from the
    zone's run-length quantiles and means (lengths of at least one tick), starting in either as often as the zone
    was. Seeded: the same row, hours and seed give the same trace."""
    ticks = max(1, math.ceil(hours * 3600.0 / gap_s))
    name = f"{row.cloud} {row.zone} {'/'.join(row.instances)} (synthetic, {row.dataset})"
    up, down = _lengths(row.up_p50_h, row.up_p90_h, row.M_hours), _lengths(row.out_p50_h, row.out_p90_h,
                                                                            row.mean_outage_hours)
    if up is None or down is None:  # no preemption seen: always there
        return AvailabilityTrace(name, gap_s, np.ones(ticks, dtype=bool))
    rng = np.random.default_rng(seed)
    state = bool(rng.random() < up.mean_s / (up.mean_s + down.mean_s))
    out = np.empty(ticks, dtype=bool)
    i = 0
    while i < ticks:
        n = max(1, round((up if state else down).draw(rng) / gap_s))
        out[i:i + n] = state
        i += n
        state = not state
    return AvailabilityTrace(name, gap_s, out)


def zone_rows(cloud: str, instance: str, nodes: int = 1, zones: list[str] | None = None) -> list[TraceRow]:
    """The shipped rows of ``instance`` (one per zone and data set; availability probes, else kept-alive instances),
    optionally only ``zones``."""
    rows = [r for r in shipped_rows() if r.cloud == cloud.lower() and r.nodes == nodes
            and any(i.lower() == instance.lower() for i in r.instances) and (not zones or r.zone in zones)]
    return [r for r in rows if r.kind == "availability"] or rows
