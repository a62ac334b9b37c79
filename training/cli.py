"""The training program's commands: ``python -m training`` (what a node runs), ``thrifty train`` and ``thrifty smoke``."""

from __future__ import annotations

import argparse
import logging
import os
import sys

from thrifty.cli import config_for_today, guarded, resolved_config
from thrifty.config import ENV_VAR, ConfigError, RunConfig, add_config_args
from thrifty.protocol import EXIT_BAD_INPUT, EXIT_BUDGET, EXIT_FAILED, EXIT_OK


def setup_logging() -> None:
    rank = os.environ.get("RANK", "0")
    logging.basicConfig(level=logging.INFO, stream=sys.stderr,
                        format=f"%(asctime)s [rank {rank}] %(levelname)s %(message)s", datefmt="%H:%M:%S")


def config_to_train(args: argparse.Namespace) -> RunConfig:
    """The config: a node trains under the name its launcher resolved; a person running this resolves
    '{date}' to today (UTC)."""
    if not args.config and os.environ.get(ENV_VAR):
        return resolved_config(args).require_resolved()
    return config_for_today(args)


def cmd_train(args: argparse.Namespace) -> int:
    from thrifty.usercode.script import is_script

    setup_logging()
    cfg = config_to_train(args)
    if is_script(cfg):  # the user's own command under the node's signals and exit codes (this wrapper needs no torch)
        from training.script import run_script

        return run_script(cfg)
    from thrifty.storage import StoreError
    from training.attempt_end import record_exit

    try:
        code = _train(cfg)
    except (ConfigError, StoreError) as exc:  # how it ended, for the launcher: exit 2 or a failure it may see again
        record_exit(cfg, EXIT_BAD_INPUT, exc)
        raise
    except Exception as exc:
        record_exit(cfg, EXIT_FAILED, exc)
        raise
    record_exit(cfg, code)
    return code


def _train(cfg: RunConfig) -> int:
    from training.loop import train

    result = train(cfg)
    if result.summary is not None:
        print(result.summary.model_dump_json(indent=2))
    elif result.status == "interrupted":
        print(f"interrupted at step {result.step}; checkpoint saved, rerun the same command to resume", file=sys.stderr)
    elif result.status == "rung":
        print(f"stopped at epoch {cfg.train.stop_at_epoch} (step {result.step}) as train.stop_at_epoch says; "
              "checkpoint saved, raise it (or unset it) to continue", file=sys.stderr)
    elif result.status == "budget":
        print(f"stopped at the budget cap (step {result.step}, checkpoint saved); run it again with a larger "
              "budget.max_usd to continue", file=sys.stderr)
        return EXIT_BUDGET
    return EXIT_OK


def cmd_smoke(args: argparse.Namespace) -> int:
    """The smoke test alone (no Prefect): preprocess if needed, a few CPU steps, a checkpoint round trip."""
    from training.smoke import smoke_test
    from training.validate import SmokeTestFailed

    setup_logging()
    try:
        result = smoke_test(config_to_train(args))
    except SmokeTestFailed as exc:
        print(f"smoke test failed: {exc}", file=sys.stderr)
        return EXIT_FAILED
    print(result.model_dump_json(indent=2))
    return EXIT_OK


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m training", description="Train (or resume) one Thrifty run.")
    add_config_args(parser)
    return guarded(cmd_train, parser.parse_args(argv))
