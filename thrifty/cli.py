"""``thrifty``: the command line. Each command takes --config FILE and repeatable --set section.key=value."""

from __future__ import annotations

import argparse
import sys

from thrifty.config import ConfigError, RunConfig

EXIT_BAD_INPUT = 2


def cmd_train(args: argparse.Namespace) -> int:
    from training.cli import run_train

    return run_train(args)


def cmd_run(args: argparse.Namespace) -> int:
    """The main job: the Prefect flow preprocess -> smoke -> launch and watch -> report."""
    from rich.console import Console
    from rich.table import Table

    from thrifty.preflight import check_before_spending
    from training.cli import resolve_config

    console = Console(stderr=True)
    try:
        cfg = resolve_config(args)
        check_before_spending(cfg)
    except ConfigError as exc:
        console.print(f"[red]error:[/] {exc}", highlight=False)
        return EXIT_BAD_INPUT
    console.print(f"[bold]thrifty run[/] {cfg.run_name}: recipe {cfg.recipe}, store {cfg.store}, "
                  f"{cfg.compute.launcher} launcher ({cfg.compute.emulate} {'spot' if cfg.compute.use_spot else 'on-demand'})")
    from flows.train_pipeline import train_pipeline

    state = train_pipeline(config=cfg, return_state=True)
    if not state.is_completed():
        console.print(f"[red]run {cfg.run_name} {state.name.lower()}:[/] {state.message}", highlight=False)
        return 1
    out = state.result()
    summary = out["summary"] or {}
    table = Table(title=f"run {cfg.run_name}", show_header=False)
    table.add_row("preprocessing cache", "hit" if out["cache_hit"] else "miss")
    table.add_row("smoke test", f"passed ({out['smoke']['steps']} steps, {out['smoke']['precision_checked']} autocast)")
    attempts = out["job"]["attempts"]
    table.add_row("attempts", f"{len(attempts)} ({out['job']['preemptions']} preemption(s) survived, "
                              f"resumed {summary.get('resumes', 0)} time(s))")
    table.add_row("steps", f"{summary.get('steps')} / {summary.get('total_steps')}"
                           + (" (stopped early)" if summary.get("stopped_early") else ""))
    for name, value in (summary.get("final_metrics") or {}).items():
        table.add_row(name, f"{value:.4f}")
    table.add_row("cost (emulated)", f"${out['cost_usd']:.5f} vs ${out['on_demand_usd']:.5f} on-demand")
    Console().print(table)
    return 0


def cmd_config(args: argparse.Namespace) -> int:
    """Print the resolved RunConfig (or its JSON schema) without running anything."""
    import json

    from training.cli import resolve_config

    if args.schema:
        print(json.dumps(RunConfig.model_json_schema(), indent=2))
        return 0
    try:
        cfg = resolve_config(args)
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    print(cfg.model_dump_json(indent=2))
    return 0


def build_parser() -> argparse.ArgumentParser:
    from training.cli import add_config_args

    parser = argparse.ArgumentParser(prog="thrifty", description="Cheap, safe model training on spot GPUs.")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    p = sub.add_parser("train", help="run the training program here (what a cloud node runs); resumes automatically")
    add_config_args(p)
    p.set_defaults(func=cmd_train)

    p = sub.add_parser("run", help="run the main job: preprocess, smoke test, launch and watch, report (Prefect flow)")
    add_config_args(p)
    p.set_defaults(func=cmd_run)

    p = sub.add_parser("config", help="print the resolved RunConfig")
    add_config_args(p)
    p.add_argument("--schema", action="store_true", help="print the JSON schema instead")
    p.set_defaults(func=cmd_config)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
