"""Training numerics on small CPU runs: gradient accumulation, mixed precision, early stopping."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch

from thrifty.config import build_config
from training.loop import train
from training.recipes.digits import DigitsParams, build_model, step

# ---------------------------------------------------------------- gradient accumulation, directly


def tiny_batch(n: int = 32, features: int = 64, seed: int = 0) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {"x": torch.rand(n, features, generator=g), "y": torch.randint(0, 10, (n,), generator=g)}


def grads(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {name: p.grad.detach().clone() for name, p in model.named_parameters()}


def digits_model(seed: int = 0) -> torch.nn.Module:
    torch.manual_seed(seed)
    return build_model(DigitsParams(hidden=16, dropout=0.0), {"features": 64, "classes": 10})


@pytest.mark.parametrize("micro, accum", [(8, 4), (16, 2), (4, 8), (1, 32)])
def test_accumulated_micro_batches_match_one_full_batch(micro, accum):
    batch = tiny_batch()
    full = digits_model()
    step(full, batch).loss.backward()

    acc = digits_model()
    for i in range(accum):
        sl = slice(i * micro, (i + 1) * micro)
        (step(acc, {k: v[sl] for k, v in batch.items()}).loss / accum).backward()

    g_full, g_acc = grads(full), grads(acc)
    assert g_full.keys() == g_acc.keys()
    for name in g_full:
        assert torch.allclose(g_acc[name], g_full[name], atol=1e-6, rtol=1e-5), (
            name, (g_acc[name] - g_full[name]).abs().max().item())
    assert any(g.abs().max() > 1e-4 for g in g_full.values())  # not trivially zero


def test_loop_optimizer_step_accumulates_like_one_full_batch():
    """The loop's own step function (when it is factored out as ``training.loop.optimizer_step``)."""
    import training.loop as loop
    from training.recipes.digits import recipe

    optimizer_step = getattr(loop, "optimizer_step", None)
    if optimizer_step is None:
        pytest.skip("training.loop has no optimizer_step helper; covered through train() below")
    batch = tiny_batch()
    results = {}
    for micro, accum in [(32, 1), (8, 4)]:
        model = digits_model()
        opt = torch.optim.SGD(model.parameters(), lr=0.0)  # gradients stay readable, weights stay put
        scaler = torch.amp.GradScaler("cpu", enabled=False)

        def fetch(i: int, micro: int = micro) -> dict[str, torch.Tensor]:
            return {k: v[i * micro:(i + 1) * micro] for k, v in batch.items()}

        loss = optimizer_step(model, recipe(), fetch, accum, opt, scaler, torch.device("cpu"), None, None)
        results[accum] = (loss, grads(model))
    (loss_full, g_full), (loss_acc, g_acc) = results[1], results[4]
    assert loss_acc == pytest.approx(loss_full, abs=1e-6)  # the reported loss is the mean over the step
    for name in g_full:
        assert torch.allclose(g_acc[name], g_full[name], atol=1e-6, rtol=1e-5), name


def test_accumulation_without_dividing_the_loss_does_not_match():
    """The control: the /accum is what makes it right (so the test above can fail)."""
    batch = tiny_batch()
    full = digits_model()
    step(full, batch).loss.backward()
    acc = digits_model()
    for i in range(4):
        step(acc, {k: v[i * 8:(i + 1) * 8] for k, v in batch.items()}).loss.backward()
    assert not torch.allclose(grads(acc)["0.weight"], grads(full)["0.weight"], atol=1e-6)


# ---------------------------------------------------------------- gradient accumulation, through train()


def run_cfg(tmp_path: Path, run_name: str, **train) -> dict:
    return {
        "run_name": run_name,
        "store": str(tmp_path / "store"),
        "recipe_params": {"hidden": 32, "dropout": 0.0, "limit": 600},  # 480 train, 120 val examples
        "train": {"max_epochs": 2, "micro_batch": 32, "precision": "fp32", "checkpoint_every": 100,
                  "early_stopping": {"enabled": False}, "lr": 0.003, "warmup_steps": 3, **train},
    }


def final_state(tmp_path: Path, run_name: str) -> dict:
    ckpt = sorted((tmp_path / "store" / "runs" / run_name / "ckpt").iterdir())[-1]
    return torch.load(ckpt / "state.pt", map_location="cpu", weights_only=True)


def train_losses(tmp_path: Path, run_name: str) -> list[float]:
    lines = []
    for f in sorted((tmp_path / "store" / "runs" / run_name / "metrics").glob("*.jsonl")):
        lines += [json.loads(line) for line in f.read_text().splitlines()]
    return [r["loss"] for r in lines if "loss" in r and "event" not in r]


# AdamW barely notices a constant gradient scale, so without clipping a missing "/ grad_accum_steps" moves the final
# weights by only ~3e-5 here; with clipping (a per-step scale) it moves them by ~1e-2. Both variants run.
@pytest.mark.parametrize("grad_clip", [None, 0.5])
def test_train_with_accumulation_matches_one_big_batch(tmp_path, grad_clip):
    big = train(build_config(run_cfg(tmp_path, "big", micro_batch=32, grad_accum_steps=1, grad_clip=grad_clip,
                                     log_every=1)))
    acc = train(build_config(run_cfg(tmp_path, "acc", micro_batch=8, grad_accum_steps=4, grad_clip=grad_clip,
                                     log_every=1)))
    assert big.summary.steps == acc.summary.steps == 30  # 480 // 32 = 15 steps per epoch, 2 epochs
    w_big, w_acc = final_state(tmp_path, "big")["model"], final_state(tmp_path, "acc")["model"]
    assert w_big.keys() == w_acc.keys()
    for name in w_big:
        assert torch.allclose(w_acc[name], w_big[name], atol=1e-5), (
            name, (w_acc[name] - w_big[name]).abs().max().item())
    assert acc.summary.final_metrics["val_loss"] == pytest.approx(big.summary.final_metrics["val_loss"],
                                                                       abs=1e-5)
    # the logged training loss is the mean over the whole optimizer step in both
    assert len(train_losses(tmp_path, "big")) == 30
    assert train_losses(tmp_path, "acc") == pytest.approx(train_losses(tmp_path, "big"), abs=2e-6)
    # it trained at all
    assert big.summary.final_metrics["val_loss"] < math.log(10)


