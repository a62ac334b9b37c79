"""The recipe interface: raw data -> arrays, arrays -> model, batch -> loss and metrics.

A recipe is a plain object. Users plug in their own as ``package.module:function`` where the
function returns a :class:`Recipe`. Everything a recipe produces in ``preprocess`` is cached
in the store, keyed by ``fingerprint_raw()`` + the preprocessing source + the params.

``preprocess`` returns one :class:`Dataset`, or, for data larger than memory, an iterable (a
generator) of :class:`Dataset` chunks. Each chunk holds rows of one or more splits (any split
names); a split's arrays keep the same names, dtypes and trailing shapes in every chunk (a
mismatch is a ConfigError naming the split, the array and the chunk); rows are appended in
chunk order, and ``meta`` of the chunks is merged (later keys win). Shards are written as the
chunks come, so memory holds about one chunk plus one shard per array, never the data set.
"""

from __future__ import annotations

import importlib
import inspect
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Union

import numpy as np
import torch
from pydantic import BaseModel, ConfigDict, ValidationError

from thrifty.config import ConfigError


class RecipeParams(BaseModel):
    """Base for a recipe's own options (``recipe_params`` in the RunConfig)."""

    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)


class EmptyDataError(ConfigError):
    """Preprocessing produced no examples for a split (the recipe's options or its raw data need a change)."""


@dataclass
class Dataset:
    """Preprocessed data: per split, named arrays indexed along axis 0; plus small JSON metadata."""

    splits: dict[str, dict[str, np.ndarray]]
    meta: dict[str, Any] = field(default_factory=dict)

    def num_examples(self, split: str) -> int:
        arrays = self.splits.get(split) or {}
        return int(next(iter(arrays.values())).shape[0]) if arrays else 0


Chunks = Iterable[Dataset]  # what a larger-than-memory preprocess yields: Datasets whose rows are appended in order
Preprocessed = Union[Dataset, Chunks]


@dataclass
class StepOutput:
    loss: torch.Tensor  # mean loss over the batch (scalar), the thing backpropagated
    count: int  # examples (or tokens) the mean was taken over
    sums: dict[str, float] = field(default_factory=dict)  # metric numerators, e.g. {"correct": 57}


@dataclass
class Recipe:
    name: str
    params_model: type[RecipeParams]
    fingerprint_raw: Callable[[RecipeParams], str]  # content hash of the raw data
    preprocess: Callable[[RecipeParams], Preprocessed]  # a Dataset, or Dataset chunks (a generator)
    build_model: Callable[[RecipeParams, dict[str, Any]], torch.nn.Module]
    step: Callable[[torch.nn.Module, dict[str, torch.Tensor]], StepOutput]
    # e.g. {"val_accuracy": ("correct", "count")}: metric = sum of numerator / sum of count
    metrics: dict[str, str] = field(default_factory=dict)
    summary_fields: Callable[[dict[str, Any]], dict[str, Any]] = lambda meta: {}
    code_sources: list[Any] = field(default_factory=list)  # extra objects whose source is part of the cache key

    def parse_params(self, raw: dict[str, Any]) -> RecipeParams:
        try:
            return self.params_model.model_validate(raw)
        except ValidationError as err:
            parts = []
            for e in err.errors():
                loc = "recipe_params." + ".".join(str(p) for p in e["loc"])
                msg = "is not an option of this recipe (remove it)" if e["type"] == "extra_forbidden" else e["msg"]
                parts.append(f"'{loc}': {msg}")
            known = ", ".join(self.params_model.model_fields)
            raise ConfigError(
                f"Invalid recipe_params for recipe {self.name!r}: " + "; ".join(parts) + f". Known options: {known}."
            ) from None

    def preprocessing_source(self) -> str:
        """Source code that shapes the cached shards: the preprocess function's module and extras."""
        chunks = []
        for obj in [self.preprocess, self.params_model, *self.code_sources]:
            mod = inspect.getmodule(obj)
            try:
                chunks.append(inspect.getsource(mod if mod is not None else obj))
            except (OSError, TypeError):
                chunks.append(getattr(obj, "__qualname__", repr(obj)))
        return "\n".join(chunks)


BUILTIN = {"digits": "training.recipes.digits:recipe", "codelm": "training.recipes.codelm:recipe"}


def resolve_recipe(spec: str) -> Recipe:
    """A built-in name or 'package.module:function' -> Recipe, with a clear error otherwise."""
    target = BUILTIN.get(spec, spec)
    if ":" not in target:
        raise ConfigError(
            f"'recipe': unknown recipe {spec!r}. Use one of {', '.join(sorted(BUILTIN))} "
            "or 'package.module:function' for your own."
        )
    module_name, func_name = target.split(":", 1)
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ConfigError(
            f"'recipe': cannot import module {module_name!r} for recipe {spec!r} ({exc}). "
            "Check the module path and that its package is installed."
        ) from None
    except Exception as exc:  # the module itself is broken: say where, not a traceback
        raise ConfigError(f"'recipe': importing module {module_name!r} for recipe {spec!r} failed: "
                          f"{type(exc).__name__}: {exc}") from None
    factory = getattr(module, func_name, None)
    if factory is None:
        raise ConfigError(f"'recipe': module {module_name!r} has no function {func_name!r}.")
    if callable(factory) and not isinstance(factory, Recipe):
        try:
            recipe = factory()
        except Exception as exc:
            raise ConfigError(
                f"'recipe': calling {spec!r} failed ({type(exc).__name__}: {exc}); a recipe is a function that "
                "takes no arguments and returns a training.recipes.Recipe") from None
    else:
        recipe = factory
    if not isinstance(recipe, Recipe):
        raise ConfigError(f"'recipe': {spec!r} returned {type(recipe).__name__}, not a training.recipes.Recipe.")
    return recipe
