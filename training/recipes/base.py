"""The recipe interface: raw data -> arrays, arrays -> model, batch -> loss and metrics.

A recipe is a plain object. Users plug in their own as ``package.module:function`` where the
function is declared to return a :class:`Recipe` (``def recipe() -> Recipe:``): nothing else is called. Only six things are required (name, params, fingerprint,
preprocess, model, step); everything else has a default that the two built-ins use:

- ``preprocess(params)`` returns a :class:`Dataset`: per split, named numpy arrays of equal
  length (axis 0 = examples); or, for data larger than memory, a generator of :class:`Dataset`
  chunks (see below). ``"train"`` is trained on; every split in ``eval_splits``
  (default ``("val",)``) is evaluated, each reporting ``<split>_loss`` and ``<split>_<metric>``.
- ``step(model, batch)`` or ``step(model, batch, mode)`` (``mode`` is ``"train"`` or
  ``"eval"``) returns a :class:`StepOutput`: the mean loss, the count it was taken over,
  and metric numerators in ``sums``.
- ``metrics`` declares reducers over those sums: ``{"accuracy": Ratio("correct")}`` (or just
  ``"correct"``) reports ``val_accuracy`` = sum of ``correct`` / sum of ``count`` over the split.
  A numerator the step never produces stops the first evaluation (and the smoke test) with an error.
- ``optimizer(model, train_cfg)`` and ``scheduler(optimizer, train_cfg, total_steps)`` replace the
  default AdamW and warm-up + ``train.lr_schedule`` (cosine to ``train.min_lr_ratio`` by default).
- ``flops_per_example(params, meta)`` (optional): training FLOPs per example, for achieved TFLOPS and MFU.
- ``transform(batch, generator)`` changes each training micro-batch (augmentation); draw all
  randomness from ``generator``, which is seeded by (seed, epoch, step, micro-batch, rank) so a
  resumed run sees the same augmented batches.
- ``blocks(model)`` names the model's repeated blocks for ``train.activation_checkpointing``
  (default: the model's ``blocks`` or ``layers`` ModuleList).

The preprocessing cache is keyed by ``fingerprint_raw()`` + the source of ``preprocess``, the
params model and the module-level functions and classes ``preprocess`` uses (not the whole
module: editing the model does not re-preprocess, and two recipes in one module keep their own
shards) + ``code_sources`` + the params.

``preprocess`` may yield chunks: each holds rows of one or more splits (any split names); a
split's arrays keep the same names, dtypes and trailing shapes in every chunk (a mismatch is a
ConfigError naming the split, the array and the chunk); rows are appended in chunk order, and
``meta`` of the chunks is merged (later keys win). Shards are written as the chunks come, so
memory holds about one chunk plus one shard per array, never the data set.
"""

from __future__ import annotations

import dis
import importlib
import inspect
import math
import os
import sys
import textwrap
import types
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Iterable, Literal, Sequence, Union

import numpy as np
import torch
from pydantic import BaseModel, ConfigDict, ValidationError

from thrifty.config import ConfigError
from thrifty.config.echo import shown
from thrifty.usercode.allow import check_recipe_allowed
from thrifty.usercode.recipe_spec import HOW, check_recipe_spec
from training.lazy_dynamo import defer_dynamo_import
from training.speedups import fused_optimizer_ok

if TYPE_CHECKING:
    from thrifty.config.sections import TrainConfig

Mode = Literal["train", "eval"]


class RecipeParams(BaseModel):
    """Base for a recipe's own options (``recipe_params`` in the RunConfig)."""

    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)


class EmptyDataError(ConfigError):
    """Preprocessing produced no examples for a split (the recipe's options or its raw data need a change)."""


class RecipeError(ConfigError):
    """The recipe's code does not keep the recipe contract (a wrong return type, a metric never produced)."""


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


