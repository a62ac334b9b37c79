"""A Lightning fit's training loader, made to resume at the exact batch (``ThriftyCallback`` installs it).

Lightning restores a loader that has ``state_dict``/``load_state_dict`` mid-epoch; a plain ``DataLoader``
has neither, so a fit resumed from a mid-epoch checkpoint starts the epoch over (examples trained
twice, others skipped). The callback rebuilds a plain ``DataLoader`` over a map-style dataset as
torchdata's ``StatefulDataLoader`` with the same arguments: its position in the epoch, the state of
the shuffle's generator and, with ``num_workers`` > 0, the workers' seeds are in Lightning's checkpoint
(and so in Thrifty's), and the resumed fit trains the very batches an uninterrupted one would.

What cannot resume exactly is named, with the fix, before anything trains: an ``IterableDataset``
without ``state_dict``/``load_state_dict``, a sampler or batch sampler of its own without them (one
with ``set_epoch``, whose order is a function of its seed and epoch, replays exactly), a ``DataLoader``
subclass that is not stateful.
"""

from __future__ import annotations

from typing import Any, Callable

import torch
from lightning.pytorch.trainer.connectors.data_connector import _DataLoaderSource
from lightning.pytorch.utilities import CombinedLoader
from lightning_utilities.core.apply_func import apply_to_collection
from torch.utils.data import BatchSampler, DataLoader, IterableDataset, RandomSampler, SequentialSampler
from torchdata.stateful_dataloader import StatefulDataLoader
from torchdata.stateful_dataloader.sampler import RandomSampler as StatefulRandomSampler

STATEFUL_FIX = ("use a map-style Dataset (__getitem__ and __len__), or give it state_dict() and load_state_dict() "
                "(torchdata's Stateful), or pass torchdata's StatefulDataLoader yourself")


def stateful(obj: Any) -> bool:
    return callable(getattr(obj, "state_dict", None)) and callable(getattr(obj, "load_state_dict", None))


def resumable(loader: Any, generator: torch.Generator | None = None) -> tuple[Any, str | None]:
    """``(loader, None)`` when ``loader`` resumes at its exact batch (rebuilt as a StatefulDataLoader if needed), or
    ``(loader, why not, with the fix)``. ``generator`` seeds a rebuilt loader's workers when it had no generator of
    its own (its state is the caller's to checkpoint): no draw from the global RNG, which the resume restores."""
    if stateful(loader) or not isinstance(loader, DataLoader):
        return loader, None  # Lightning restores it (a StatefulDataLoader among them); not a loader: not ours
    name = type(loader).__name__
    if type(loader) is not DataLoader:
        return loader, (f"the training DataLoader is a {name} without state_dict()/load_state_dict(), so a fit "
                        f"resumed mid-epoch would start the epoch over; build a plain DataLoader, or {STATEFUL_FIX}")
    dataset = loader.dataset
    if isinstance(dataset, IterableDataset):
        if stateful(dataset):
            return _rebuild(loader, generator, batch_size=loader.batch_size, drop_last=loader.drop_last), None
        return loader, (f"the training dataset is an IterableDataset ({type(dataset).__name__}) without "
                        "state_dict()/load_state_dict(): a fit resumed mid-epoch would start the epoch over, "
                        f"training examples twice and skipping others. Fix: {STATEFUL_FIX}")
    batches, sampler = loader.batch_sampler, loader.sampler
    if batches is not None and not (type(batches) is BatchSampler and batches.sampler is sampler):
        if stateful(batches) or callable(getattr(batches, "set_epoch", None)):
            return _rebuild(loader, generator, batch_sampler=batches), None
        return loader, (f"the training DataLoader's batch_sampler ({type(batches).__name__}) has no "
                        "state_dict()/load_state_dict() (nor set_epoch()), so its order cannot be replayed on resume; "
                        "give it those methods, or use a sampler with batch_size")
    if type(sampler) is RandomSampler:
        sampler = StatefulRandomSampler(dataset, replacement=sampler.replacement, num_samples=sampler._num_samples,
                                        generator=sampler.generator)  # the same draws; its generator's state is saved
    elif type(sampler) is SequentialSampler:
        sampler = None
    elif not (stateful(sampler) or callable(getattr(sampler, "set_epoch", None))):
        return loader, (f"the training DataLoader's sampler ({type(sampler).__name__}) has no "
                        "state_dict()/load_state_dict() (nor set_epoch(), like DistributedSampler), so its order "
                        "cannot be replayed on resume; give it those methods")
    return _rebuild(loader, generator, sampler=sampler, batch_size=loader.batch_size, drop_last=loader.drop_last), None


def _rebuild(loader: DataLoader, generator: torch.Generator | None, **how: Any) -> StatefulDataLoader:
    """``loader`` as a StatefulDataLoader: the same dataset, workers, collation and memory settings."""
    extra = {"prefetch_factor": loader.prefetch_factor} if loader.num_workers > 0 else {}
    return StatefulDataLoader(
        loader.dataset, num_workers=loader.num_workers, collate_fn=loader.collate_fn, pin_memory=loader.pin_memory,
        timeout=loader.timeout, worker_init_fn=loader.worker_init_fn,
        multiprocessing_context=loader.multiprocessing_context, generator=loader.generator or generator,
        persistent_workers=loader.persistent_workers, pin_memory_device=loader.pin_memory_device,
        in_order=getattr(loader, "in_order", True), **extra, **how)


def epoch_done(checkpoint: dict[str, Any]) -> None:
    """A checkpoint saved after the epoch's last batch: its loaders' iterators are spent, but a StatefulDataLoader
    only learns it at the next fetch; saved as they are, the resumed fit finds the next epoch empty and ends. Mark
    them finished: the resumed fit starts the next epoch, its order drawn from the restored shuffle generator."""
    fit = (checkpoint.get("loops") or {}).get("fit_loop") or {}
    for state in (fit.get("state_dict") or {}).get("combined_loader") or []:
        if isinstance(state, dict) and "_iterator_finished" in state:
            state["_iterator_finished"] = True


class ResumableSource(_DataLoaderSource):
    """The fit's train-loader source, whose loaders come out resumable; ``inexact`` hears why one cannot."""

    def __init__(self, source: _DataLoaderSource, inexact: Callable[[str], None], generator: torch.Generator):
        super().__init__(source.instance, source.name)
        self._inexact, self._generator = inexact, generator

    def dataloader(self) -> Any:
        loaders = super().dataloader()
        if isinstance(loaders, CombinedLoader):
            loaders.flattened = [self._one(dl) for dl in loaders.flattened]
            return loaders
        return apply_to_collection(loaders, DataLoader, self._one)

    def _one(self, loader: Any) -> Any:
        loader, why = resumable(loader, self._generator)
        if why is not None:
            self._inexact(why)
        return loader
