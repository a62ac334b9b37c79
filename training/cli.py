"""Command line of the training program; shared by ``python -m training`` and ``thrifty train``."""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys

from thrifty.config import ConfigError, config_from_env, load_config

EXIT_BAD_INPUT = 2


def add_config_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", "-c", help="RunConfig file (YAML or JSON); default: $THRIFTY_RUN_CONFIG or defaults")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="SECTION.KEY=VALUE",
                        help="override one setting, e.g. --set train.lr=3e-4 (repeatable)")


def resolve_config(args: argparse.Namespace):
    if args.config:
        return load_config(args.config, args.overrides)
    from_env = config_from_env(dict(os.environ))
    if from_env is not None and args.overrides:
        from thrifty.config import apply_overrides, build_config

        return build_config(apply_overrides(from_env.model_dump(mode="json"), args.overrides), "$THRIFTY_RUN_CONFIG")
    return from_env or load_config(None, args.overrides)


def setup_logging() -> None:
    rank = os.environ.get("RANK", "0")
    logging.basicConfig(level=logging.INFO, stream=sys.stderr,
                        format=f"%(asctime)s [rank {rank}] %(levelname)s %(message)s", datefmt="%H:%M:%S")


def run_train(args: argparse.Namespace) -> int:
    from training.loop import train
    from training.recipes.base import EmptyDataError

    setup_logging()
    try:
        cfg = resolve_config(args)
        result = train(cfg)
    except (ConfigError, EmptyDataError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    if result.summary is not None:
        print(json.dumps(result.summary, indent=2))
    elif result.status == "interrupted":
        print(f"interrupted at step {result.step}; checkpoint saved, rerun the same command to resume", file=sys.stderr)
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m training", description="Train (or resume) one Thrifty run.")
    add_config_args(parser)
    return run_train(parser.parse_args(argv))
