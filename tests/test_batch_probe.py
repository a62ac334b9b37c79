"""train.micro_batch: auto: the largest micro-batch that fits, found with real steps that leave no trace, the
configured batch kept with accumulation, the choice kept across a resume on the same device. On CPU the device's
memory is faked (THRIFTY_DEVICE_MEMORY_BYTES), as the module says."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from thrifty.config import ConfigError, build_config
from training import batch_probe
from training.loop import train
from training.memory import SavedActivations
from training.recipes.base import resolve_recipe


def test_auto_needs_the_batch_it_keeps_and_owns_the_accumulation():
    with pytest.raises(ConfigError, match="set train.batch_size"):
        build_config({"train": {"micro_batch": "auto"}})
    with pytest.raises(ConfigError, match="leave grad_accum_steps at 1"):
        build_config({"train": {"micro_batch": "auto", "batch_size": 64, "grad_accum_steps": 2}})
    with pytest.raises(ConfigError, match="is not micro_batch x grad_accum_steps"):
        build_config({"train": {"micro_batch": 16, "grad_accum_steps": 2, "batch_size": 64}})
    with pytest.raises(ConfigError, match="micro_batch"):
        build_config({"train": {"micro_batch": 0}})
    tc = build_config({"train": {"micro_batch": "auto", "batch_size": 96}}).train
    assert tc.examples_per_step(2) == 192 and tc.steps_per_epoch(1000, 1) == 10
    assert build_config({"train": {"micro_batch": 16, "grad_accum_steps": 4}}).train.step_batch() == 64


def test_the_search_tries_the_largest_first_then_halves_its_way_down():
    candidates = batch_probe.divisors(96)
    assert candidates == [1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 96]
    for limit in (1, 5, 12, 47, 96, 500):
        best, tries = batch_probe.largest_fitting(candidates, lambda size: size <= limit)
        assert best == max(c for c in candidates if c <= limit)
        assert len(tries) <= 5 and tries[0][0] == 96
    with pytest.raises(batch_probe.NothingFits):
        batch_probe.largest_fitting(candidates, lambda size: False)


def test_an_out_of_memory_error_is_a_size_that_does_not_fit_and_leaves_the_model_as_it_was(monkeypatch):
    monkeypatch.setenv(batch_probe.ENV_DEVICE_MEMORY, str(2**40))  # bounded, but never by the measurement
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.BatchNorm1d(8), torch.nn.Dropout(0.5))
    before = {k: v.clone() for k, v in model.state_dict().items()}
    rng = torch.get_rng_state()

    def try_step(size: int) -> None:
        model(torch.randn(size, 8)).sum().backward()  # moves the batch-norm statistics, draws dropout masks
        if size > 6:
            raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")

    best, tries = batch_probe.largest_fitting(batch_probe.divisors(24),
                                              batch_probe.make_fits(model, try_step, torch.device("cpu"), 2**40))
    assert best == 6 and (24, False) in tries
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    assert all(p.grad is None for p in model.parameters())
    assert torch.equal(torch.get_rng_state(), rng)

    def broken(size: int) -> None:
        raise ValueError("a recipe bug, not memory")

    with pytest.raises(ValueError, match="recipe bug"):
        batch_probe.make_fits(model, broken, torch.device("cpu"), 2**40)(4)


def test_a_resume_on_the_same_device_reuses_the_choice_and_another_device_probes_again(monkeypatch):
    monkeypatch.setenv(batch_probe.ENV_DEVICE_MEMORY, "1000")
    calls = []
    monkeypatch.setattr(batch_probe, "make_fits", lambda *a: (lambda size: calls.append(size) or size <= 8))
    cpu = torch.device("cpu")
    same = batch_probe.choose(torch.nn.Linear(1, 1), None, cpu, 32, 0.0, {"micro_batch": 4, "device": "cpu"})
    assert (same.micro_batch, same.grad_accum_steps, same.tries, calls) == (4, 8, (), [])
    other = batch_probe.choose(torch.nn.Linear(1, 1), None, cpu, 32, 0.0, {"micro_batch": 4, "device": "NVIDIA L4"})
    assert (other.micro_batch, other.grad_accum_steps) == (8, 4) and calls[0] == 32


def digits_cfg(store: Path, name: str, train: dict):
    return build_config({"run_name": name, "recipe": "digits", "store": str(store),
                         "recipe_params": {"hidden": 64, "dropout": 0.2, "limit": 400},
                         "train": {"max_epochs": 2, "precision": "fp32", "checkpoint_every": 5, "log_every": 1,
                                   "early_stopping": {"enabled": False}, **train}})


def test_a_probed_run_trains_what_a_run_told_the_size_trains(store_dir, monkeypatch):
    """Fake a device whose memory holds the activations of 8 examples but not 16: auto picks 8 x 4 for a batch of
    32, and the run's weights equal those of a run configured with micro_batch 8 x grad_accum_steps 4 (the probe's
    steps left no trace)."""
    recipe = resolve_recipe("digits")
    model = recipe.make_model(recipe.parse_params({"hidden": 64, "dropout": 0.2}), {"features": 64, "classes": 10})
    kept = {}
    for size in (8, 16):
        with SavedActivations(model) as saved:
            model(torch.randn(size, 64)).sum().backward()
        kept[size] = saved.bytes
    monkeypatch.setenv(batch_probe.ENV_DEVICE_MEMORY, str((kept[8] + kept[16]) // 2))
    probed = train(digits_cfg(store_dir, "auto", {"micro_batch": "auto", "batch_size": 32,
                                                    "micro_batch_headroom": 0.0})).summary
    told = train(digits_cfg(store_dir, "told", {"micro_batch": 8, "grad_accum_steps": 4})).summary
    assert probed.weights_sha256 == told.weights_sha256 and probed.steps == told.steps
    start = next(json.loads(line) for f in (store_dir / "runs" / "auto" / "metrics").glob("*.jsonl")
                 for line in f.read_text().splitlines() if '"start"' in line)
    assert (start["micro_batch"], start["grad_accum_steps"]) == (8, 4)
    ckpt = sorted((store_dir / "runs" / "auto" / "ckpt").glob("step-*"))[-1]
    saved = torch.load(ckpt / "state.pt", weights_only=True)
    assert saved["micro_batch"] == {"micro_batch": 8, "grad_accum_steps": 4, "device": "cpu"}


def test_on_a_cpu_without_a_limit_the_whole_batch_is_one_micro_batch(store_dir, monkeypatch):
    monkeypatch.delenv(batch_probe.ENV_DEVICE_MEMORY, raising=False)
    result = train(digits_cfg(store_dir, "cpu-auto", {"micro_batch": "auto", "batch_size": 32, "max_epochs": 1}))
    start = next(json.loads(line) for f in (store_dir / "runs" / "cpu-auto" / "metrics").glob("*.jsonl")
                 for line in f.read_text().splitlines() if '"start"' in line)
    assert (start["micro_batch"], start["grad_accum_steps"]) == (32, 1) and result.status == "completed"
