"""``thrifty simulate``'s inputs: the run's step and save times, its length, its instance and prices, the preemption
model. Flags win; else what an earlier run of the same ``run_name`` measured (its metric lines in the store); else
an error that says which flag to pass. Every mistake is a :class:`ConfigError` (exit 2) naming the fix.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass
from typing import Any

from thrifty.config import ConfigError, RunConfig
from thrifty.config.base import MAX_FLOAT, MAX_INT
from thrifty.spot.preemption import (
    MtbpChoice,
    choose_mtbp,
    ledger_observations,
    trace_stats,
    traced_instances,
)
from thrifty.money.pricing import PricingError, age_note, find_instance
from thrifty.runs import read_metrics
from thrifty.spot.simulate import Exponential, PreemptionModel, RunLengths, RunPlan
from thrifty.storage import Store, open_store

DEFAULT_RESTART_S = 300.0  # a preemption to training again: a new VM, setup, the checkpoint loaded (SkyPilot, typical)


@dataclass(frozen=True)
class Measured:
    """What an earlier run's metric lines say: median step time, median save time, total steps."""

    step_s: float | None
    save_s: float | None
    total_steps: int | None
    lines: int


def measured(records: list[dict[str, Any]]) -> Measured:
    """Medians over a run's metric records (pure): step lines' ``step_time_s``, checkpoint events' ``save_s``."""
    steps = [r["step_time_s"] for r in records if "event" not in r and isinstance(r.get("step_time_s"), (int, float))]
    saves = [r["save_s"] for r in records if r.get("event") == "checkpoint" and isinstance(r.get("save_s"), (int, float))]
    totals = [r["total_steps"] for r in records if r.get("event") == "start" and isinstance(r.get("total_steps"), int)]
    return Measured(statistics.median(steps) if steps else None, statistics.median(saves) if saves else None,
                    totals[-1] if totals else None, len(records))


def _positive(name: str, value: float | None, allow_zero: bool = False) -> None:
    if value is None:
        return
    if not math.isfinite(value) or value < 0 or (value == 0 and not allow_zero) or value > MAX_FLOAT:
        raise ConfigError(f"{name} must be a finite number {'>= 0' if allow_zero else '> 0'} and at most "
                          f"{MAX_FLOAT:.0e} s, not {value!r}")


def _instance(spec: str, nodes: int) -> tuple[str, str, float, float, str]:
    cloud, sep, instance = spec.partition(":")
    if not sep or not instance:
        raise ConfigError(f"--instance {spec!r} must look like CLOUD:INSTANCE, e.g. aws:p3.2xlarge")
    try:
        row = find_instance(cloud, instance)
    except PricingError as exc:
        raise ConfigError(f"--instance: {exc} (`thrifty prices` lists them)") from None
    if row.spot_usd_per_hour is None:
        raise ConfigError(f"--instance {spec}: no spot price is known for it; pick another instance")
    note = (f"{nodes} node(s), " if nodes > 1 else "") + f"({age_note(row.as_of)})"
    return row.cloud, row.instance, row.spot_usd_per_hour * nodes, row.on_demand_usd_per_hour * nodes, note


def _choice(args: Any, cfg: RunConfig, store: Store | None, cloud: str, instance: str, nodes: int) -> MtbpChoice:
    source, zone = args.preemptions, args.zone
    if args.mtbp_s is not None:
        return MtbpChoice(args.mtbp_s, "flag", "--mtbp-s")
    if source == "config":
        return MtbpChoice(cfg.train.mean_time_between_preemptions_s, "config", "train.mean_time_between_preemptions_s")
    if source == "ledger":
        obs = ledger_observations(store, cloud, instance)
        if not obs.preemptions:
            raise ConfigError(f"the ledgers of {cfg.store} hold no preemption of {cloud} {instance} spot "
                              f"({obs.attempts} attempt(s), {obs.alive_s / 3600:.1f} h): use --preemptions shipped "
                              "or config, or give --mtbp-s SECONDS")
        return MtbpChoice(obs.mtbp_s or 0.0, "ledger", obs.describe(cloud, instance))
    if source == "shipped":
        stats = trace_stats(cloud, instance, nodes, zone)
        if stats is None or not stats.mtbp_s:
            raise ConfigError(_no_stats(cloud, instance, zone, stats is not None))
        return MtbpChoice(stats.mtbp_s, "shipped", stats.describe())
    return choose_mtbp(store, cloud, instance, True, cfg.train.mean_time_between_preemptions_s, nodes, zone=zone)


