"""The CUDA paths: auto precision, bf16 and fp16 autocast, GradScaler state across a kill -9, GPU checkpoints.

CI has no GPU, so these skip there; they run on a GPU machine (`python -m pytest tests/test_gpu.py`).
"""

from __future__ import annotations

import json
import signal
import subprocess
from pathlib import Path

import pytest
import torch

from conftest import PYTHON, python_env
from thrifty.config import build_config
from thrifty.runs import RunSummary
from thrifty.storage import open_store
from training.checkpoint import CheckpointManager
from training.loop import train

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (CI has none)")


def config(tmp_path: Path, run: str, **train_cfg) -> dict:
    return {"run_name": run, "recipe": "digits", "store": str(tmp_path / "store"),
            "recipe_params": {"dropout": 0.2},
            "train": {"max_epochs": 8, "micro_batch": 32, "checkpoint_every": 20, "log_every": 10,
                      "early_stopping": {"enabled": False}, **train_cfg}}


def test_auto_picks_bf16_on_cuda_and_digits_learns(tmp_path):
    result = train(build_config(config(tmp_path, "auto", precision="auto", max_epochs=20)))
    s = result.summary
    assert s.device == "cuda" and s.precision == ("bf16" if torch.cuda.get_device_capability()[0] >= 8 else "fp16")
    assert s.final_metrics["val_accuracy"] >= 0.95


@pytest.mark.parametrize("precision", ["fp16", "bf16"])
def test_kill9_on_gpu_resumes_and_matches_an_uninterrupted_run(tmp_path, precision):
    """fp16 carries a GradScaler whose scale must survive the kill; both must end as a run never killed."""
    ref = train(build_config(config(tmp_path, f"ref-{precision}", precision=precision))).summary
    path = tmp_path / f"{precision}.json"
    path.write_text(json.dumps(config(tmp_path, f"killed-{precision}", precision=precision)))
    run = [PYTHON, "-m", "training", "--config", str(path)]
    killed = subprocess.run(run, env={**python_env(), "THRIFTY_FAULT": "step:50"}, capture_output=True, text=True,
                            timeout=300)
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-3000:]
    _, state = CheckpointManager(open_store(str(tmp_path / "store")), f"killed-{precision}", 3).load_latest()
    if precision == "fp16":
        assert state["scaler"]["scale"] > 0 and "_growth_tracker" in state["scaler"]
    else:
        assert not state["scaler"], "no GradScaler in bf16"
    resumed = subprocess.run(run, env=python_env(), capture_output=True, text=True, timeout=300)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    s = RunSummary.model_validate_json(resumed.stdout[resumed.stdout.index("{"):])
    assert s.resumes == 1 and s.device == "cuda" and s.precision == precision
    assert s.steps == ref.steps
    # same kernels, same order, RNG states restored: the GPU run ends bit-identical too
    assert s.weights_sha256 == ref.weights_sha256
