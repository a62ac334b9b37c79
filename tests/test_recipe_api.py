"""The recipe API as a user who did not write the built-ins meets it: own optimizer and schedule, eval splits,
train/eval mode, seeded transforms, drop_last, metric reducers, and the first mistakes failing loudly."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import numpy as np
import pytest
import torch

import recipes_custom
from conftest import PYTHON, REPO, python_env
from thrifty.config import ConfigError, RunConfig, build_config
from thrifty.storage import FileStore
from training.data import cache_key, ensure_shards
from training.loop import train
from training.steps import batch_rows
from training.recipes import RecipeError, lr_factor, resolve_recipe
from training.runtime import weights_sha256
from training.smoke import smoke_test
from training.validate import SmokeTestFailed
from training.validate import check_config

SMALL = {"hidden": 32, "limit": 600}


def config(tmp_path: Path, recipe: str, **train) -> RunConfig:
    return build_config({
        "run_name": "custom", "recipe": recipe, "recipe_params": SMALL, "store": str(tmp_path / "store"),
        "train": {"max_epochs": 2, "micro_batch": 32, "precision": "fp32", "checkpoint_every": 10, "log_every": 5,
                  "early_stopping": {"metric": "test_accuracy", "mode": "max", "patience": 50}, **train},
    })


def test_custom_optimizer_schedule_splits_and_mode(tmp_path: Path) -> None:
    recipes_custom.MODES_SEEN.clear()
    cfg = config(tmp_path, "recipes_custom:full", lr=0.1, max_epochs=5)
    result = train(cfg)
    metrics = result.summary.final_metrics
    assert set(metrics) == {"val_loss", "val_accuracy", "test_loss", "test_accuracy"}
    assert metrics["val_accuracy"] > 0.5 and metrics["test_accuracy"] > 0.5  # SGD with momentum learned something
    assert result.summary.best_metric.name == "test_accuracy"
    # every training call saw mode "train" with the model in training mode, every evaluation "eval" in eval mode
    assert {m for m in recipes_custom.MODES_SEEN} == {("train", True), ("eval", False)}
    saved = torch.load(next((tmp_path / "store" / "runs" / "custom" / "ckpt").glob("step-*/state.pt")),
                       weights_only=False)
    assert len(saved["optimizer"]["param_groups"]) == 2 and saved["optimizer"]["param_groups"][0]["nesterov"]
    assert "step_size" in saved["scheduler"]  # the recipe's StepLR, not the default LambdaLR


def test_killed_custom_recipe_resumes_bit_exact(tmp_path: Path) -> None:
    """Own optimizer, own scheduler, a random transform, drop_last=false and an EMA: kill -9 mid-run, resume, same
    weights and the same averaged weights."""
    env = {**python_env(), "PYTHONPATH": f"{REPO / 'tests'}:{python_env()['PYTHONPATH']}"}

    def run(name: str, fault: str | None = None) -> subprocess.CompletedProcess:
        cfg = config(tmp_path, "recipes_custom:full", lr=0.05, drop_last=False, ema_decay=0.9).updated({"run_name": name})
        path = tmp_path / f"{name}.json"
        path.write_text(cfg.model_dump_json())
        return subprocess.run([PYTHON, "-m", "training", "--config", str(path)], capture_output=True, text=True,
                              env={**env, **({"THRIFTY_FAULT": fault} if fault else {})}, timeout=120)

    whole = run("whole")
    assert whole.returncode == 0, whole.stderr
    killed = run("killed", "after_commit:1")  # right after step 10's COMMIT, however far training got meanwhile
    assert killed.returncode == -9
    resumed = run("killed")
    assert resumed.returncode == 0, resumed.stderr
    assert "resumed run 'killed' from step 10" in resumed.stderr
    a, b = (json.loads((tmp_path / "store" / "runs" / n / "summary.json").read_text()) for n in ("whole", "killed"))
    assert a["weights_sha256"] == b["weights_sha256"]
    ema = [torch.load(max((tmp_path / "store" / "runs" / n / "ckpt").glob("step-*/state.pt")), weights_only=True)["ema"]
           for n in ("whole", "killed")]
    assert ema[0] is not None and weights_sha256(ema[0]) == weights_sha256(ema[1])
    assert a["steps"] == 2 * -(-384 // 32)  # drop_last=false: ceil(384 / 32) steps per epoch (600 x 0.8 x 0.8 train)


def test_misspelt_metric_fails_at_first_evaluation_and_in_smoke(tmp_path: Path) -> None:
    cfg = config(tmp_path, "recipes_custom:typo", early_stopping={"metric": "val_accuracy", "mode": "max"})
    with pytest.raises(SmokeTestFailed, match=r"metric 'accuracy' needs StepOutput.sums\['corect'\].*produced: correct"):
        smoke_test(cfg)
    with pytest.raises(RecipeError, match="never produced"):
        train(cfg)


def test_eval_split_named_differently_is_named_in_the_error(tmp_path: Path) -> None:
    cfg = config(tmp_path, "recipes_custom:validation_named", early_stopping={"metric": "val_loss"})
    with pytest.raises(ConfigError, match=r"no 'val' split .* produced 'validation': rename the split"):
        smoke_test(cfg)
    assert not list((tmp_path / "store").rglob("manifest.json"))  # nothing cached for data that cannot train


def test_early_stopping_metric_must_be_one_the_recipe_reports(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="reports val_loss, val_accuracy, test_loss, test_accuracy"):
        check_config(config(tmp_path, "recipes_custom:full", early_stopping={"metric": "accuracy"}))


@pytest.mark.parametrize("recipe,message", [
    ("recipes_custom:float64", r"array 'train.x' is float64 .*astype\(np.float32\)"),
    ("recipes_custom:variant_int32", r"array 'train.y' is int32: class labels .*astype\(np.int64\)"),
    ("recipes_custom:mixed_dtypes", r"array 'val.x' is float64 .* but 'train.x' is float32"),
    ("recipes_custom:not_a_step_output", r"step\(\) returned Tensor, not a StepOutput"),
])
def test_smoke_names_the_array_and_the_fix(tmp_path: Path, recipe: str, message: str) -> None:
    cfg = config(tmp_path, recipe, early_stopping={"metric": "val_loss"})
    with pytest.raises(SmokeTestFailed, match=message):
        smoke_test(cfg)


def test_two_recipes_in_one_module_keep_their_own_shards(tmp_path: Path) -> None:
    store = FileStore(tmp_path / "store")
    int32, int64, wider = (resolve_recipe(f"recipes_custom:{f}")
                           for f in ("variant_int32", "variant_int64", "variant_int64_wider"))
    params = int32.parse_params(SMALL)
    assert cache_key(int32, params) != cache_key(int64, params)  # other preprocessing, other shards
    assert cache_key(int64, params) == cache_key(wider, params)  # a model edit does not re-preprocess
    a, b = ensure_shards(store, int32, params), ensure_shards(store, int64, params)
    assert (a.manifest["splits"]["train"]["y"]["dtype"], b.manifest["splits"]["train"]["y"]["dtype"]) == ("int32", "int64")
    assert ensure_shards(store, wider, params).hit


def test_cache_key_follows_the_helpers_preprocess_uses() -> None:
    source = resolve_recipe("digits").preprocessing_source()
    assert "def fingerprint_raw" in source and "def _raw_file" in source  # a helper it calls is hashed
    assert "def build_model" not in source and "def step" not in source  # the model is not


def test_default_schedule_floor_and_shapes() -> None:
    tc = build_config({"train": {"warmup_steps": 10, "min_lr_ratio": 0.25}}).train
    assert lr_factor(0, tc, 110) == pytest.approx(0.1) and lr_factor(9, tc, 110) == pytest.approx(1.0)
    assert lr_factor(110, tc, 110) == pytest.approx(0.25)  # cosine ends at the configured floor
    linear = build_config({"train": {"lr_schedule": "linear", "min_lr_ratio": 0.0}}).train
    assert lr_factor(50, linear, 100) == pytest.approx(0.5)
    constant = build_config({"train": {"lr_schedule": "constant"}}).train
    assert {lr_factor(s, constant, 100) for s in (0, 50, 99)} == {1.0}
    with pytest.raises(ConfigError, match="adam_betas must both be in"):
        build_config({"train": {"adam_betas": [0.9, 1.0]}})


def test_drop_last_pads_like_distributed_sampler() -> None:
    tc = build_config({"train": {"micro_batch": 10, "drop_last": False}}).train
    assert tc.steps_per_epoch(25, 1) == 3 and tc.model_copy(update={"drop_last": True}).steps_per_epoch(25, 1) == 2
    order = np.arange(100, 125)
    seen = np.concatenate([batch_rows(order, s * 10, 10) for s in range(3)])
    assert set(seen) == set(order) and list(seen[25:]) == [100, 101, 102, 103, 104]


def test_the_ui_form_lists_every_built_in_recipe_option() -> None:
    """The form's recipe_params text names the built-ins' options (the config cannot import them without torch)."""
    from thrifty.config import RunConfig
    from thrifty.usercode.script import ScriptParams

    text = RunConfig.model_fields["recipe_params"].description
    for model in (resolve_recipe("digits").params_model, resolve_recipe("codelm").params_model, ScriptParams):
        missing = [name for name in model.model_fields if name not in text]
        assert not missing, f"recipe_params' description misses {model.__name__} options {missing}"
