"""Recipes a user would write, built on the digits data: the whole recipe API, and the first mistakes people make."""

from __future__ import annotations

import dataclasses

import numpy as np
import torch
import torch.nn.functional as F

from training.recipes import Dataset, Ratio, Recipe, StepOutput
from training.recipes.digits import DigitsParams, build_model, fingerprint_raw
from training.recipes.digits import preprocess as digits_preprocess

MODES_SEEN: list[tuple[str, bool]] = []  # (mode, model.training) per step call, for the mode test


def three_splits(params: DigitsParams) -> Dataset:
    """digits' train/val plus a held-out test split cut from train."""
    data = digits_preprocess(params)
    train = data.splits["train"]
    n_test = len(train["y"]) // 5
    data.splits["test"] = {k: v[:n_test] for k, v in train.items()}
    data.splits["train"] = {k: v[n_test:] for k, v in train.items()}
    return data


def step(model: torch.nn.Module, batch: dict[str, torch.Tensor], mode: str) -> StepOutput:
    MODES_SEEN.append((mode, model.training))
    logits = model(batch["x"])
    loss = F.cross_entropy(logits.float(), batch["y"], label_smoothing=0.1 if mode == "train" else 0.0)
    correct = (logits.argmax(-1) == batch["y"]).sum().item()
    return StepOutput(loss=loss, count=len(batch["y"]), sums={"correct": float(correct)})


def sgd(model: torch.nn.Module, tc) -> torch.optim.Optimizer:
    decay = [p for n, p in model.named_parameters() if n.endswith("weight")]
    rest = [p for n, p in model.named_parameters() if not n.endswith("weight")]
    return torch.optim.SGD([{"params": decay, "weight_decay": 1e-4}, {"params": rest, "weight_decay": 0.0}],
                           lr=tc.lr, momentum=0.9, nesterov=True)


