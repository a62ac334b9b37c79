"""Before a run trains: may its newest checkpoint resume under this config, what it restores, and one trainer per run.

The loop (``training.loop``) and a script's session (``training.session``) follow the same rules: a checkpoint of
another recipe, or whose model does not load, is exit 2 (``IncompatibleCheckpoint``), never a restart; a person's
``thrifty train`` takes the run's lease itself, a launched job trains under its flow's.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import socket
import time
from typing import Any, Iterator

import torch

from thrifty.config import ConfigError, RunConfig
from thrifty.config.run import comparable_train
from thrifty.money.meter import node_job_id
from thrifty.protocol import ENV_LEASE_TOKEN
from thrifty.runs import lease
from thrifty.storage import Store
from training.early_stopping import EarlyStopping
from training.runtime import Dist
from training.speedups import uncompiled_keys

log = logging.getLogger("thrifty.train")

LEASE_BEAT_S = 10.0  # a `thrifty train` renews its lease this often


class IncompatibleCheckpoint(ConfigError):
    """The run's checkpoint was written by a config whose model cannot load here."""


def check_compatible(cfg: RunConfig, saved_cfg: dict[str, Any], run_id: str) -> None:
    """A checkpoint written under ``saved_cfg`` may resume under ``cfg`` (the loop's and a script session's rule)."""
    if saved_cfg.get("recipe") != cfg.recipe:
        raise IncompatibleCheckpoint(
            f"run {run_id!r} has checkpoints from recipe {saved_cfg.get('recipe')!r}, but this config uses "
            f"recipe {cfg.recipe!r}. Use a new run_name for a new experiment, or set recipe back."
        )
    saved_train = comparable_train(saved_cfg.get("train") or {})
    changed = sorted(k for k, now, then in (("recipe_params", cfg.recipe_params, saved_cfg.get("recipe_params")),
                                            ("train", cfg.train_settings(), saved_train)) if now != then)
    if changed:
        log.warning("resuming run %r with changed settings in %s (allowed: the model still loads)", run_id, ", ".join(changed))


def restore(cfg: RunConfig, step: int, saved: dict[str, Any], model: torch.nn.Module, optimizer: Any, scheduler: Any,
            scaler: Any, stopper: EarlyStopping, ema: Any) -> None:
    """Load checkpoint ``saved`` (of ``step``) into the loop's objects, or IncompatibleCheckpoint naming the fix."""
    check_compatible(cfg, json.loads(saved["config"]), cfg.run_name)
    try:
        model.load_state_dict(uncompiled_keys(saved["model"]))  # (older files of a compiled model: '_orig_mod.')
    except RuntimeError as exc:
        raise IncompatibleCheckpoint(
            f"run {cfg.run_name!r} has a checkpoint (step {step}) whose model does not fit this config's model: "
            f"{str(exc).splitlines()[0]} ... Its recipe_params were {json.loads(saved['config'])['recipe_params']}, "
            f"this config has {cfg.recipe_params}. Use a new run_name, or restore the old recipe_params."
        ) from None
    optimizer.load_state_dict(saved["optimizer"])
    scheduler.load_state_dict(saved["scheduler"])
    if saved["scaler"]:  # empty when saved without a GradScaler (fp32/bf16): an fp16 resume starts a fresh one
        scaler.load_state_dict(saved["scaler"])
    stopper.load_state_dict(saved["early_stopping"])
    if ema is not None:
        if saved.get("ema") is None:
            raise IncompatibleCheckpoint(f"run {cfg.run_name!r} was checkpointed without train.ema_decay; unset it to "
                                         "resume, or use a new run_name")
        ema.load_state_dict(saved["ema"])


@contextlib.contextmanager
def one_trainer(store: Store, run_id: str, dist: Dist) -> Iterator[None]:
    """One run, one trainer. A job its flow launched trains under the flow's lease (its token in the environment);
    a person's `thrifty train` takes the lease itself, so two of them never prune each other's checkpoints."""
    if not dist.is_main:
        yield
        return
    token = os.environ.get(ENV_LEASE_TOKEN)
    if token:
        current = lease.read(store, run_id)
        mine = current is None or current.token == token or current.job_id == node_job_id(os.environ)
        if not mine and current.live(time.time()):  # (a watcher that re-attached to this job holds it: fine)
            raise lease.LeaseHeld(run_id, current, time.time())  # another job holds the run: never train beside it
        yield
        return
    held = lease.acquire(store, run_id, f"thrifty train on {socket.gethostname()} pid {os.getpid()}")
    beat = lease.Heartbeat(held, LEASE_BEAT_S)
    try:
        yield
    finally:
        beat.stop()
        held.release()
