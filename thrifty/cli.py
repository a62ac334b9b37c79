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
        console.print(f"[red]error:[/] {exc}", highlight=False, soft_wrap=True)
        return EXIT_BAD_INPUT
    console.print(f"[bold]thrifty run[/] {cfg.run_name}: recipe {cfg.recipe}, store {cfg.store}, "
                  f"{cfg.compute.launcher} launcher ({cfg.compute.emulate} {'spot' if cfg.compute.use_spot else 'on-demand'})")
    from flows.train_pipeline import train_pipeline

    state = train_pipeline(config=cfg, return_state=True)
    if not state.is_completed():
        console.print(f"[red]run {cfg.run_name} {state.name.lower()}:[/] {state.message}", highlight=False, soft_wrap=True)
        return 1
    out = state.result()
    summary = out["summary"] or {}
    table = Table(title=f"run {cfg.run_name}", show_header=False)
    table.add_row("preprocessing cache", "hit" if out["cache_hit"] else "miss")
    if out.get("already_finished"):
        table.add_row("launch", "skipped: this run already finished with this config (change a train setting to "
                                "continue it, or use a new run_name to train again)")
    else:
        table.add_row("smoke test", f"passed ({out['smoke']['steps']} steps, {out['smoke']['precision_checked']} "
                                    "autocast)")
        attempts = out["job"]["attempts"]
        table.add_row("attempts", f"{len(attempts)} ({out['job']['preemptions']} preemption(s) survived, "
                                  f"resumed {summary.get('resumes', 0)} time(s))")
    table.add_row("steps", f"{summary.get('steps')} / {summary.get('total_steps')}"
                           + (" (stopped early)" if summary.get("stopped_early") else ""))
    for name, value in (summary.get("final_metrics") or {}).items():
        table.add_row(name, f"{value:.4f}")
    table.add_row("cost (emulated)", f"${out['cost_usd']:.5f} spent by earlier jobs of this run"
                  if out.get("already_finished") else f"${out['cost_usd']:.5f} vs ${out['on_demand_usd']:.5f} on-demand")
    Console().print(table)
    return 0


