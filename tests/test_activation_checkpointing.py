"""train.activation_checkpointing: recomputed blocks keep far less for the backward pass, train the same weights (so a
resume may turn it on or off), and a model whose blocks cannot be found fails the smoke test with the fix."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from thrifty.config import RunConfig, build_config
from training import memory
from training.loop import train
from training.recipes.base import Recipe, resolve_recipe
from training.smoke import smoke_test
from training.validate import SmokeTestFailed

TINY = {"max_bytes": 60_000, "val_every": 3, "vocab_size": 300, "seq_len": 32, "n_layer": 3, "n_head": 2,
        "n_embd": 32, "dropout": 0.1}  # dropout: the recompute must draw the forward's masks again


def codelm_cfg(store: Path, name: str, mode: str) -> RunConfig:
    return RunConfig(run_name=name, recipe="codelm", recipe_params=TINY, store=str(store),
                     train={"max_steps": 6, "micro_batch": 8, "precision": "fp32", "checkpoint_every": 3,
                            "log_every": 1, "eval_every": 3, "activation_checkpointing": mode,
                            "early_stopping": {"enabled": False}})


def start_record(store: Path, run: str) -> dict:
    lines = [json.loads(x) for f in (store / "runs" / run / "metrics").glob("*.jsonl") for x in f.read_text().splitlines()]
    return next(r for r in lines if r.get("event") == "start")


def test_recomputed_blocks_train_the_same_weights(store_dir):
    runs = {mode: train(codelm_cfg(store_dir, f"ac-{mode}", mode)).summary for mode in ("off", "full", "selective")}
    assert runs["full"].weights_sha256 == runs["off"].weights_sha256 == runs["selective"].weights_sha256
    assert runs["full"].final_metrics == runs["off"].final_metrics
    assert [start_record(store_dir, f"ac-{m}")["recomputed_blocks"] for m in ("off", "full", "selective")] == [0, 3, 2]


def test_a_resume_may_turn_it_on(store_dir):
    """The setting is not part of what a resume compares: a run continued with it on (say on a smaller GPU) is the
    same run."""
    off, full = codelm_cfg(store_dir, "ac", "off"), codelm_cfg(store_dir, "ac", "full")
    assert off.training_fingerprint() == full.training_fingerprint()


def saved_bytes(model: torch.nn.Module, tokens: torch.Tensor) -> int:
    with memory.SavedActivations(model) as saved:
        model(tokens).float().sum().backward()
    return saved.bytes


def test_full_keeps_a_fraction_of_the_activations():
    recipe = resolve_recipe("codelm")
    params = recipe.parse_params({**TINY, "n_layer": 4, "dropout": 0.0})
    meta = {"vocab_size": 300, "seq_len": 32}
    tokens = torch.randint(0, 300, (8, 32))
    measured = {}
    for mode in ("off", "selective", "full"):
        torch.manual_seed(0)
        model = recipe.make_model(params, meta)
        tc = build_config({"train": {"activation_checkpointing": mode}}).train
        assert memory.apply(model, recipe, tc) == {"off": 0, "selective": 2, "full": 4}[mode]
        measured[mode] = saved_bytes(model, tokens)
    assert measured["full"] * 2 < measured["selective"] < measured["off"]
    assert measured["full"] * 3 < measured["off"], measured  # what a 2x larger micro-batch needs, with room to spare


def test_selective_picks_every_nth_block_from_the_first():
    assert memory.chosen(5, "selective", 2) == [0, 2, 4]
    assert memory.chosen(5, "selective", 3) == [0, 3]
    assert memory.chosen(4, "full", 2) == [0, 1, 2, 3]
    assert memory.chosen(4, "off", 1) == []


def test_a_model_without_blocks_fails_the_smoke_test_with_the_fix(store_dir):
    cfg = build_config({"run_name": "ac-digits", "recipe": "digits", "store": str(store_dir),
                        "recipe_params": {"limit": 200}, "train": {"activation_checkpointing": "full"}})
    with pytest.raises(SmokeTestFailed, match=r"blocks=lambda model: model\.transformer\.h"):
        smoke_test(cfg, steps=2)


def test_a_recipe_names_its_own_blocks():
    digits = resolve_recipe("digits")
    named = Recipe(**{**{f: getattr(digits, f) for f in ("name", "params_model", "fingerprint_raw", "preprocess",
                                                          "build_model", "step", "metrics")},
                      "blocks": lambda model: [model[0], model[2]]})
    model = named.make_model(named.parse_params({}), {"features": 64, "classes": 10})
    tc = build_config({"train": {"activation_checkpointing": "full"}}).train
    assert memory.apply(model, named, tc) == 2
    assert memory.apply(model, named, tc) == 2  # twice: each block wrapped once
    x = torch.randn(4, 64, requires_grad=True)
    with memory.SavedActivations(model) as saved:
        model(x).sum().backward()
    assert saved.bytes > 0 and x.grad is not None
    bad = Recipe(**{**{f: getattr(digits, f) for f in ("name", "params_model", "fingerprint_raw", "preprocess",
                                                        "build_model", "step")}, "blocks": lambda model: []})
    with pytest.raises(Exception, match="must return the model's blocks"):
        memory.apply(model, bad, tc)