def _no_stats(cloud: str, instance: str, zone: str | None, seen: bool) -> str:
    if seen:
        return (f"the shipped traces of {cloud} {instance}{f' in {zone}' if zone else ''} saw no preemption: "
                "give --mtbp-s SECONDS or use --preemptions config")
    return (f"no shipped preemption statistics for {cloud}:{instance}{f' in zone {zone}' if zone else ''}; they "
            f"cover {', '.join(traced_instances())}. Use --preemptions ledger or config, --mtbp-s SECONDS, or "
            "--instance one of those")


def build(args: Any, cfg: RunConfig) -> tuple[RunPlan, PreemptionModel, tuple[str, ...]]:
    """The plan and the preemption model ``thrifty simulate`` runs, from flags, the config and the store."""
    for name in ("step_s", "mtbp_s"):
        _positive(f"--{name.replace('_', '-')}", getattr(args, name))
    for name in ("save_s", "restart_s"):
        _positive(f"--{name.replace('_', '-')}", getattr(args, name), allow_zero=True)
    if args.steps is not None and not 1 <= args.steps <= MAX_INT:
        raise ConfigError(f"--steps must be between 1 and {MAX_INT}, not {args.steps}")
    if not 2 <= args.trials <= 1_000_000:
        raise ConfigError(f"--trials must be between 2 and 1000000, not {args.trials}")
    if any(e < 1 for e in args.every or ()):
        raise ConfigError("--every takes a positive number of steps")
    if args.distribution == "quantiles" and (args.preemptions in ("ledger", "config") or args.mtbp_s is not None):
        raise ConfigError("--distribution quantiles resamples the shipped traces' run lengths: use it with "
                          "--preemptions shipped (or auto), without --mtbp-s")

    nodes = cfg.compute.num_nodes
    cloud, instance, spot_usd, od_usd, node_note = _instance(args.instance or cfg.compute.emulate, nodes)
    need_store = args.step_s is None or args.save_s is None or args.steps is None or (
        args.preemptions in ("auto", "ledger") and args.mtbp_s is None and args.distribution == "exponential")
    store = open_store(cfg.store) if need_store else None
    m = measured(read_metrics(store, cfg.run_name)) if store is not None and (
        args.step_s is None or args.save_s is None or args.steps is None) else Measured(None, None, None, 0)
    where = f"run {cfg.run_name!r} in {cfg.store}"
    step_s = args.step_s if args.step_s is not None else m.step_s
    save_s = args.save_s if args.save_s is not None else m.save_s
    steps = args.steps if args.steps is not None else m.total_steps
    if step_s is None or step_s <= 0:
        raise ConfigError(f"no step time: {where} has no measured steps. Pass --step-s SECONDS (seconds per optimizer "
                          "step on the instance), or train the run once (even briefly) and simulate again")
    if save_s is None:
        raise ConfigError(f"no save time: {where} has no checkpoint measured. Pass --save-s SECONDS (seconds a "
                          "checkpoint takes on the step path)")
    if steps is None:
        raise ConfigError(f"no run length: {where} has no start record. Pass --steps N (the run's optimizer steps)")
    def said(flag: str) -> str:
        return flag if getattr(args, flag[2:].replace("-", "_")) is not None else f"measured by {where}"

    notes = [f"instance: {cloud}:{instance} {node_note}".rstrip(),
             f"inputs: step {step_s:.4g} s ({said('--step-s')}), save {save_s:.4g} s ({said('--save-s')}), "
             f"{steps} steps ({said('--steps')})"]

    if args.distribution == "quantiles":
        stats = trace_stats(cloud, instance, nodes, args.zone)
        if stats is None or not stats.preemptions:
            raise ConfigError(_no_stats(cloud, instance, args.zone, stats is not None))
        model: PreemptionModel = RunLengths.from_stats(stats)
        notes.append(f"preemption data: {stats.describe()}")
    else:
        choice = _choice(args, cfg, store, cloud, instance, nodes)
        model = Exponential(choice.mtbp_s)
        notes.append(f"mean time between preemptions: {choice.describe()}")
    plan = RunPlan(total_steps=int(steps), step_s=float(step_s), save_s=float(save_s),
                   restart_s=DEFAULT_RESTART_S if args.restart_s is None else args.restart_s,
                   spot_usd_per_hour=spot_usd, on_demand_usd_per_hour=od_usd)
    return plan, model, tuple(notes)
