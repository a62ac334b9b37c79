"""``train.micro_batch: auto``: the largest micro-batch that fits the device, found with real steps.

The candidates are the divisors of the step's examples (``train.batch_size``), so gradient accumulation makes up the
configured batch exactly. A binary search over them (the largest first: on a big GPU one try decides) runs a real
forward and backward pass of each size on the run's own data; a size fits when it raises no out-of-memory error and
its peak memory leaves ``train.micro_batch_headroom`` of the device free. Each try leaves the model, its buffers
(batch-norm statistics), its gradients and every RNG stream as they were, and frees what a failed try allocated, so a
probed run trains the same steps as one told the size. The choice is kept in the checkpoint with the device's name:
a resume on the same kind of GPU reuses it (the same steps, bit for bit); a recovery onto another GPU probes again.

On a CPU nothing bounds memory and the whole batch is one micro-batch, unless ``THRIFTY_DEVICE_MEMORY_BYTES`` says
how much there is: then the activations a try keeps stand in for its peak (how tests and rehearsals on a laptop
exercise the search).
"""

from __future__ import annotations

import gc
import logging
import os
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable

import numpy as np
import torch

from training.memory import SavedActivations
from training.runtime import autocast, rng_state, set_rng_state

if TYPE_CHECKING:
    from thrifty.config import TrainConfig
    from training.data import Split
    from training.recipes.base import Recipe
    from training.runtime import Dist

log = logging.getLogger("thrifty.train")

ENV_DEVICE_MEMORY = "THRIFTY_DEVICE_MEMORY_BYTES"  # pretend the device has this much memory (CPU rehearsals, tests)


class NothingFits(RuntimeError):
    """Not even one example per micro-batch fits the device."""


@dataclass(frozen=True)
class Choice:
    micro_batch: int
    grad_accum_steps: int
    device: str  # the device's name: a resume on the same one reuses the choice
    tries: tuple[tuple[int, bool], ...] = ()  # (size, fitted) in the order tried; empty when reused

    def record(self) -> dict[str, Any]:
        """What the checkpoint and the start record keep."""
        return {"micro_batch": self.micro_batch, "grad_accum_steps": self.grad_accum_steps, "device": self.device}


def device_name(device: torch.device) -> str:
    return torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"


def divisors(n: int) -> list[int]:
    small = [d for d in range(1, int(n ** 0.5) + 1) if n % d == 0]
    return sorted(set(small + [n // d for d in small]))


def largest_fitting(candidates: list[int], fits: Callable[[int], bool]) -> tuple[int, list[tuple[int, bool]]]:
    """The largest of the ascending ``candidates`` that ``fits`` (which must be monotone: a size that fits means
    every smaller one does), with the tries made. The largest is tried first; then a binary search."""
    tries: list[tuple[int, bool]] = []

    def attempt(size: int) -> bool:
        ok = fits(size)
        tries.append((size, ok))
        return ok

    if attempt(candidates[-1]):
        return candidates[-1], tries
    lo, hi = -1, len(candidates) - 1  # candidates[hi] does not fit; candidates[lo] does (-1: none known yet)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if attempt(candidates[mid]):
            lo = mid
        else:
            hi = mid
    if lo < 0:
        raise NothingFits(f"a micro-batch of {candidates[0]} example(s) does not fit the device")
    return candidates[lo], tries


def is_out_of_memory(exc: BaseException) -> bool:
    return isinstance(exc, torch.cuda.OutOfMemoryError) or (
        isinstance(exc, RuntimeError) and "out of memory" in str(exc).lower())


def _free(device: torch.device) -> None:
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()


def memory_limit(device: torch.device, headroom: float) -> int | None:
    """Bytes a try may peak at: the device's memory less the headroom; None where nothing bounds it."""
    pretend = os.environ.get(ENV_DEVICE_MEMORY)
    if pretend:
        return int(float(pretend) * (1.0 - headroom))
    if device.type == "cuda":
        return int(torch.cuda.get_device_properties(device).total_memory * (1.0 - headroom))
    return None


def make_fits(model: torch.nn.Module, try_step: Callable[[int], None], device: torch.device,
              limit: int) -> Callable[[int], bool]:
    """``fits(size)``: one real forward and backward pass of ``size`` examples (``try_step``) within ``limit``
    bytes, everything the pass touched put back."""
    measured_on_gpu = device.type == "cuda" and not os.environ.get(ENV_DEVICE_MEMORY)

    def fits(size: int) -> bool:
        rngs = rng_state()
        buffers = {k: v.detach().clone() for k, v in model.named_buffers()}
        try:
            if measured_on_gpu:
                torch.cuda.synchronize(device)
                torch.cuda.reset_peak_memory_stats(device)
                try_step(size)
                torch.cuda.synchronize(device)
                peak = torch.cuda.max_memory_allocated(device)
            else:
                with SavedActivations(model) as kept:
                    try_step(size)
                peak = kept.bytes
            return peak <= limit
        except Exception as exc:
            if not is_out_of_memory(exc):
                raise
            return False
        finally:
            model.zero_grad(set_to_none=True)
            with torch.no_grad():
                for k, v in model.named_buffers():
                    v.copy_(buffers[k])
            set_rng_state(rngs)
            _free(device)

    return fits


def choose(model: torch.nn.Module, try_step: Callable[[int], None], device: torch.device, batch_size: int,
           headroom: float, saved: dict[str, Any] | None) -> Choice:
    """The micro-batch for this attempt: the checkpoint's when it was chosen on a device of this name, else probed."""
    name = device_name(device)
    if saved and saved.get("device") == name and batch_size % int(saved["micro_batch"]) == 0:
        micro = int(saved["micro_batch"])
        return Choice(micro, batch_size // micro, name)
    if saved:
        log.info("micro_batch auto: the run's micro-batch of %s was chosen on %s; this attempt runs on %s: probing "
                 "again", saved.get("micro_batch"), saved.get("device"), name)
    limit = memory_limit(device, headroom)
    if limit is None:
        return Choice(batch_size, 1, name)
    micro, tries = largest_fitting(divisors(batch_size), make_fits(model, try_step, device, limit))
    return Choice(micro, batch_size // micro, name, tuple(tries))


def resolve(tc: "TrainConfig", model: torch.nn.Module, recipe: "Recipe", split: "Split", device: torch.device,
            amp: torch.dtype | None, saved: dict[str, Any] | None, dist: "Dist") -> Choice:
    """This attempt's micro-batch and accumulation: the config's, or (auto) rank 0's choice on every rank."""
    if tc.micro_batch != "auto":
        return Choice(tc.micro_batch, tc.grad_accum_steps, device_name(device))
    choice = None
    if dist.is_main:
        def try_step(size: int) -> None:
            batch = split.batch(np.arange(size) % split.n, device)
            with autocast(device, amp):
                out = recipe.run_step(model, batch, "train")
            out.loss.backward()

        choice = choose(model, try_step, device, tc.step_batch(), tc.micro_batch_headroom, saved)
        if choice.tries:
            log.info("micro_batch auto: %d example(s) a micro-batch x %d accumulated = batch_size %d (tried %s on %s)",
                     choice.micro_batch, choice.grad_accum_steps, tc.step_batch(),
                     ", ".join(f"{s} {'fits' if ok else 'does not fit'}" for s, ok in choice.tries), choice.device)
    return dist.broadcast(choice)
