"""The search space: dotted RunConfig paths and how to draw each (choice, uniform, log-uniform, int), seeded.

A trial's values are a pure function of (seed, trial index, space): trial 7 is the same point whether the search
samples 8 trials or 80, and a search started again draws exactly the trials it drew before.
"""

from __future__ import annotations

import builtins
import difflib
import math
import random
from typing import Any, Union

from pydantic import BaseModel, Field

from thrifty.config.base import _Frozen
from thrifty.config.sections import EarlyStoppingConfig, TrainConfig

# The search decides these itself: the rung (stop_at_epoch), the full budget (max_epochs, max_steps would shorten
# the LR schedule's horizon) and where the trial lives (run_name, store); the money is the search's caps.
SWEEP_OWNED = {"train.max_epochs", "train.max_steps", "train.stop_at_epoch"}

# Train settings that do not change the model's shape or the smoke test's step time: a trial differing from
# another only in these reuses its smoke test. Everything else (recipe_params, micro_batch, precision, ...) shapes it.
SHAPE_FREE = {"train.lr", "train.weight_decay", "train.adam_betas", "train.adam_eps", "train.warmup_steps",
              "train.lr_schedule", "train.min_lr_ratio", "train.grad_clip", "train.seed", "train.ema_decay",
              "train.log_every", "train.keep_last", "train.checkpoint_every", "train.eval_every"} | \
    {f"train.early_stopping.{k}" for k in EarlyStoppingConfig.model_fields}


class Choice(_Frozen):
    choice: list[Any] = Field(min_length=1, description="Draw one of these values, each equally likely.")


class Uniform(_Frozen):
    uniform: tuple[float, float] = Field(description="Draw a float uniformly in [lo, hi].")


class LogUniform(_Frozen):
    log_uniform: tuple[float, float] = Field(
        description="Draw a float whose log is uniform in [log lo, log hi] (learning rates); lo > 0.")


class IntRange(_Frozen):
    int: tuple[builtins.int, builtins.int] = Field(description="Draw an integer uniformly in [lo, hi], both included.")


ParamSpec = Union[Choice, Uniform, LogUniform, IntRange]


def valid_paths() -> list[str]:
    """Every RunConfig path a space may name (recipe_params.* besides: the recipe checks its own options)."""
    train = [f"train.{k}" for k in TrainConfig.model_fields if k != "early_stopping"]
    stopping = [f"train.early_stopping.{k}" for k in EarlyStoppingConfig.model_fields]
    return sorted(p for p in train + stopping if p not in SWEEP_OWNED)


def check_path(path: str) -> None:
    """ValueError naming the nearest valid path for anything a trial cannot set."""
    if path.startswith("recipe_params.") and len(path.split(".")) == 2 and path.split(".")[1]:
        return  # the recipe's own option: the recipe checks its name when the trials are validated
    if path in valid_paths():
        return
    if path in SWEEP_OWNED:
        raise ValueError(f"space field {path!r} is the search's own (rungs set stop_at_epoch, max_epochs is the full "
                         "budget); set max_epochs / min_epochs of the sweep instead")
    near = difflib.get_close_matches(path, valid_paths() + ["recipe_params.NAME"], n=1, cutoff=0.5)
    hint = f"; did you mean {near[0]!r}?" if near else ""
    raise ValueError(f"space field {path!r} is not a setting a trial can vary (use train.* or recipe_params.*, "
                     f"e.g. train.lr){hint}")


def check_spec(path: str, spec: BaseModel) -> None:
    """ValueError for a range that cannot be drawn from."""
    if isinstance(spec, (Uniform, LogUniform, IntRange)):
        kind = {Uniform: "uniform", LogUniform: "log_uniform", IntRange: "int"}[type(spec)]
        lo, hi = getattr(spec, kind)
        if lo > hi:
            raise ValueError(f"space field {path!r}: {kind} [{lo}, {hi}] has lo > hi; write it as [{hi}, {lo}]")
        if isinstance(spec, LogUniform) and lo <= 0:
            raise ValueError(f"space field {path!r}: log_uniform needs lo > 0 (got {lo}); use uniform for a range "
                             "that includes 0, or a small positive lo such as 1e-6")


def _tidy(v: float) -> float:
    return float(f"{v:.6g}")  # 0.00312345 not 0.0031234499999: readable in run names' tables and the UI


def draw(spec: BaseModel, rng: random.Random) -> Any:
    if isinstance(spec, Choice):
        return spec.choice[rng.randrange(len(spec.choice))]
    if isinstance(spec, Uniform):
        return _tidy(rng.uniform(*spec.uniform))
    if isinstance(spec, LogUniform):
        lo, hi = spec.log_uniform
        return _tidy(math.exp(rng.uniform(math.log(lo), math.log(hi))))
    lo, hi = spec.int
    return rng.randint(lo, hi)


def sample(space: dict[str, BaseModel], seed: int, index: int) -> dict[str, Any]:
    """Trial ``index``'s values: one RNG per (seed, trial), fields drawn in sorted order."""
    rng = random.Random(f"thrifty-sweep:{seed}:{index}")  # str seeds hash with sha512: stable across processes
    return {path: draw(space[path], rng) for path in sorted(space)}


def apply(config: dict[str, Any], values: dict[str, Any]) -> dict[str, Any]:
    """``config`` (a RunConfig as JSON) with each dotted path set to its value."""
    out = {**config}
    for path, value in values.items():
        *parents, leaf = path.split(".")
        node = out
        for part in parents:
            node[part] = dict(node.get(part) or {})
            node = node[part]
        node[leaf] = value
    return out


def shapes_model(path: str) -> bool:
    """Whether varying ``path`` changes the model's shape or step time (a smoke test per distinct value)."""
    return path not in SHAPE_FREE