# ---------------------------------------------------------------- precision


@pytest.mark.parametrize("precision", ["bf16", "fp16"])
def test_mixed_precision_runs_complete_on_cpu(tmp_path, precision):
    result = train(build_config(run_cfg(tmp_path, precision, precision=precision)))
    s = result.summary
    assert result.status == "completed" and s.steps == s.total_steps == 30
    assert s.precision == precision and s.device == "cpu"
    assert math.isfinite(s.final_metrics["val_loss"])
    assert s.final_metrics["val_accuracy"] > 0.5
    scaler = final_state(tmp_path, precision)["scaler"]
    if precision == "fp16":
        assert "scale" in scaler and scaler["scale"] > 0  # fp16 trains with a GradScaler, and it is checkpointed
    else:
        assert scaler == {}  # bf16 needs none


def test_fp16_scaler_state_is_restored_on_resume(tmp_path):
    data = run_cfg(tmp_path, "fp16-resume", precision="fp16", max_steps=5)
    train(build_config(data))
    saved = final_state(tmp_path, "fp16-resume")["scaler"]
    data["train"]["max_steps"] = 10
    result = train(build_config(data))
    assert result.summary.resumes == 1 and result.summary.steps == 10
    # growth tracker counts steps since the last scale change: it continued from the checkpoint
    assert final_state(tmp_path, "fp16-resume")["scaler"]["_growth_tracker"] == saved["_growth_tracker"] + 5


@pytest.mark.skipif(torch.cuda.is_available(), reason="auto resolves to fp32 only on CPU")
def test_auto_precision_on_cpu_is_fp32(tmp_path):
    data = run_cfg(tmp_path, "auto", precision="auto", max_steps=3)
    data["train"]["device"] = "auto"
    s = train(build_config(data)).summary
    assert s.precision == "fp32" and s.device == "cpu"
    assert final_state(tmp_path, "auto")["scaler"] == {}
    summary_file = json.loads((tmp_path / "store" / "runs" / "auto" / "summary.json").read_text())
    assert summary_file["precision"] == "fp32"


@pytest.mark.parametrize("capability, expected", [
    ((7, 5), "fp16"),  # T4: torch.cuda.is_bf16_supported() says True (emulated), but it has no bf16 tensor cores
    ((7, 0), "fp16"),  # V100
    ((6, 1), "fp16"),  # P4 / P40
    ((8, 0), "bf16"),  # A100
    ((8, 6), "bf16"),  # A10G
    ((8, 9), "bf16"),  # L4
    ((9, 0), "bf16"),  # H100
])
def test_auto_precision_is_decided_by_compute_capability(capability, expected):
    from training.runtime import auto_precision

    assert auto_precision(capability) == expected


# ---------------------------------------------------------------- early stopping in a run


def test_early_stopping_stops_the_run(tmp_path):
    # val_accuracy must improve by more than 1.0 to count: impossible, so after the first evaluation every
    # evaluation is "no improvement" and the run stops after `patience` of them.
    data = run_cfg(tmp_path, "es", max_epochs=20, eval_every=4, checkpoint_every=100)
    data["train"]["early_stopping"] = {"metric": "val_accuracy", "mode": "max", "patience": 2, "min_delta": 1.0}
    result = train(build_config(data))
    s = result.summary
    assert result.status == "stopped_early" and s.status == "stopped_early"
    assert s.stopped_early is True
    assert s.total_steps == 300
    assert s.steps == 12 < s.total_steps  # evaluations at 4 (best), 8, 12 (2 without improvement)
    assert s.best_metric.name == "val_accuracy" and s.best_metric.step == 4
    # the stopping step was checkpointed, with the stopper's state
    state = final_state(tmp_path, "es")
    assert state["loop"]["step"] == 12 and state["early_stopping"]["stopped"] is True


def test_early_stopping_on_val_loss_with_a_learning_rate_that_diverges(tmp_path):
    """A more natural trigger: a huge learning rate makes val_loss worse (or NaN) and the run stops early."""
    data = run_cfg(tmp_path, "diverge", max_epochs=20, eval_every=2, lr=50.0, grad_clip=None)
    data["train"]["early_stopping"] = {"metric": "val_loss", "mode": "min", "patience": 3}
    s = train(build_config(data)).summary
    assert s.stopped_early is True and s.steps < s.total_steps


def test_disabled_early_stopping_runs_to_the_end(tmp_path):
    data = run_cfg(tmp_path, "no-es", eval_every=2)
    data["train"]["early_stopping"] = {"enabled": False, "metric": "val_accuracy", "mode": "max", "patience": 1,
                                       "min_delta": 1.0}
    s = train(build_config(data)).summary
    assert s.stopped_early is False and s.status == "completed" and s.steps == s.total_steps
    assert s.best_metric.step == 2  # still tracked
