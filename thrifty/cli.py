"""``thrifty``: the command line. Each command takes --config FILE and repeatable --set section.key=value."""

from __future__ import annotations

import argparse
import sys

from thrifty.config import ConfigError, RunConfig

EXIT_BAD_INPUT = 2


def cmd_train(args: argparse.Namespace) -> int:
    from training.cli import run_train

    return run_train(args)


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