@dataclass(frozen=True)
class Ratio:
    """A metric reduced over a whole evaluation: sum of ``numerator`` / sum of ``denominator``.

    Both name keys of :attr:`StepOutput.sums`; ``"count"`` is :attr:`StepOutput.count`.
    """

    numerator: str
    denominator: str = "count"

    def keys(self) -> tuple[str, ...]:
        return tuple(k for k in (self.numerator, self.denominator) if k != "count")

    def reduce(self, sums: dict[str, float]) -> float:
        den = sums[self.denominator]
        return sums[self.numerator] / den if den else float("nan")


MetricSpec = Union[str, tuple[str, str], Ratio]


def as_reducer(spec: MetricSpec) -> Ratio:
    """``"correct"`` -> Ratio("correct"); ``("tp", "predicted")`` -> Ratio("tp", "predicted")."""
    if isinstance(spec, Ratio):
        return spec
    if isinstance(spec, str):
        return Ratio(spec)
    if isinstance(spec, tuple) and len(spec) == 2 and all(isinstance(k, str) for k in spec):
        return Ratio(*spec)
    raise RecipeError(f"a metric must be a StepOutput.sums key, a (numerator, denominator) pair or a Ratio, "
                      f"not {spec!r}")


def _metric_base(name: str) -> str:
    # metrics are named without their split ("accuracy"); the old form "val_accuracy" still works
    return name.removeprefix("val_")


