"""``thrifty plan``, offline: the task YAML, then the candidates ranked by what the run costs on each, and the winner.

The runtime comes from the store's measured runs of this model when there are any (their speed and
the data set's size); else the candidates rank per unit of work by the throughput table, and the
budget gate of ``thrifty run`` prices the run from its smoke test.
"""

from __future__ import annotations

from thrifty.money.budget import world_size
from thrifty.config import RunConfig
from thrifty.launchers.skypilot.candidates import candidates
from thrifty.launchers.skypilot.ranking import Costed, Ranking, startup_s
from thrifty.launchers.skypilot.task import build_task, ranked_candidates, task_config, task_yaml
from thrifty.money.throughput import Measured, measured_train_examples, speeds_for


def plan_ranking(cfg: RunConfig, source: str = "auto", measured: dict[str, Measured] | None = None) -> Ranking:
    """The plan's ranking: by the run's cost when the store measured this model (speed and data size), else per
    unit of work. ConfigError when ``compute.deadline_h`` leaves no candidate."""
    measured = measured or {}
    cands, _ = candidates(cfg, source)
    speeds = speeds_for([k.accelerator for k in cands], measured) if cands else None
    n_train = measured_train_examples(measured)
    examples = None
    if n_train is not None:
        world = world_size(cfg)
        examples = cfg.train.total_steps(n_train, world) * cfg.train.examples_per_step(world)
    return ranked_candidates(cfg, source, speeds, examples)


def _row(x: Costed) -> str:
    k = x.candidate
    if x.usd is not None:
        tail = f"{x.examples_per_s:>10.4g} {x.hours:>8.2f} h {x.usd:>9.2f}"
    else:  # relative: the job's speed in A10Gs, and dollars per A10G-hour of work
        tail = f"{x.examples_per_s:>9.2f}x {'?':>10} {x.per_work_usd:>9.3f}"
    flag = "" if k.within_cap else "  (over max_hourly_cost: SkyPilot skips it)"
    return (f"#   {k.infra:<18} {k.accelerator:<10} {k.market:<9} {k.quote.instance:<26} "
            f"{k.usd_per_hour:>9.3f} {tail}{flag}")


def plan_text(cfg: RunConfig, source: str = "auto", show: int = 8, measured: dict[str, Measured] | None = None,
              notes: list[str] | None = None) -> str:
    """``thrifty plan``: the task YAML, the candidates cheapest run first with their estimated cost, and the winner."""
    ranking = plan_ranking(cfg, source, measured)
    config = task_config(cfg, source=source, ranking=ranking)
    build_task(config)  # the YAML printed is one SkyPilot accepts
    _, left_out = candidates(cfg, source)
    timed = ranking.examples is not None
    lines = [task_yaml(config).rstrip(), ""]
    if timed:
        lines.append(f"# Estimated cost of the whole run, cheapest first ({ranking.examples:,.0f} examples to train, "
                     f"{startup_s(cfg):g} s of start-up; {cfg.compute.num_nodes} node(s); budget.max_usd "
                     f"${cfg.budget.max_usd:g}):")
    else:
        lines.append("# Estimated cost per unit of work, cheapest first (no run of this model measured in the store, so no "
                     "runtime: `thrifty run` prices it from its smoke test; speed relative to one A10G):")
    lines.append(f"#   {'infra':<18} {'accelerator':<10} {'market':<9} {'instance':<26} {'$/h job':>9} "
                 + (f"{'examples/s':>10} {'runtime':>10} {'run $':>9}" if timed
                    else f"{'x A10G':>10} {'runtime':>10} {'$/A10G-h':>9}"))
    for x in ranking.ranked[:show]:
        lines.append(_row(x))
    if len(ranking.ranked) > show:
        lines.append(f"#   ... {len(ranking.ranked) - show} more")
    for x in ranking.excluded:
        lines.append(f"#   left out: {x.label()} needs ~{x.hours:.2f} h, over compute.deadline_h {ranking.deadline_h:g} h")
    lines.append(f"# Winner: {ranking.why()}.")
    lines.append("# Speeds:")
    for name in sorted(ranking.speeds.per_gpu):
        lines.append(f"#   {name}: {ranking.speeds.how[name]}")
    if cfg.compute.deadline_h is not None and not timed:
        lines.append(f"# Note: compute.deadline_h {cfg.compute.deadline_h:g} h is checked by the budget gate of "
                     "`thrifty run`, which knows the runtime from the smoke test.")
    lines.append("# Price sources:")
    for src in sorted({x.candidate.quote.source for x in ranking.ranked}):
        lines.append(f"#   {src}")
    for note in [*left_out, *(notes or [])]:
        lines.append(f"# Note: {note}")
    lines.append("# SkyPilot tries the candidates in this order (spot first when on-demand is a fallback); runtimes "
                 "leave out preemptions; these are estimates.")
    if cfg.compute.launcher != "skypilot":
        lines.append(f"# Note: compute.launcher is {cfg.compute.launcher}; set compute.launcher=skypilot to launch this task.")
    return "\n".join(lines) + "\n"
