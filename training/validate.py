"""Everything the training program would reject, checked before anything is rented: the same code runs on the node.

``check_config`` needs no data (the recipe resolves, its options are valid, the early-stopping
metric is one it reports); ``check_data`` needs the cached shards' sizes (one optimizer step
fits in the training split, there is something to validate on). ``thrifty run`` calls the first
before its flow starts, the smoke test calls both, and the training loop calls both again.
"""

from __future__ import annotations

from thrifty.config import ConfigError, RunConfig
from thrifty.script import ScriptParams, check_script, is_script
from training.recipes.base import Recipe, RecipeParams, resolve_recipe


def check_config(cfg: RunConfig) -> tuple[Recipe | None, RecipeParams | ScriptParams]:
    """The recipe and its parsed options, or a ConfigError naming the setting to change. Script mode
    (``recipe: script``) has no Recipe: its command is checked instead (``thrifty.script.check_script``)."""
    if is_script(cfg):
        return None, check_script(cfg)
    recipe = resolve_recipe(cfg.recipe)
    params = recipe.parse_params(cfg.recipe_params)
    valid_metrics = ["val_loss", *recipe.metrics]
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
        raise ConfigError(
            f"'train.micro_batch': one optimizer step needs {tc.examples_per_step(world)} examples (micro_batch "
            f"{tc.micro_batch} x grad_accum_steps {tc.grad_accum_steps} x {world} process(es)) but the training "
            f"split has {n_train}. Lower train.micro_batch or train.grad_accum_steps, or use more data."
        )
    if not sizes.get("val"):
        raise ConfigError("the validation split is empty: the recipe's options leave nothing to evaluate on "
                          "(e.g. a validation fraction too small); early stopping and the report need it")
