"""``thrifty``: the command line. Each command takes --config FILE and repeatable --set section.key=value.

This module parses and dispatches. Commands that need only the library run here; the others
live in the room they drive and are named by module path, so the library imports none of them:
``train`` and ``smoke`` in ``training.cli`` (the training program), ``run``, ``sweep`` and ``archive
--apply`` in ``flows.cli`` (Prefect flows), ``deploy`` in ``deployments.deploy``. A user-fixable
error (a ``ConfigError`` or ``StoreError``) is caught once, in :func:`guarded`: exit 2 and the
message, no traceback.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from typing import Callable

from thrifty.config import ConfigError, RunConfig, add_config_args, config_from_args
from thrifty.protocol import EXIT_BAD_INPUT, EXIT_FAILED, EXIT_OK
from thrifty.storage import StoreError, StoreUnavailable

Handler = Callable[[argparse.Namespace], int]

# commands handled outside the library, by "module:function"
ELSEWHERE = {
    "train": "training.cli:cmd_train",
    "smoke": "training.cli:cmd_smoke",
    "run": "flows.cli:cmd_run",
    "sweep": "flows.cli:cmd_sweep",
    "archive --apply": "flows.cli:cmd_archive_apply",
    "archive gold --export": "training.export:cmd_export",
    "deploy": "deployments.deploy:cmd_deploy",
}


def error(message: str) -> None:
    """An error line on stderr, never re-wrapped (users copy commands out of these messages)."""
    from rich.console import Console
    from rich.markup import escape

    from thrifty.config.echo import shorten_words

    # escaped: '[lo, hi]' in a message is text, not rich markup to drop; a 100 KB argument it quotes is cut
    Console(stderr=True).print(f"[red]error:[/] {escape(shorten_words(message))}", highlight=False, soft_wrap=True)


def guarded(handler: Handler, args: argparse.Namespace) -> int:
    """Run a command; a user-fixable error is one message and exit 2; a store that stayed down is one message and
    exit 1 (a failure, worth a restart: never taken for bad input)."""
    try:
        return handler(args)
    except (ConfigError, StoreError) as exc:
        error(str(exc))
        return EXIT_BAD_INPUT
    except StoreUnavailable as exc:
        error(str(exc))
        return EXIT_FAILED


def elsewhere(command: str) -> Handler:
    module, _, name = ELSEWHERE[command].partition(":")
    return getattr(importlib.import_module(module), name)


def resolved_config(args: argparse.Namespace) -> RunConfig:
    return config_from_args(args, dict(os.environ))


def config_for_today(args: argparse.Namespace) -> RunConfig:
    """The config as a run started now trains it: '{date}' in run_name resolved to today (UTC)."""
    import datetime as dt

    return resolved_config(args).resolved(dt.datetime.now(dt.timezone.utc).date())


# ---------------------------------------------------------------- commands that need only the library


def cmd_report(args: argparse.Namespace) -> int:
    """The cross-run savings table of a store (thrifty.report.command), as the `thrifty-savings` artifact shows it."""
    from thrifty.report.command import report

    return report(resolved_config(args), by=args.by, month=args.month, levers=args.levers)


def cmd_config(args: argparse.Namespace) -> int:
    """Print the resolved RunConfig (or its JSON schema) without running anything."""
    import json

    if args.schema:
        print(json.dumps(RunConfig.model_json_schema(), indent=2))
        return EXIT_OK
    print(resolved_config(args).model_dump_json(indent=2))
    return EXIT_OK


def cmd_plan(args: argparse.Namespace) -> int:
    """Print the SkyPilot task YAML and the estimated cost of its cheapest candidates (offline)."""
    from thrifty.launchers.skypilot import plan_text

    cfg = config_for_today(args)
    measured, notes = {}, []
    if args.speeds == "store":  # best effort: a store this machine cannot read leaves the table's speeds
        from thrifty.storage import open_store
        from thrifty.money.throughput import measured_speeds, speed_key

        try:
            measured = measured_speeds(open_store(cfg.store), speed_key(cfg))
        except Exception as exc:  # noqa: BLE001 - credentials, network, a missing bucket: all mean "not measured"
            notes.append(f"measured speeds not read from {cfg.store} ({type(exc).__name__}: {exc}); "
                         "the throughput table's are used (--speeds table skips the store)")
    print(plan_text(cfg, source=args.source, measured=measured, notes=notes), end="")
    return EXIT_OK


def cmd_prices(args: argparse.Namespace) -> int:
    """Print the price table (instances, or storage tiers), filtered by accelerator and cloud."""
    from thrifty.money.prices.text import prices_text
    from thrifty.money.pricing import PricingError

    try:
        print(prices_text(args.accelerator, args.cloud, args.storage, args.source), end="")
    except PricingError as exc:
        raise ConfigError(str(exc)) from None
    return EXIT_OK


def cmd_simulate(args: argparse.Namespace) -> int:
    """Replay preemptions against the planned run: expected wall time, dollars, lost work per checkpoint interval."""

    from thrifty.spot import simulate, simulate_inputs, simulate_report

    if args.deadline_h is not None:
        return _simulate_deadline(args)
    plan, model, notes = simulate_inputs.build(args, resolved_config(args))
    try:
        sim = simulate.simulate(plan, model, trials=args.trials, seed=args.seed, extra=tuple(args.every or ()),
                                notes=notes)
    except ValueError as exc:
        raise ConfigError(f"{exc}: check --save-s, --restart-s and the preemption data") from None
    print(simulate_report.table_text(sim), end="")
    _write_chart(args.chart, simulate_report.chart_svg(sim))
    return EXIT_OK


def _simulate_deadline(args: argparse.Namespace) -> int:
    """``thrifty simulate --deadline-h``: the deadline policies over availability traces, from many start points."""
    from thrifty.spot import deadline_inputs, deadline_report, deadline_sim

    job, traces, policies, notes = deadline_inputs.build(args, resolved_config(args))
    try:
        study = deadline_sim.run_study(job, traces, policies, args.starts, args.spot_visible, notes)
    except ValueError as exc:
        raise ConfigError(f"{exc}: give longer traces (--trace-hours) or a shorter --deadline-h") from None
    print(deadline_report.table_text(study), end="")
    _write_chart(args.chart, deadline_report.chart_svg(study))
    return EXIT_OK


def _write_chart(path: str | None, svg: str) -> None:
    if not path:
        return
    from pathlib import Path

    try:
        Path(path).write_text(svg)
    except OSError as exc:
        raise ConfigError(f"--chart {path}: cannot write it ({exc.strerror}); pick a writable path") from None
    print(f"chart: {path}")


def cmd_archive(args: argparse.Namespace) -> int:
    """Plan (default) or apply an archival pass; restore a run; mark gold or pinned; bucket lifecycle rules."""
    from rich.console import Console

    from thrifty import archive
    from thrifty.archive import commands

    settings = archive.build_settings(
        {"store": args.store, "older_than_days": args.older_than_days,
         "active_window_days": args.active_window_days, "tier": args.tier, "as_of": args.as_of},
        "the command line")
    action = args.archive_command
    if action in ("gold", "pin", "unmark"):
        done = commands.mark(settings, action, args.target)
        args.settings = settings
        return elsewhere("archive gold --export")(args) if getattr(args, "export", None) else done
    if action == "restore":
        return commands.restore(settings, args.run_id, args.priority, args.days)
    if action == "lifecycle":
        return commands.lifecycle(settings, args.apply)
    if args.apply:
        archive.open_checked(settings, writable=True)  # a missing bucket or a read-only key: said now, not in a flow
        return elsewhere("archive --apply")(args)
    with Console(stderr=True).status(f"scanning {settings.store}"):
        store = archive.open_checked(settings, writable=False)
        plan = archive.scan(store, settings)
    print(archive.markdown(plan), end="")
    if plan.to_archive:
        print("\nNothing was moved (dry run). Run again with --apply to move these objects.")
    return EXIT_OK


def cmd_new(args: argparse.Namespace) -> int:
    """Write a working, tested template to start from."""
    from pathlib import Path

    from thrifty.usercode import scaffold

    where = Path(args.dir)
    written = (scaffold.new_recipe if args.kind == "recipe" else scaffold.new_script)(args.name, where)
    for path in written:
        print(f"wrote {path}")
    print(f"\nNext, from {where}/: `python -m pytest {written[-1].relative_to(where)}` (the CPU smoke test), then "
          f"`thrifty run --config {written[-2].relative_to(where)}`.")
    return EXIT_OK


# ---------------------------------------------------------------- the parser


def build_parser() -> argparse.ArgumentParser:
    from thrifty.storage import RESTORE_PRIORITIES

    parser = argparse.ArgumentParser(prog="thrifty", description="Cheap, safe model training on spot GPUs.")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    with_config: tuple[tuple[str, str, Handler | str], ...] = (
        ("train", "run the training program here (what a cloud node runs); resumes automatically", "train"),
        ("run", "run the main job: preprocess, smoke test, launch and watch, report (Prefect flow)", "run"),
        ("sweep", "search hyperparameters under hard caps (successive halving, each trial a run; Prefect flow); "
                  "--config is a SweepConfig, --set e.g. max_usd=20 or base.train.micro_batch=32", "sweep"),
        ("smoke", "run the CPU smoke test alone (no Prefect, nothing launched)", "smoke"),
        ("report", "print the cross-run savings table of the config's store", cmd_report),
        ("config", "print the resolved RunConfig", cmd_config),
    )
    for name, what, func in with_config:
        p = sub.add_parser(name, help=what)
        add_config_args(p)
        p.set_defaults(func=func)
        if name == "config":
            p.add_argument("--schema", action="store_true", help="print the JSON schema instead")
        if name == "report":
            p.add_argument("--by", metavar="TAG", help="group the runs by this cost allocation tag (e.g. team)")
            p.add_argument("--month", metavar="YYYY-MM", help="only the runs that started in this month (UTC)")
            p.add_argument("--levers", action="store_true", help="what each lever saved across the runs, in dollars "
                                                                 "and instance-hours")

    p = sub.add_parser("plan", help="print the SkyPilot task YAML and its candidates ranked by the run's estimated cost at "
                                    "today's prices (nothing launched)")
    add_config_args(p)
    p.add_argument("--source", choices=["auto", "offline", "skypilot"], default="auto",
                   help="prices: the freshest (auto: the clouds' own sources, then SkyPilot's catalog, then the dated table), the "
                        "shipped table only, or SkyPilot's catalog only")
    p.add_argument("--speeds", choices=["store", "table"], default="store",
                   help="speeds: measured in the store's runs of this model first (store), or the throughput table only")
    p.set_defaults(func=cmd_plan)

    p = sub.add_parser("simulate", help="replay spot preemptions against the planned run: expected wall time, dollars "
                                        "and lost work per checkpoint interval, against on-demand; with --deadline-h, "
                                        "the deadline policies over spot availability traces")
    add_config_args(p)
    _simulate_options(p)
    p.set_defaults(func=cmd_simulate)

    p = sub.add_parser("prices", help="print $/hour by instance (spot and on-demand), or storage tiers in $/GB-month")
    p.add_argument("--accelerator", "-a", help="only this accelerator, NAME or NAME:COUNT (e.g. A100 or A100:8)")
    p.add_argument("--cloud", action="append", choices=["aws", "gcp", "azure"], help="only this cloud (repeatable)")
    p.add_argument("--storage", action="store_true", help="storage tier prices ($/GB-month) instead of instances")
    p.add_argument("--source", choices=["auto", "offline", "skypilot"], default="auto",
                   help="the freshest (auto: the clouds' own sources, then SkyPilot's catalog, then the dated table), the shipped "
                        "table only, or SkyPilot's catalog only")
    p.set_defaults(func=cmd_prices)

    p = sub.add_parser("archive", help="move stale checkpoints and cache to cold storage (dry run unless --apply); "
                                       "restore, gold, pin, unmark, lifecycle")
    _archive_options(p, top=True)
    mode = p.add_mutually_exclusive_group()
    mode.add_argument("--dry-run", dest="apply", action="store_false",
                      help="only print what would move, the bytes and the monthly saving (the default)")
    mode.add_argument("--apply", action="store_true", help="move the objects (runs the thrifty-archive flow)")
    asub = p.add_subparsers(dest="archive_command", metavar="ACTION")
    q = asub.add_parser("restore", help="start (or finish) restoring a run's archived checkpoints; says how long")
    q.add_argument("run_id", metavar="RUN_ID")
    q.add_argument("--priority", choices=RESTORE_PRIORITIES, default="standard",
                   help="retrieval speed (S3 Bulk/Standard/Expedited, Azure Standard/High); faster costs more")
    q.add_argument("--days", type=int, default=7, help="S3: days a restored copy stays readable until copied back")
    _archive_options(q)
    for name, what in (("gold", "keep TARGET hot forever (gold weights)"), ("pin", "keep TARGET hot (pinned)"),
                       ("unmark", "remove a gold or pin mark")):
        q = asub.add_parser(name, help=f"{what}; TARGET is a RUN_ID or a key prefix like runs/RUN/ckpt/step-000000120")
        q.add_argument("target", metavar="TARGET")
        _archive_options(q)
        if name == "gold":
            q.add_argument("--export", choices=["fp16", "bf16"], help="also write the gold weights as safetensors in "
                           "this half precision beside their checkpoint, checked against the full ones (needs torch)")
            q.add_argument("--tolerance", type=float, default=0.01, help="with --export: how far the exported weights "
                           "may move the run's early-stopping metric, relative (default 0.01 = 1 %%)")
    q = asub.add_parser("lifecycle", help="print (or --apply) equivalent S3 / GCS bucket lifecycle rules")
    q.add_argument("--apply", action="store_true", default=argparse.SUPPRESS, help="install the rules on the bucket")
    _archive_options(q)
    p.set_defaults(func=cmd_archive, archive_command=None, apply=False)  # a dry run unless --apply

    p = sub.add_parser("new", help="write a template to start from: `thrifty new recipe NAME` (a recipe package) "
                                   "or `thrifty new script NAME` (your own loop on thrifty.session), each with its "
                                   "run config and a smoke test")
    p.add_argument("kind", choices=["recipe", "script"], help="what to write")
    p.add_argument("name", metavar="NAME", help="the Python package name, e.g. my_model")
    p.add_argument("--dir", default=".", help="where to write it (default: the current directory)")
    p.set_defaults(func=cmd_new)

    p = sub.add_parser("deploy", help="create the work pool and deploy prefect.yaml to the server at PREFECT_API_URL")
    p.add_argument("--project-dir", default=".", help="the directory holding prefect.yaml (default: the current one)")
    p.add_argument("--pool-type", default="process", choices=["process", "docker", "kubernetes"],
                   help="the work pool: process (prefect.yaml), or docker / kubernetes (deployments/prefect.TYPE.yaml, "
                        "the image the Dockerfile builds)")
    p.add_argument("--alerts-block", default=None, metavar="TYPE/NAME",
                   help="notification block for failure alerts (default: custom-webhook/thrifty-alerts, if it exists)")
    p.add_argument("--alerts-webhook", default=None, metavar="URL",
                   help="create (or update) the custom-webhook block failure alerts post to, with this URL")
    p.add_argument("--pool-concurrency", type=int, default=None, metavar="N",
                   help="run at most N flow runs at once across all the pool's workers (0 removes the limit; "
                        "default: leave the pool's limit as it is)")
    p.set_defaults(func="deploy")
    return parser


def _archive_options(p: argparse.ArgumentParser, top: bool = False) -> None:
    """The archival settings, accepted before or after the action (the action's copy keeps an earlier value)."""
    from thrifty.archive import ArchiveSettings

    fields = ArchiveSettings.model_fields
    default = (lambda name: fields[name].default) if top else (lambda name: argparse.SUPPRESS)
    p.add_argument("--store", default=default("store"), help=f"the store (default {fields['store'].default})")
    p.add_argument("--older-than-days", type=float, default=default("older_than_days"),
                   help=f"{fields['older_than_days'].description} (default {fields['older_than_days'].default:g})")
    p.add_argument("--active-window-days", type=float, default=default("active_window_days"),
                   help=f"{fields['active_window_days'].description} (default {fields['active_window_days'].default:g})")
    p.add_argument("--tier", choices=["archive", "cold"], default=default("tier"), help=fields["tier"].description)
    p.add_argument("--as-of", default=default("as_of"), metavar="DATE",
                   help="plan as of this date or time (ISO 8601, e.g. 2027-03-01), to preview a future pass")


def _simulate_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--step-s", type=float, help="seconds per optimizer step on the instance (default: measured by an "
                   "earlier run of the config's run_name in its store)")
    p.add_argument("--save-s", type=float, help="seconds per checkpoint on the step path (default: measured likewise)")
    p.add_argument("--steps", type=int, help="the run's optimizer steps (default: the earlier run's total)")
    p.add_argument("--instance", metavar="CLOUD:INSTANCE", help="priced from the price table (default: compute.emulate)")
    p.add_argument("--preemptions", choices=["auto", "ledger", "shipped", "config"], default="auto",
                   help="where the mean time between preemptions comes from: auto = the store's ledgers when they hold "
                        "enough preemptions of the instance, else the shipped spot-trace statistics, else "
                        "train.mean_time_between_preemptions_s (what checkpoint_every: auto uses)")
    p.add_argument("--mtbp-s", type=float, help="mean seconds between preemptions, overriding every source")
    p.add_argument("--distribution", choices=["exponential", "quantiles"], default="exponential",
                   help="lifetimes exponential with that mean (Young/Daly's model), or resampled from the shipped "
                        "traces' run-length quantiles (many short lives, a long tail)")
    p.add_argument("--zone", help="only the shipped statistics of this zone, e.g. us-west-2b")
    p.add_argument("--restart-s", type=float, help="seconds from a preemption to training again (default 300)")
    p.add_argument("--every", type=int, action="append", metavar="STEPS", help="also simulate this interval (repeatable)")
    p.add_argument("--trials", type=int, default=2000, help="Monte Carlo runs per interval (default 2000)")
    p.add_argument("--seed", type=int, default=0, help="random seed (default 0)")
    p.add_argument("--chart", metavar="PATH", help="also draw the expected cost per interval (with --deadline-h: per "
                   "policy) as an SVG file")
    from thrifty.spot.deadline_options import add_options

    add_options(p)


def main(argv: list[str] | None = None) -> int:
    # the temporary Prefect server `run` and `archive --apply` start should not phone home (and log an ERROR
    # offline); set PREFECT_SERVER_ANALYTICS_ENABLED=true to allow it
    os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
    args = build_parser().parse_args(argv)
    func = args.func
    return guarded(elsewhere(func) if isinstance(func, str) else func, args)


if __name__ == "__main__":
    sys.exit(main())