@dataclass
class Recipe:
    name: str
    params_model: type[RecipeParams]
    fingerprint_raw: Callable[[RecipeParams], str]  # content hash of the raw data
    preprocess: Callable[[RecipeParams], Preprocessed]  # a Dataset, or Dataset chunks (a generator)
    build_model: Callable[[RecipeParams, dict[str, Any]], torch.nn.Module]
    # step(model, batch) or step(model, batch, mode) with mode "train" | "eval"
    step: Callable[..., StepOutput]
    # metric name -> reducer over StepOutput.sums, e.g. {"accuracy": Ratio("correct")}; reported per eval split
    metrics: dict[str, MetricSpec] = field(default_factory=dict)
    eval_splits: tuple[str, ...] = ("val",)  # evaluated in this order; early stopping reads any of them
    optimizer: Callable[[torch.nn.Module, "TrainConfig"], torch.optim.Optimizer] | None = None
    scheduler: Callable[[torch.optim.Optimizer, "TrainConfig", int], Any] | None = None
    transform: Callable[[dict[str, torch.Tensor], torch.Generator], dict[str, torch.Tensor]] | None = None
    summary_fields: Callable[[dict[str, Any]], dict[str, Any]] = lambda meta: {}
    code_sources: list[Any] = field(default_factory=list)  # extra objects whose source is part of the cache key
    # the model's blocks, for train.activation_checkpointing (e.g. lambda model: model.transformer.h); None = the
    # model's 'blocks' or 'layers' ModuleList
    blocks: Callable[[torch.nn.Module], Sequence[torch.nn.Module]] | None = None
    # training FLOPs of one example (forward + backward), for the summary's achieved TFLOPS and MFU; None = unknown
    flops_per_example: Callable[[RecipeParams, dict[str, Any]], float] | None = None

    def __post_init__(self) -> None:
        self.eval_splits = tuple(self.eval_splits)
        if not self.eval_splits or "train" in self.eval_splits:
            raise RecipeError(f"recipe {self.name!r}: eval_splits must name at least one split other than 'train' "
                              f"(got {self.eval_splits!r})")
        self.reducers = {_metric_base(k): as_reducer(v) for k, v in self.metrics.items()}
        clash = sorted(set(self.reducers) & {"loss"})
        if clash:
            raise RecipeError(f"recipe {self.name!r}: a metric may not be named 'loss' (the loss is always reported)")
        try:
            sig = inspect.signature(self.step)
            self._step_takes_mode = "mode" in sig.parameters or len(
                [p for p in sig.parameters.values() if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]) >= 3
        except (TypeError, ValueError):
            self._step_takes_mode = False

    # ---- what the loop calls
    @property
    def splits(self) -> tuple[str, ...]:
        """Every split the loop reads: train, then the evaluated ones."""
        return ("train", *self.eval_splits)

    def metric_names(self) -> list[str]:
        """Every metric an evaluation reports, e.g. ['val_loss', 'val_accuracy', 'test_loss', 'test_accuracy']."""
        return [f"{split}_{m}" for split in self.eval_splits for m in ("loss", *self.reducers)]

    def require_splits(self, produced: dict[str, int]) -> None:
        """Every split the recipe trains or evaluates on was produced, with examples (``produced``: split ->
        examples). Names are the recipe's: a split called 'validation' is not 'val' unless eval_splits says so."""
        for split in self.splits:
            if split not in produced:
                others = sorted(set(produced) - set(self.splits))
                hint = (f" It produced {', '.join(repr(o) for o in others)}: rename the split in preprocess, or set "
                        "Recipe(eval_splits=...) to the names it uses." if others else "")
                raise EmptyDataError(f"recipe {self.name!r} produced no {split!r} split (it trains on 'train' and "
                                     f"evaluates on {', '.join(repr(e) for e in self.eval_splits)}).{hint}")
            if not produced[split]:
                raise EmptyDataError(f"recipe {self.name!r} produced no {split} examples; check the raw data and "
                                     "options (e.g. a 'limit' of 0 or a validation fraction too small)")

    def run_step(self, model: torch.nn.Module, batch: dict[str, torch.Tensor], mode: Mode) -> StepOutput:
        out = self.step(model, batch, mode) if self._step_takes_mode else self.step(model, batch)
        if not isinstance(out, StepOutput):
            raise RecipeError(f"recipe {self.name!r}: step() returned {type(out).__name__}, not a StepOutput "
                              "(return StepOutput(loss=mean_loss_tensor, count=examples, sums={...}))")
        if not isinstance(out.loss, torch.Tensor) or out.loss.ndim != 0:
            shape = tuple(out.loss.shape) if isinstance(out.loss, torch.Tensor) else type(out.loss).__name__
            raise RecipeError(f"recipe {self.name!r}: StepOutput.loss must be a scalar tensor (the batch's mean loss), "
                              f"got {shape}; reduce it with .mean()")
        return out

    def reduce_metrics(self, split: str, sums: dict[str, float]) -> dict[str, float]:
        """``<split>_<metric>`` for every declared metric, from one evaluation's summed outputs (``count`` included).
        A reducer whose key the step never produced is the recipe's bug, not a zero: it raises."""
        out = {}
        for name, reducer in self.reducers.items():
            missing = [k for k in reducer.keys() if k not in sums]
            if missing:
                produced = sorted(k for k in sums if k != "count") or ["nothing"]
                raise RecipeError(
                    f"recipe {self.name!r}: metric {name!r} needs StepOutput.sums[{missing[0]!r}], which step() "
                    f"never produced on split {split!r} (it produced: {', '.join(produced)}). Return it from step(), "
                    f"e.g. StepOutput(..., sums={{{missing[0]!r}: ...}}), or fix the metric's key.")
            out[f"{split}_{name}"] = reducer.reduce(sums)
        return out

    def make_model(self, params: RecipeParams, meta: dict[str, Any]) -> torch.nn.Module:
        model = self.build_model(params, meta)
        if not isinstance(model, torch.nn.Module):
            raise RecipeError(f"recipe {self.name!r}: build_model() returned {type(model).__name__}, not a "
                              "torch.nn.Module")
        return model

    def make_optimizer(self, model: torch.nn.Module, tc: "TrainConfig") -> torch.optim.Optimizer:
        defer_dynamo_import()  # an optimizer imports torch._dynamo (1-2 s) only once something compiles
        if self.optimizer is None:
            params = list(model.parameters())
            # fused on a GPU: one kernel for every parameter's update, not a few per tensor (None: torch's choice)
            return torch.optim.AdamW(params, lr=tc.lr, betas=tuple(tc.adam_betas), eps=tc.adam_eps,
                                     weight_decay=tc.weight_decay, fused=True if fused_optimizer_ok(params) else None)
        opt = self.optimizer(model, tc)
        if not isinstance(opt, torch.optim.Optimizer):
            raise RecipeError(f"recipe {self.name!r}: optimizer() returned {type(opt).__name__}, not a "
                              "torch.optim.Optimizer")
        return opt

    def make_scheduler(self, optimizer: torch.optim.Optimizer, tc: "TrainConfig", total_steps: int) -> Any:
        if self.scheduler is None:
            return torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: lr_factor(s, tc, total_steps))
        sched = self.scheduler(optimizer, tc, total_steps)
        if not (hasattr(sched, "step") and hasattr(sched, "state_dict") and hasattr(sched, "load_state_dict")):
            raise RecipeError(f"recipe {self.name!r}: scheduler() returned {type(sched).__name__}; it must be a "
                              "torch.optim.lr_scheduler (stepped once per optimizer step, saved in checkpoints)")
        return sched

    def apply_transform(self, batch: dict[str, torch.Tensor], seed: int, epoch: int, step: int, micro: int,
                        rank: int) -> dict[str, torch.Tensor]:
        if self.transform is None:
            return batch
        gen = torch.Generator(device=next(iter(batch.values())).device)
        gen.manual_seed(int(np.random.SeedSequence([seed, epoch, step, micro, rank]).generate_state(1, np.uint64)[0]
                            >> 1))
        out = self.transform(batch, gen)
        if not isinstance(out, dict):
            raise RecipeError(f"recipe {self.name!r}: transform() returned {type(out).__name__}, not the batch dict")
        return out

    # ---- options and the cache key
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
        """Source code that shapes the cached shards: ``preprocess`` and ``fingerprint_raw`` with what they use from
        their own modules, the params model, and ``code_sources``."""
        return "\n".join(_source(obj) for obj in
                         _with_dependencies([self.preprocess, self.fingerprint_raw, self.params_model,
                                             *self.code_sources]))


