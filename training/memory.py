"""Activation checkpointing (``train.activation_checkpointing``): the model's blocks recompute their activations in
the backward pass instead of keeping them from the forward, so a step holds far less memory (a larger micro-batch,
or the same one on a cheaper GPU) for about one more forward pass of compute.

The blocks are the recipe's (``Recipe.blocks``), else the model's ``blocks`` or ``layers`` list (the convention of
nanoGPT-style and torchtitan models). Each chosen block's ``forward`` is wrapped in place, so parameter names and
checkpoints are unchanged, and a run can turn it on or off at any resume: with the RNG state kept for the recompute
(dropout draws the same masks twice), the weights come out the same either way.
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING, Any, Callable

import torch

from training.recipes.base import RecipeError

if TYPE_CHECKING:
    from thrifty.config import TrainConfig
    from training.recipes.base import Recipe

BLOCK_LISTS = ("blocks", "layers")  # attribute names searched when the recipe names no blocks


def model_blocks(recipe: "Recipe", model: torch.nn.Module) -> list[torch.nn.Module]:
    """The blocks whose activations may be recomputed, in order: ``Recipe.blocks(model)``, else ``model.blocks`` or
    ``model.layers`` when it is a ModuleList. A RecipeError says how to name them when neither is there."""
    if recipe.blocks is not None:
        found = list(recipe.blocks(model))
        if not found or not all(isinstance(b, torch.nn.Module) for b in found):
            raise RecipeError(f"recipe {recipe.name!r}: blocks(model) must return the model's blocks (torch.nn.Module "
                              f"objects, e.g. model.transformer.h), got {[type(b).__name__ for b in found] or 'none'}")
        return found
    for name in BLOCK_LISTS:
        blocks = getattr(model, name, None)
        if isinstance(blocks, torch.nn.ModuleList) and len(blocks):
            return list(blocks)
    raise RecipeError(f"recipe {recipe.name!r}: train.activation_checkpointing needs the model's blocks, and its "
                      f"{type(model).__name__} has no 'blocks' or 'layers' ModuleList. Name them in the recipe, e.g. "
                      "Recipe(..., blocks=lambda model: model.transformer.h), or set train.activation_checkpointing=off")


def chosen(n_blocks: int, mode: str, every: int) -> list[int]:
    """Indices of the blocks to checkpoint: all of them (full), every ``every``-th counted from the first
    (selective), none (off)."""
    if mode == "full":
        return list(range(n_blocks))
    if mode == "selective":
        return list(range(0, n_blocks, every))
    return []


def _recomputed(forward: Callable[..., Any]) -> Callable[..., Any]:
    """``forward`` run under torch.utils.checkpoint while gradients are on (training); as it is otherwise."""
    from torch.utils.checkpoint import checkpoint

    @functools.wraps(forward)
    def run(*args: Any, **kwargs: Any) -> Any:
        if torch.is_grad_enabled():
            if SavedActivations.active is not None:  # a measurement: what the recomputed block keeps is its inputs
                for a in (*args, *kwargs.values()):
                    SavedActivations.active.count(a)
            # non-reentrant: works with DDP and with inputs that need no grad; the RNG is replayed for the recompute
            return checkpoint(forward, *args, use_reentrant=False, preserve_rng_state=True, **kwargs)
        return forward(*args, **kwargs)

    run.thrifty_recomputed = True  # type: ignore[attr-defined]
    return run


def apply(model: torch.nn.Module, recipe: "Recipe", tc: "TrainConfig") -> int:
    """Wrap the blocks ``tc`` asks for; the number wrapped (0 when off). Idempotent per block."""
    if tc.activation_checkpointing == "off":
        return 0
    blocks = model_blocks(recipe, model)
    picked = chosen(len(blocks), tc.activation_checkpointing, tc.activation_checkpointing_every)
    for i in picked:
        if not getattr(blocks[i].forward, "thrifty_recomputed", False):
            blocks[i].forward = _recomputed(blocks[i].forward)
    return len(picked)


def describe(n_wrapped: int, tc: "TrainConfig") -> str:
    if not n_wrapped:
        return "activation checkpointing off"
    every = f" (every {tc.activation_checkpointing_every})" if tc.activation_checkpointing == "selective" else ""
    return f"activation checkpointing {tc.activation_checkpointing}{every}: {n_wrapped} block(s) recompute their activations"


class SavedActivations:
    """Bytes of activations a training step keeps for its backward pass while in this context: the memory activation
    checkpointing trades for compute, counted on any device, each storage once. Counts what autograd saves, less the
    model's own weights, plus the inputs a recomputed block keeps in their place."""

    active: "SavedActivations | None" = None

    def __init__(self, model: torch.nn.Module) -> None:
        self.bytes = 0
        self._seen: set[int] = {p.untyped_storage().data_ptr() for p in model.parameters()}
        self._hooks: Any = None

    def count(self, t: Any) -> None:
        if isinstance(t, torch.Tensor) and t.untyped_storage().data_ptr() not in self._seen:
            self._seen.add(t.untyped_storage().data_ptr())
            self.bytes += t.untyped_storage().nbytes()

    def _pack(self, t: torch.Tensor) -> torch.Tensor:
        self.count(t)
        return t

    def __enter__(self) -> "SavedActivations":
        SavedActivations.active = self
        self._hooks = torch.autograd.graph.saved_tensors_hooks(self._pack, lambda t: t)
        self._hooks.__enter__()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._hooks.__exit__(*exc)
        SavedActivations.active = None
