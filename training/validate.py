"""Everything the training program would reject, checked before anything is rented: the same code runs on the node.

``check_config`` needs no data (the recipe resolves, its options are valid, the early-stopping
metric is one it reports); ``check_data`` needs the cached shards' sizes (one optimizer step
fits in the training split, there is something to validate on). ``thrifty run`` calls the first
before its flow starts, the smoke test calls both, and the training loop calls both again.
"""

from __future__ import annotations

from typing import Any

from thrifty.config import ConfigError, RunConfig
from thrifty.usercode.script import ScriptParams, check_script, is_script
from training.data import manifest_sizes
from training.recipes.base import Recipe, RecipeError, RecipeParams, resolve_recipe


class SmokeTestFailed(RuntimeError):
    """The recipe (or script) cannot train as configured; nothing should be launched."""


def check_config(cfg: RunConfig) -> tuple[Recipe | None, RecipeParams | ScriptParams]:
    """The recipe and its parsed options, or a ConfigError naming the setting to change. Script mode
    (``recipe: script``) has no Recipe: its command is checked instead (``thrifty.usercode.script.check_script``)."""
    if is_script(cfg):
        if cfg.train.stop_at_epoch is not None:  # the script's own loop decides its epochs
            raise ConfigError("'train.stop_at_epoch': script mode cannot pause at an epoch (the command runs its own "
                              "loop); unset it, or use a recipe")
        if cfg.train.init_from or cfg.train.export_half or cfg.data.dedup != "off":  # the command owns its weights
            raise ConfigError("'train.init_from', 'train.export_half' and 'data.dedup' act on a recipe's model and "
                              "cache; script mode's command loads, saves and reads its own: unset them, or use a recipe")
        if cfg.train.profile_steps:  # the profiler wraps the built-in loop's steps; a command's are its own
            raise ConfigError("'train.profile_steps': script mode's command runs its own steps, which the cost map "
                              "cannot see; set it to 0, or use a recipe")
        return None, check_script(cfg)
    recipe = resolve_recipe(cfg.recipe)
    params = recipe.parse_params(cfg.recipe_params)
    valid_metrics = recipe.metric_names()
    metric = cfg.train.early_stopping.metric
    if metric not in valid_metrics:
        raise ConfigError(
            f"'train.early_stopping.metric': recipe {recipe.name!r} reports {', '.join(valid_metrics)}, "
            f"not {metric!r}. Pick one of those."
        )
    return recipe, params


def check_data(cfg: RunConfig, sizes: dict[str, int], world: int) -> None:
    """Raise ConfigError when the data cannot train as configured on ``world`` processes."""
    tc = cfg.train
    n_train = sizes.get("train", 0)
    if tc.steps_per_epoch(n_train, world) == 0:
        auto = tc.micro_batch == "auto"
        made_of = (f"batch_size {tc.batch_size}" if auto else
                   f"micro_batch {tc.micro_batch} x grad_accum_steps {tc.grad_accum_steps}")
        lower = "train.batch_size" if auto else "train.micro_batch or train.grad_accum_steps"
        raise ConfigError(
            f"'train.micro_batch': one optimizer step needs {tc.examples_per_step(world)} examples ({made_of} x "
            f"{world} process(es)) but the training split has {n_train}. Lower {lower}, use more data, or set "
            "train.drop_last=false to train on a padded partial step."
        )


def check_arrays(recipe: Recipe, manifest: dict[str, Any]) -> None:
    """The cached arrays can feed one model: every eval split has the train split's arrays with the same dtype and
    per-example shape. A mismatch (float64 validation features beside float32 training ones, a label array only in
    train) would fail at the first evaluation, after the machine is rented."""
    splits = manifest["splits"]
    recipe.require_splits(manifest_sizes(manifest))
    train = splits["train"]
    for name in recipe.eval_splits:
        for array, spec in train.items():
            other = splits[name].get(array)
            if other is None:
                raise RecipeError(f"recipe {recipe.name!r}: split {name!r} has no array {array!r} (train has "
                                  f"{', '.join(sorted(train))}); preprocess must give every split the same arrays")
            if other["dtype"] != spec["dtype"] or other["shape"][1:] != spec["shape"][1:]:
                raise RecipeError(
                    f"recipe {recipe.name!r}: array '{name}.{array}' is {other['dtype']} of per-example shape "
                    f"{tuple(other['shape'][1:])} but 'train.{array}' is {spec['dtype']} of {tuple(spec['shape'][1:])}; "
                    "preprocess must give every split the same dtype and shape (cast with .astype(...)).")


def dtype_hints(batch: dict[str, Any], split: str = "train") -> list[str]:
    """What usually breaks a model about a batch's dtypes, as fixes naming each array (for a smoke test failure)."""
    hints = []
    for name, t in batch.items():
        dtype = str(t.dtype).removeprefix("torch.")
        if dtype == "float64":
            hints.append(f"array '{split}.{name}' is float64 while models compute in float32: cast it in preprocess "
                         f"with .astype(np.float32)")
        elif dtype in ("int32", "int16", "int8", "uint8") and t.ndim == 1:
            hints.append(f"array '{split}.{name}' is {dtype}: class labels for cross_entropy must be int64, cast "
                         f"them in preprocess with .astype(np.int64)")
        elif dtype in ("int32", "int16", "uint8") and t.ndim > 1:
            hints.append(f"array '{split}.{name}' is {dtype}: if it is a model input, cast it to float32 in "
                         "preprocess (or in transform), or convert it in step()")
    return hints