def lr_factor(step: int, tc: "TrainConfig", total: int) -> float:
    """The default schedule: linear warm-up over ``warmup_steps``, then ``lr_schedule`` down to ``min_lr_ratio``."""
    warmup = tc.warmup_steps
    if warmup and step < warmup:
        return (step + 1) / warmup
    if tc.lr_schedule == "constant":
        return 1.0
    progress = min(1.0, (step - warmup) / max(1, total - warmup))
    floor = tc.min_lr_ratio
    if tc.lr_schedule == "linear":
        return floor + (1 - floor) * (1 - progress)
    return floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * progress))


def _source(obj: Any) -> str:
    target = obj.func if hasattr(obj, "func") and hasattr(obj, "args") else obj  # functools.partial
    try:
        text = textwrap.dedent(inspect.getsource(target))
    except (OSError, TypeError):
        text = getattr(target, "__qualname__", repr(target))
    if target is not obj:  # a partial's bound arguments shape the data too
        text += f"\n# partial args={obj.args!r} kwargs={sorted(obj.keywords.items())!r}"
    return text


def _referenced_names(code: types.CodeType) -> set[str]:
    names = {ins.argval for ins in dis.get_instructions(code) if ins.opname in ("LOAD_GLOBAL", "LOAD_NAME")}
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            names |= _referenced_names(const)
    return {n for n in names if isinstance(n, str)}


