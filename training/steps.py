"""One optimizer step and one evaluation: what the training loop and the smoke test share."""

from __future__ import annotations

import contextlib
from typing import Callable

import numpy as np
import torch

from training.data import Split
from training.recipes.base import Recipe
from training.runtime import autocast


def optimizer_step(model: torch.nn.Module, recipe: Recipe, fetch: Callable[[int], dict[str, torch.Tensor]],
                   accum: int, optimizer: torch.optim.Optimizer, scaler: torch.amp.GradScaler, device: torch.device,
                   amp: torch.dtype | None, grad_clip: float | None, ddp: bool = False) -> float:
    """One optimizer step over ``accum`` micro-batches (``fetch(i)`` gives the i-th); returns the mean loss.

    Each micro-batch's mean loss is divided by ``accum``, so the accumulated gradient equals that of
    one batch ``accum`` times larger. Under DDP, gradients are all-reduced only on the last micro-batch.
    """
    optimizer.zero_grad(set_to_none=True)
    if accum == 1 and not ddp and amp is None and not scaler.is_enabled():
        # the plain step, the same arithmetic with nothing to cast, scale or sync: a few microseconds of Python less
        out = recipe.run_step(model, fetch(0), "train")
        out.loss.backward()
        if grad_clip is not None:
            torch.nn.utils.clip_grad_norm_(model.parameters(), grad_clip)
        optimizer.step()
        return float(out.loss.detach())
    loss_sum: torch.Tensor | None = None
    for micro in range(accum):
        batch = fetch(micro)
        with (model.no_sync() if ddp and micro < accum - 1 else contextlib.nullcontext()):
            with autocast(device, amp):
                out = recipe.run_step(model, batch, "train")
            # (x / 1 is x, bit for bit: one tensor op less per step when there is no accumulation)
            scaler.scale(out.loss / accum if accum > 1 else out.loss).backward()
        loss = out.loss.detach().float()
        loss_sum = loss if loss_sum is None else loss_sum + loss
    if grad_clip is not None:
        scaler.unscale_(optimizer)
        torch.nn.utils.clip_grad_norm_(model.parameters(), grad_clip)
    scaler.step(optimizer)
    scaler.update()
    return float(loss_sum) / accum


@torch.no_grad()
def evaluate(model: torch.nn.Module, recipe: Recipe, splits: dict[str, Split], device: torch.device,
             amp: torch.dtype | None, batch_size: int, max_batches: int | None = None) -> dict[str, float]:
    """``<split>_loss`` and every declared metric on each of the recipe's eval splits (in eval mode), e.g.
    ``{"val_loss": ..., "val_accuracy": ...}``. ``max_batches`` limits each split (the smoke test)."""
    model.eval()
    result: dict[str, float] = {}
    for name in recipe.eval_splits:
        split = splits[name]
        loss_sum, sums = 0.0, {"count": 0.0}
        for i, start in enumerate(range(0, split.n, batch_size)):
            if max_batches is not None and i >= max_batches:
                break
            batch = split.batch(np.arange(start, min(start + batch_size, split.n)), device)
            with autocast(device, amp):
                out = recipe.run_step(model, batch, "eval")
            loss_sum += float(out.loss.float()) * out.count
            for k, v in (*out.sums.items(), ("count", out.count)):
                sums[k] = sums.get(k, 0.0) + float(v)
        result[f"{name}_loss"] = loss_sum / sums["count"] if sums["count"] else float("nan")
        result.update(recipe.reduce_metrics(name, sums))
    model.train()
    return result


def batch_rows(order: np.ndarray, start: int, size: int) -> np.ndarray:
    """The rows at positions ``start .. start+size`` of an epoch's ``order``: a view of it, or past its end wrapped to
    its start (only with ``drop_last: false``, whose last step is padded the way torch's DistributedSampler pads)."""
    if start + size <= len(order):
        return order[start:start + size]
    return order[np.arange(start, start + size) % len(order)]
