"""The Prefect commands of ``thrifty``: ``run`` (the train pipeline), ``sweep`` (the search) and ``archive --apply``
(the archival flow)."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING, Any

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from flows.hooks import ENDS
from thrifty.cli import config_for_today
from thrifty.config import ConfigError
from thrifty.launchers.preflight import check_before_spending
from thrifty.protocol import EXIT_BAD_INPUT, EXIT_BUDGET, EXIT_FAILED, EXIT_OK
from training.validate import check_config
from thrifty.numbers import metric, money, pairs

if TYPE_CHECKING:
    from thrifty.sweep import SweepConfig

EXIT_CODES = {"StoppedAtCap": EXIT_BUDGET, "BadInput": EXIT_BAD_INPUT}  # by the flow's final state


def failed(console: Console, what: str, state: Any) -> int:
    """Say how a flow that did not complete ended, in one line; its exit code by the state's name. A message that
    is already the end's sentence (it starts with ``what``) is said as it is."""
    text = (state.message or "") if (state.message or "").startswith(f"{what} ") else \
        f"{what} {ENDS.get(state.name, state.name.lower())}: {state.message}"
    console.print(f"[red]{escape(text)}[/]", highlight=False, soft_wrap=True)
    return EXIT_CODES.get(state.name, EXIT_FAILED)


def cmd_run(args: argparse.Namespace) -> int:
    """The main job: the Prefect flow preprocess -> smoke -> launch and watch -> report."""
    console = Console(stderr=True)
    cfg = config_for_today(args)
    check_before_spending(cfg)
    check_config(cfg)  # an unknown recipe or a bad option: exit 2 now, not after a flow has started
    console.print(f"[bold]thrifty run[/] {cfg.run_name}: recipe {cfg.recipe}, store {cfg.store}, "
                  f"{cfg.compute.launcher} launcher ({cfg.compute.emulate} {'spot' if cfg.compute.use_spot else 'on-demand'})")
    from flows.train_pipeline import train_pipeline

    state = train_pipeline(config=cfg, return_state=True)
    if not state.is_completed():
        return failed(console, f"run {cfg.run_name}", state)
    out = state.result()
    summary = out.summary
    table = Table(title=f"run {out.run_name}", show_header=False)
    table.add_row("preprocessing cache", "none (script mode)" if cfg.recipe == "script" else
                  "hit" if out.cache_hit else "miss")
    if out.already_finished:
        table.add_row("launch", "skipped: this run already finished with this config (change a train setting to "
                                "continue it, or use a new run_name to train again)")
    else:
        table.add_row("smoke test", f"passed ({out.smoke.steps} steps, saved and resumed)" if cfg.recipe == "script"
                      else f"passed ({out.smoke.steps} steps, {out.smoke.precision_checked} autocast)")
        table.add_row("attempts", f"{len(out.job.attempts)} ({out.job.preemptions} preemption(s) survived, "
                                  f"resumed {summary.resumes if summary else 0} time(s))")
    if summary is not None:
        table.add_row("steps", f"{summary.steps} / {summary.total_steps}" + (" (stopped early)" if summary.stopped_early else ""))
        for name, value in summary.final_metrics.items():
            table.add_row(name, metric(value))
    table.add_row("cost (emulated)", f"{money(out.cost_usd)} spent by earlier jobs of this run"
                  if out.already_finished else f"{money(out.cost_usd)} vs {money(out.on_demand_usd)} on-demand")
    Console().print(table)
    if out.savings is not None and out.savings.end:
        print(out.savings.end)  # how it ended, what it cost and saved, what next: the run's one sentence
    return EXIT_OK


def sweep_config(args: argparse.Namespace) -> "SweepConfig":
    """The SweepConfig from ``--config`` (YAML or JSON) and ``--set`` overrides, every trial built and checked."""
    from thrifty.config import apply_overrides, read_config_file
    from thrifty.sweep import build_sweep

    if not args.config:
        raise ConfigError("thrifty sweep needs --config FILE, a SweepConfig (see examples/sweep.yaml)")
    from flows.sweep import check_sweep

    cfg = build_sweep(apply_overrides(read_config_file(args.config) or {}, args.overrides), args.config)
    check_sweep(cfg)  # exit 2 now, not after a flow has started
    return cfg


def cmd_sweep(args: argparse.Namespace) -> int:
    """The search: the thrifty-sweep flow, each trial a thrifty-train child flow run, under the sweep's caps."""
    console = Console(stderr=True)
    cfg = sweep_config(args)
    console.print(f"[bold]thrifty sweep[/] {cfg.name}: {cfg.max_trials} trial(s) over {', '.join(cfg.space)}, rungs "
                  f"{cfg.rungs()} epochs, {cfg.concurrency} at once, cap ${cfg.max_usd:g}; store {cfg.base.store}")
    from flows.sweep import sweep

    state = sweep(config=cfg, return_state=True)
    if not state.is_completed():
        return failed(console, f"sweep {cfg.name}", state)
    out = state.result()
    table = Table(title=f"sweep {out.name}: by rung reached, then {out.metric} ({out.mode})")
    for col in ("trial", *cfg.space, "epochs", out.metric, "cost $", "state"):
        table.add_column(col, justify="left" if col in ("trial", "state") else "right")
    for row in out.leaderboard:
        table.add_row(*(metric(row.get(c)) for c in ("trial", *cfg.space, "epochs", out.metric, "cost $", "state")))
    Console(width=max(Console().width, 160)).print(table)  # the values' columns stay readable in a log
    if out.best_run:
        print(f"best: {out.best_run} {pairs(out.best_values)}: {out.metric} {metric(out.best_value)} (trained to its end, "
              f"epoch {out.best_epochs}); gold weights {out.gold}")
    else:
        print("no best: no trial trained to its end (the leaderboard shows who leads); start the search again with "
              "larger caps to train on")
    print(f"spent {money(out.spent_usd)} of ${out.max_usd:g}; every trial it drew trained to the end: "
          f"~{money(out.full_usd)} (saved {out.saved_fraction:.0%}). Leaderboard: artifact 'thrifty-sweep-{out.name}' "
          "in Prefect.")
    return EXIT_OK


def cmd_archive_apply(args: argparse.Namespace) -> int:
    """``thrifty archive --apply``: the thrifty-archive flow, which moves the stale objects and publishes the report."""
    from flows.archive_stale import archive_stale
    from thrifty.archive import human_bytes

    state = archive_stale(store=args.store, older_than_days=args.older_than_days,
                          active_window_days=args.active_window_days, tier=args.tier, as_of=args.as_of,
                          dry_run=False, return_state=True)
    if not state.is_completed():
        Console(stderr=True).print(f"[red]archive {state.name.lower()}:[/] {state.message}", highlight=False,
                                   soft_wrap=True)
        return EXIT_FAILED
    s = state.result()
    print(f"moved {s['moved']} objects ({human_bytes(s['bytes_moved'])}) to {s['target_class']}; "
          f"{s['left_alone']} left alone, {s['already_cold']} already cold. Report: artifact "
          "'thrifty-archive' in Prefect.")
    return EXIT_OK