def _with_dependencies(roots: list[Any]) -> list[Any]:
    """``roots`` plus, transitively, the functions and classes of the same module(s) that their code refers to by
    global name. Library code (other packages) is covered by the raw fingerprint and the params, not hashed."""
    seen: list[Any] = []
    todo = list(roots)
    while todo:
        obj = todo.pop(0)
        if any(obj is s for s in seen):
            continue
        seen.append(obj)
        target = obj.func if hasattr(obj, "func") and hasattr(obj, "args") else obj
        module = inspect.getmodule(target)
        codes = []
        if inspect.isfunction(target):
            codes.append(target.__code__)
        elif inspect.isclass(target):
            codes += [v.__code__ for v in vars(target).values() if inspect.isfunction(v)]
        for code in codes:
            for name in sorted(_referenced_names(code)):
                dep = getattr(module, name, None)
                if (inspect.isfunction(dep) or inspect.isclass(dep)) and inspect.getmodule(dep) is module:
                    todo.append(dep)
    return seen


BUILTIN = {"digits": "training.recipes.digits:recipe", "codelm": "training.recipes.codelm:recipe"}


def resolve_recipe(spec: str) -> Recipe:
    """A built-in name or 'package.module:function' -> Recipe, with a clear error otherwise.

    Nothing is called that is not a recipe factory: the worker's allow-list (``$THRIFTY_ALLOWED_RECIPES``) first,
    then the module's source must declare ``def function() -> Recipe`` before the module is imported
    (``thrifty.usercode.recipe_spec``), and the function object must be that declared factory before it is called.
    """
    check_recipe_allowed(spec)
    target = BUILTIN.get(spec, spec)
    if ":" not in target:
        raise ConfigError(
            f"'recipe': unknown recipe {shown(spec)}. Use one of {', '.join(sorted(BUILTIN))} "
            "or 'package.module:function' for your own."
        )
    # like `python -m`, the current directory is importable: a recipe package beside the config just works, here,
    # under the local launcher and on a SkyPilot node (whose current directory is the synced compute.workdir)
    if os.getcwd() not in sys.path and "" not in sys.path:
        sys.path.append(os.getcwd())
    module_name, func_name = check_recipe_spec(target)
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ConfigError(
            f"'recipe': cannot import module {module_name!r} for recipe {spec!r} ({exc}). Run thrifty from the "
            f"directory that holds {module_name.split('.')[0]!r} (it is importable from there, as on a cloud node, "
            "whose current directory is compute.workdir), check that its package is installed (pip install -e .), or "
            "add its parent directory to PYTHONPATH."
        ) from None
    except (Exception, SystemExit) as exc:  # the module itself is broken: say where, not a traceback
        raise ConfigError(f"'recipe': importing module {module_name!r} for recipe {spec!r} failed: "
                          f"{type(exc).__name__}: {exc}") from None
    factory = vars(module).get(func_name)
    if not (inspect.isfunction(factory) and _returns_recipe(factory) and _no_required_args(factory)):
        raise ConfigError(f"'recipe': {spec!r} is not a recipe once imported ({type(factory).__name__}); {HOW}.")
    try:
        recipe = factory()
    except (Exception, SystemExit) as exc:
        raise ConfigError(
            f"'recipe': calling {spec!r} failed ({type(exc).__name__}: {exc}); a recipe is a function that "
            "takes no arguments and returns a training.recipes.Recipe") from None
    if not isinstance(recipe, Recipe):
        raise ConfigError(f"'recipe': {spec!r} returned {type(recipe).__name__}, not a training.recipes.Recipe.")
    return recipe


def _returns_recipe(func: types.FunctionType) -> bool:
    """The function's return annotation is Recipe (or a subclass), as an object or as a name in its module."""
    ann = func.__annotations__.get("return")
    if isinstance(ann, str):
        parts = ann.strip("'\"").split(".")
        ann = func.__globals__.get(parts[0])
        for part in parts[1:]:
            ann = getattr(ann, part, None) if isinstance(ann, types.ModuleType) else None
    return isinstance(ann, type) and issubclass(ann, Recipe)


def _no_required_args(func: types.FunctionType) -> bool:
    return all(p.default is not p.empty or p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD)
               for p in inspect.signature(func).parameters.values())
