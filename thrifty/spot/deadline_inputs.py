"""``thrifty simulate --deadline-h``'s inputs: the run (its compute, its deadline, a changeover, its prices), the
availability traces (files in the public format, else synthetic ones from the shipped statistics of the instance's
zones) and the policies. Every mistake is a :class:`ConfigError` (exit 2) naming the flag to change.
"""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Any

from thrifty.config import ConfigError, RunConfig
from thrifty.runs import read_metrics
from thrifty.spot.deadline import POLICIES, Margins
from thrifty.spot.deadline_sim import DeadlineJob
from thrifty.spot.preemption import traced_instances
from thrifty.spot.simulate_inputs import DEFAULT_RESTART_S, _instance, measured
from thrifty.spot.traces import AvailabilityTrace, load_trace, synthetic_trace, zone_rows
from thrifty.storage import open_store


def _finite(name: str, value: float | None, low: float = 0.0, allow_low: bool = False) -> None:
    if value is None:
        return
    if not math.isfinite(value) or value < low or (value == low and not allow_low):
        raise ConfigError(f"{name} must be a finite number {'>=' if allow_low else '>'} {low:g}, not {value!r}")


def _work_s(args: Any, cfg: RunConfig) -> tuple[float, str]:
    if args.work_h is not None:
        return args.work_h * 3600.0, "--work-h"
    m = measured(read_metrics(open_store(cfg.store), cfg.run_name)) if args.step_s is None or args.steps is None else None
    step_s = args.step_s if args.step_s is not None else m.step_s
    steps = args.steps if args.steps is not None else m.total_steps
    if not step_s or not steps:
        raise ConfigError(f"no run length: give --work-h HOURS (the compute the run needs), or --steps N and --step-s "
                          f"SECONDS, or train run {cfg.run_name!r} once so its store has them")
    return steps * step_s, f"{steps} steps x {step_s:.4g} s"


def traces(args: Any, cfg: RunConfig, cloud: str, instance: str, deadline_s: float) -> list[AvailabilityTrace]:
    """The files given, else one synthetic trace per shipped zone of the instance (seeded, ``--trace-hours`` long)."""
    nodes = cfg.compute.num_nodes
    if args.trace:
        out = []
        for path in args.trace:
            t = load_trace(path, nodes)
            out.append(replace(t, prices=t.prices * nodes) if t.prices is not None and nodes > 1 else t)
        return out
    hours = args.trace_hours
    if hours * 3600.0 < deadline_s:
        raise ConfigError(f"--trace-hours {hours:g} is shorter than the deadline; give at least {deadline_s / 3600:g}")
    rows = zone_rows(cloud, instance, nodes, [args.zone] if args.zone else None)
    if not rows:
        raise ConfigError(f"no shipped availability statistics for {cloud}:{instance}"
                          + (f" in zone {args.zone}" if args.zone else "") + f" ({nodes} node(s)); they cover "
                          f"{', '.join(traced_instances())}. Give --trace FILE (the public format) or another --instance")
    return [synthetic_trace(r, hours, seed=args.seed + i, gap_s=args.tick_s) for i, r in enumerate(rows)]


def build(args: Any, cfg: RunConfig) -> tuple[DeadlineJob, list[AvailabilityTrace], list[str], tuple[str, ...]]:
    """The run, its traces, the policies to compare and notes on where each input came from."""
    _finite("--deadline-h", args.deadline_h)
    _finite("--work-h", args.work_h)
    _finite("--changeover-s", args.changeover_s, allow_low=True)
    _finite("--trace-hours", args.trace_hours)
    _finite("--tick-s", args.tick_s)
    if not 1 <= args.starts <= 100_000:
        raise ConfigError(f"--starts must be between 1 and 100000, not {args.starts}")
    c = cfg.compute
    cloud, instance, spot_usd, od_usd, node_note = _instance(args.instance or c.emulate, c.num_nodes)
    work_s, work_how = _work_s(args, cfg)
    deadline_s = args.deadline_h * 3600.0
    change = args.changeover_s if args.changeover_s is not None else (c.deadline_changeover_s or DEFAULT_RESTART_S)
    if change + work_s > deadline_s:
        raise ConfigError(f"even on-demand cannot make the deadline: {work_s / 3600:.3g} h of work + a "
                          f"{change / 3600:.3g} h start-up is more than --deadline-h {args.deadline_h:g}. Raise "
                          "--deadline-h, or lower --work-h")
    margins = Margins.default(change, c.deadline_safety_margin_s, c.deadline_hysteresis_s)
    job = DeadlineJob(work_s, deadline_s, change, spot_usd, od_usd, margins)
    policies = list(POLICIES) if args.policy == "all" else [args.policy]
    notes = (f"instance: {cloud}:{instance} {node_note}".rstrip(),
             f"inputs: work {work_s / 3600:.4g} h ({work_how}), changeover {change:g} s "
             f"({'--changeover-s' if args.changeover_s is not None else 'compute.deadline_changeover_s' if c.deadline_changeover_s else 'default'}), "
             f"{args.starts} start points per trace")
    return job, traces(args, cfg, cloud, instance, deadline_s), policies, notes