def step_decay(optimizer: torch.optim.Optimizer, tc, total_steps: int):
    return torch.optim.lr_scheduler.StepLR(optimizer, step_size=max(1, total_steps // 3), gamma=0.5)


def jitter(batch: dict[str, torch.Tensor], gen: torch.Generator) -> dict[str, torch.Tensor]:
    noise = torch.randn(batch["x"].shape, generator=gen, device=batch["x"].device) * 0.05
    return {**batch, "x": batch["x"] + noise}


def full() -> Recipe:
    """Own optimizer (SGD, parameter groups), own scheduler, augmentation, a mode-aware step, a test split."""
    return Recipe(name="custom-full", params_model=DigitsParams, fingerprint_raw=fingerprint_raw,
                  preprocess=three_splits, build_model=build_model, step=step,
                  metrics={"accuracy": Ratio("correct")}, eval_splits=("val", "test"),
                  optimizer=sgd, scheduler=step_decay, transform=jitter)


def typo() -> Recipe:
    """The docstring's tuple form with a misspelt numerator: must not report 0 accuracy silently."""
    return dataclasses.replace(full(), name="custom-typo", metrics={"accuracy": ("corect", "count")},
                               eval_splits=("val",), preprocess=digits_preprocess)


def renamed(params: DigitsParams) -> Dataset:
    data = digits_preprocess(params)
    data.splits["validation"] = data.splits.pop("val")
    return data


def validation_named() -> Recipe:
    return dataclasses.replace(typo(), name="custom-validation", metrics={"accuracy": "correct"}, preprocess=renamed)


def as_float64(params: DigitsParams) -> Dataset:
    data = digits_preprocess(params)
    for arrays in data.splits.values():
        arrays["x"] = arrays["x"].astype(np.float64)
    return data


def float64() -> Recipe:
    return dataclasses.replace(validation_named(), name="custom-f64", preprocess=as_float64)


def val_float64(params: DigitsParams) -> Dataset:
    data = digits_preprocess(params)
    data.splits["val"]["x"] = data.splits["val"]["x"].astype(np.float64)
    return data


def mixed_dtypes() -> Recipe:
    return dataclasses.replace(validation_named(), name="custom-mixed", preprocess=val_float64)


# two recipes in one module, as the user who ported a job had: each must keep its own cached shards
def labels_int32(params: DigitsParams) -> Dataset:
    data = digits_preprocess(params)
    for arrays in data.splits.values():
        arrays["y"] = arrays["y"].astype(np.int32)
    return data


def variant_int32() -> Recipe:
    return dataclasses.replace(validation_named(), name="variant", preprocess=labels_int32)


def variant_int64() -> Recipe:
    return dataclasses.replace(validation_named(), name="variant", preprocess=digits_preprocess)


def wider_model(params, meta):
    return torch.nn.Sequential(torch.nn.Linear(meta["features"], 2 * params.hidden), torch.nn.ReLU(),
                               torch.nn.Linear(2 * params.hidden, meta["classes"]))


def variant_int64_wider() -> Recipe:
    """Same data as variant_int64, another model: must reuse its shards."""
    return dataclasses.replace(variant_int64(), build_model=wider_model)


def not_a_step_output() -> Recipe:
    return dataclasses.replace(variant_int64(), name="custom-bad-step",
                               step=lambda model, batch: model(batch["x"]).mean())


# ---- reuse (issue 27): a backbone under a head, a task that keeps the backbone, data with duplicates planted


class BackboneHead(torch.nn.Module):
    def __init__(self, features: int, hidden: int, classes: int):
        super().__init__()
        self.backbone = torch.nn.Sequential(torch.nn.Linear(features, hidden), torch.nn.ReLU())
        self.head = torch.nn.Linear(hidden, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.backbone(x))


def backbone_model(params, meta):
    return BackboneHead(meta["features"], params.hidden, meta["classes"])


def plain_step(model: torch.nn.Module, batch: dict[str, torch.Tensor]) -> StepOutput:
    logits = model(batch["x"])
    correct = (logits.argmax(-1) == batch["y"]).sum().item()
    return StepOutput(loss=F.cross_entropy(logits.float(), batch["y"]), count=len(batch["y"]),
                      sums={"correct": float(correct)})


def backbone() -> Recipe:
    """digits on a model with named parts: what a pretrained backbone comes from."""
    return dataclasses.replace(variant_int64(), name="custom-backbone", build_model=backbone_model, step=plain_step)


def parity_data(params: DigitsParams) -> Dataset:
    data = digits_preprocess(params)
    for arrays in data.splits.values():
        arrays["y"] = arrays["y"] % 2
    data.meta["classes"] = 2
    return data


def parity() -> Recipe:
    """Another task on the same inputs (odd or even): a new two-class head under digits' backbone."""
    return dataclasses.replace(backbone(), name="custom-parity", preprocess=parity_data)


PLANTED = {"within_train": 7, "leaked_val": 5}


def digits_with_duplicates(params: DigitsParams) -> Dataset:
    """digits with 7 training examples repeated inside train and 5 validation examples copied into train."""
    data = digits_preprocess(params)
    train, val = data.splits["train"], data.splits["val"]
    for name in train:
        train[name] = np.concatenate([train[name], train[name][:PLANTED["within_train"]],
                                      val[name][:PLANTED["leaked_val"]]])
    return data


def duplicated() -> Recipe:
    return dataclasses.replace(variant_int64(), name="custom-duplicated", preprocess=digits_with_duplicates)


def token_texts(params: DigitsParams) -> Dataset:
    """Random 'texts' of 128 token ids, with near-duplicates planted: 6 training texts again with 1 token changed,
    and 3 validation texts in train with 1 token changed."""
    rng = np.random.default_rng(7)
    train = rng.integers(0, 500, size=(240, 128)).astype(np.int64)
    val = rng.integers(0, 500, size=(40, 128)).astype(np.int64)
    near = train[:6].copy()
    near[:, 64] = 499 - near[:, 64]
    leaked = val[:3].copy()
    leaked[:, 20] = 499 - leaked[:, 20]
    train = np.concatenate([train, near, leaked])
    return Dataset(splits={"train": {"tokens": train}, "val": {"tokens": val}}, meta={"vocab": 500})


def bag_of_tokens(params, meta):
    return torch.nn.EmbeddingBag(meta["vocab"], meta["vocab"])


def last_token_step(model: torch.nn.Module, batch: dict[str, torch.Tensor]) -> StepOutput:
    tokens = batch["tokens"]
    logits = model(tokens[:, :-1])
    loss = F.cross_entropy(logits.float(), tokens[:, -1])
    return StepOutput(loss=loss, count=len(tokens), sums={})


def texts() -> Recipe:
    return Recipe(name="custom-texts", params_model=DigitsParams, fingerprint_raw=fingerprint_raw,
                  preprocess=token_texts, build_model=bag_of_tokens, step=last_token_step)


def one_cycle(optimizer: torch.optim.Optimizer, tc, total_steps: int):
    return torch.optim.lr_scheduler.OneCycleLR(optimizer, max_lr=tc.lr, total_steps=total_steps)


def onecycle() -> Recipe:
    """An own recipe as a user ports one: SGD with parameter groups, OneCycleLR, its own metric (``val_hit``)."""
    return Recipe(name="custom-onecycle", params_model=DigitsParams, fingerprint_raw=fingerprint_raw,
                  preprocess=digits_preprocess, build_model=build_model, step=step,
                  metrics={"hit": Ratio("correct")}, optimizer=sgd, scheduler=one_cycle)


class _Breaks(Exception):
    pass


_STEPS = {"n": 0}


def breaking_step(model: torch.nn.Module, batch: dict[str, torch.Tensor], mode: str) -> StepOutput:
    """digits' step that raises at the 10th training step of a process: past the smoke test's few, so the launched
    job fails (a bug that shows only in a long run)."""
    if mode == "train":
        _STEPS["n"] += 1
        if _STEPS["n"] >= 10:
            raise _Breaks("the data loader hit a corrupt record at step 10")
    return step(model, batch, mode)


def breaks_in_training() -> Recipe:
    return dataclasses.replace(onecycle(), name="custom-breaks", step=breaking_step)