def cmd_smoke(args: argparse.Namespace) -> int:
    """The smoke test alone (no Prefect): preprocess if needed, a few CPU steps, a checkpoint round trip."""
    import json

    from training.cli import resolve_config, setup_logging
    from training.recipes.base import EmptyDataError
    from training.smoke import SmokeTestFailed, smoke_test

    setup_logging()
    try:
        result = smoke_test(resolve_config(args))
    except (ConfigError, EmptyDataError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except SmokeTestFailed as exc:
        print(f"smoke test failed: {exc}", file=sys.stderr)
        return 1
    print(json.dumps(result, indent=2))
    return 0


def cmd_report(args: argparse.Namespace) -> int:
    """The cross-run savings table of a store, as the `thrifty-savings` Prefect artifact shows it."""
    from rich.console import Console
    from rich.table import Table

    from thrifty import savings
    from thrifty.storage import open_store
    from training.cli import resolve_config

    try:
        cfg = resolve_config(args)
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    rows = savings.table(savings.read_all(open_store(cfg.store)))
    if not rows:
        print(f"no finished runs with a savings report in {cfg.store}", file=sys.stderr)
        return 0
    table = Table(title=f"Savings in {cfg.store}")
    for col in rows[0]:
        table.add_column(col, justify="left" if col in ("run", "saved") else "right", no_wrap=col == "run")
    for row in rows:
        table.add_row(*[f"{v:.5f}" if isinstance(v, float) else str(v) for v in row.values()])
    total_actual = sum(r["actual_usd"] for r in rows)
    total_naive = sum(r["naive_usd"] for r in rows)
    Console().print(table)
    print(f"{len(rows)} run(s): spent ${total_actual:.4f}, the naive way ${total_naive:.4f}, "
          f"saved ${total_naive - total_actual:.4f}")
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


def cmd_plan(args: argparse.Namespace) -> int:
    """Print the SkyPilot task YAML and the estimated cost of its cheapest candidates (offline)."""
    from thrifty.launchers.skypilot import plan_text
    from training.cli import resolve_config

    try:
        print(plan_text(resolve_config(args), source=args.source), end="")
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    return 0


def cmd_prices(args: argparse.Namespace) -> int:
    """Print the price table (instances, or storage tiers), filtered by accelerator and cloud."""
    from thrifty.pricing import PricingError, prices_text

    try:
        print(prices_text(args.accelerator, args.cloud, args.storage, args.source), end="")
    except PricingError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    return 0


def cmd_deploy(args: argparse.Namespace) -> int:
    """Create the work pool and deploy prefect.yaml's deployments to the server at PREFECT_API_URL."""
    from deployments.deploy import deploy_all

    return deploy_all(args.project_dir, alerts_block=args.alerts_block)


def cmd_archive(args: argparse.Namespace) -> int:
    """Plan (default) or apply an archival pass; restore a run; mark gold or pinned; bucket lifecycle rules."""
    from rich.console import Console

    from thrifty import archive
    from thrifty.storage import StoreError

    console = Console(stderr=True)
    try:
        settings = archive.build_settings(
            {"store": args.store, "older_than_days": args.older_than_days,
             "active_window_days": args.active_window_days, "tier": args.tier, "as_of": args.as_of},
            "the command line")
        action = args.archive_command
        if action in ("gold", "pin", "unmark"):
            return _archive_mark(settings, action, args.target)
        if action == "restore":
            return _archive_restore(settings, args)
        if action == "lifecycle":
            return _archive_lifecycle(settings, args.apply)
        if args.apply:
            from flows.archive_stale import archive_stale

            state = archive_stale(store=settings.store, older_than_days=settings.older_than_days,
                                  active_window_days=settings.active_window_days, tier=settings.tier,
                                  as_of=settings.as_of, dry_run=False, return_state=True)
            if not state.is_completed():
                console.print(f"[red]archive {state.name.lower()}:[/] {state.message}", highlight=False, soft_wrap=True)
                return 1
            s = state.result()
            print(f"moved {s['moved']} objects ({archive.human_bytes(s['bytes_moved'])}) to {s['target_class']}; "
                  f"{s['left_alone']} left alone, {s['already_cold']} already cold. Report: artifact "
                  "'thrifty-archive' in Prefect.")
            return 0
        with console.status(f"scanning {settings.store}"):
            store = archive.open_checked(settings, writable=False)
            plan = archive.scan(store, settings)
        print(archive.markdown(plan), end="")
        if plan.to_archive:
            print("\nNothing was moved (dry run). Run again with --apply to move these objects.")
        return 0
    except (ConfigError, StoreError) as exc:
        console.print(f"[red]error:[/] {exc}", highlight=False, soft_wrap=True)
        return EXIT_BAD_INPUT


def _archive_mark(settings, action: str, target: str) -> int:
    from thrifty import archive

    store = archive.open_checked(settings)
    policy = archive.Policy.load(store)
    prefix = archive.mark_prefix(target)
    if action == "gold":
        policy.gold.append(prefix)
    elif action == "pin":
        policy.pinned.append(prefix)
    else:
        policy.gold = [p for p in policy.gold if p != prefix]
        policy.pinned = [p for p in policy.pinned if p != prefix]
    policy.save(store)
    policy = archive.Policy.load(store)
    print(f"{archive.POLICY_KEY} in {store.uri}: gold {policy.gold or '[]'}, pinned {policy.pinned or '[]'}")
    if action != "unmark" and not store.list(prefix):
        print(f"warning: nothing in the store starts with {prefix} yet (a typo?); the mark applies once it does",
              file=sys.stderr)
    return 0


def _archive_restore(settings, args: argparse.Namespace) -> int:
    from collections import Counter

    from thrifty import archive

    store = archive.open_checked(settings)
    statuses = archive.restore_run(store, args.run_id, priority=args.priority, days=args.days)
    if not statuses:
        print(f"run {args.run_id}: nothing is archived; it can resume as it is")
        return 0
    for st in statuses:
        print(f"{st.state:<12} {st.key}" + (f"  (the provider says {st.eta})" if st.state != "done" else ""))
    counts = Counter(st.state for st in statuses)
    pending = counts["requested"] + counts["in progress"]
    etas = sorted({st.eta for st in statuses if st.state != "done"})
    print(f"\nrun {args.run_id}: {counts['done']} object(s) back in the hot tier, {pending} restoring"
          + (f"; the provider says: {', '.join(etas)}. Run this command again after that to finish." if pending
             else "; the run can resume."))
    return 0


def _archive_lifecycle(settings, apply: bool) -> int:
    import json

    from thrifty import archive

    store = archive.open_checked(settings, writable=apply)
    rules = archive.lifecycle_rules(store, settings)
    print(json.dumps(rules, indent=2))
    print(archive.LIFECYCLE_CAVEAT)
    if apply:
        archive.install_lifecycle(store, rules)
        print(f"installed on {store.uri} (other rules of the bucket kept)")
    else:
        print("Not installed: run again with --apply to install these rules.")
    return 0


def build_parser() -> argparse.ArgumentParser:
    from thrifty.storage import RESTORE_PRIORITIES
    from training.cli import add_config_args

    parser = argparse.ArgumentParser(prog="thrifty", description="Cheap, safe model training on spot GPUs.")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    with_config = (
        ("train", "run the training program here (what a cloud node runs); resumes automatically", cmd_train),
        ("run", "run the main job: preprocess, smoke test, launch and watch, report (Prefect flow)", cmd_run),
        ("smoke", "run the CPU smoke test alone (no Prefect, nothing launched)", cmd_smoke),
        ("report", "print the cross-run savings table of the config's store", cmd_report),
        ("config", "print the resolved RunConfig", cmd_config),
    )
    for name, what, func in with_config:
        p = sub.add_parser(name, help=what)
        add_config_args(p)
        p.set_defaults(func=func)
        if name == "config":
            p.add_argument("--schema", action="store_true", help="print the JSON schema instead")

    p = sub.add_parser("plan", help="print the SkyPilot task YAML and the estimated cost of its cheapest candidates (offline)")
    add_config_args(p)
    p.add_argument("--source", choices=["auto", "offline", "skypilot"], default="auto",
                   help="prices: SkyPilot's catalog when on this machine (auto), the shipped table, or the catalog only")
    p.set_defaults(func=cmd_plan)

    p = sub.add_parser("prices", help="print $/hour by instance (spot and on-demand), or storage tiers in $/GB-month")
    p.add_argument("--accelerator", "-a", help="only this accelerator, NAME or NAME:COUNT (e.g. A100 or A100:8)")
    p.add_argument("--cloud", action="append", choices=["aws", "gcp", "azure"], help="only this cloud (repeatable)")
    p.add_argument("--storage", action="store_true", help="storage tier prices ($/GB-month) instead of instances")
    p.add_argument("--source", choices=["auto", "offline", "skypilot"], default="auto",
                   help="SkyPilot's catalog when on this machine (auto), the shipped table, or the catalog only")
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
    q = asub.add_parser("lifecycle", help="print (or --apply) equivalent S3 / GCS bucket lifecycle rules")
    q.add_argument("--apply", action="store_true", default=argparse.SUPPRESS, help="install the rules on the bucket")
    _archive_options(q)
    p.set_defaults(func=cmd_archive, archive_command=None, apply=False)  # a dry run unless --apply

    p = sub.add_parser("deploy", help="create the work pool and deploy prefect.yaml to the server at PREFECT_API_URL")
    p.add_argument("--project-dir", default=".", help="the directory holding prefect.yaml (default: the current one)")
    p.add_argument("--alerts-block", default=None, metavar="TYPE/NAME",
                   help="notification block for failure alerts (default: custom-webhook/thrifty-alerts, if it exists)")
    p.set_defaults(func=cmd_deploy)
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


def main(argv: list[str] | None = None) -> int:
    import os

    # the temporary Prefect server `run` and `archive --apply` start should not phone home (and log an ERROR
    # offline); set PREFECT_SERVER_ANALYTICS_ENABLED=true to allow it
    os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
    args = build_parser().parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
