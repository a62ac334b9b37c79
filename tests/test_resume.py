"""Crash safety: SIGTERM checkpoints and exits 0, a torn or damaged checkpoint is skipped; resumes end bit-identical.

Random kill -9 at many points, on a file store and on S3, is tests/test_chaos.py."""

from __future__ import annotations

import json
import signal
import subprocess
import time
from pathlib import Path

import pytest

from conftest import PYTHON, python_env

pytestmark = pytest.mark.slow

CONFIG = {
    "recipe": "digits",
    "recipe_params": {"hidden": 256, "dropout": 0.2},  # dropout: the RNG state must survive the resume too
    "train": {
        "max_epochs": 4,
        "micro_batch": 16,
        "grad_accum_steps": 2,
        "precision": "fp32",
        "checkpoint_every": 7,
        "keep_last": 2,
        "log_every": 1,
        "warmup_steps": 5,
        "early_stopping": {"patience": 50},
    },
}  # 4 epochs x 44 steps = 176 optimizer steps


def write_config(tmp_path: Path, run_name: str) -> Path:
    cfg = {**CONFIG, "run_name": run_name, "store": str(tmp_path / "store")}
    path = tmp_path / f"{run_name}.json"
    path.write_text(json.dumps(cfg))
    return path


def summary(tmp_path: Path, run_name: str) -> dict:
    return json.loads((tmp_path / "store" / "runs" / run_name / "summary.json").read_text())


def start(config: Path, **extra_env: str) -> subprocess.Popen:
    env = {**python_env(), **extra_env}
    return subprocess.Popen([PYTHON, "-m", "training", "--config", str(config)], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def latest_step(store: Path, run_name: str) -> int:
    step = 0
    for f in (store / "runs" / run_name / "metrics").glob("*.jsonl"):
        for line in f.read_text().splitlines():
            try:
                step = max(step, json.loads(line).get("step", 0))
            except json.JSONDecodeError:
                pass  # a line being written
    return step


@pytest.fixture(scope="module")
def reference(tmp_path_factory) -> dict:
    tmp = tmp_path_factory.mktemp("reference")
    proc = start(write_config(tmp, "ref"))
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err
    return summary(tmp, "ref")


def test_sigterm_saves_and_exits_zero_then_resumes_bit_exact(tmp_path, reference):
    config = write_config(tmp_path, "spot")
    store = tmp_path / "store"
    for target in (30, 90):
        proc = start(config, THRIFTY_MIN_STEP_S="0.005")  # a fixed pace: the run is still training when the signal comes
        deadline = time.monotonic() + 120
        while latest_step(store, "spot") < target and proc.poll() is None:
            assert time.monotonic() < deadline
            time.sleep(0.002)
        sent = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=60)
        assert time.monotonic() - sent < 30, "SIGTERM must checkpoint and exit within the shortest notice (GCP's 30 s)"
        assert proc.returncode == 0, err
        assert "interrupted at step" in err
        step = int(err.split("interrupted at step ")[1].split(";")[0])
        commit = store / "runs" / "spot" / "ckpt" / f"step-{step:09d}" / "COMMIT"
        assert commit.exists(), "the emergency checkpoint is at the step where the run stopped"

    proc = start(config)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err
    resumed = summary(tmp_path, "spot")
    assert resumed["resumes"] == 2
    assert resumed["weights_sha256"] == reference["weights_sha256"]


def test_torn_checkpoint_is_skipped_with_warning(tmp_path, reference):
    """A kill between checkpoint data and commit marker leaves a torn step directory that is never loaded."""
    config = write_config(tmp_path, "torn")
    proc = start(config, THRIFTY_FAULT="after_data:3")
    proc.communicate(timeout=120)
    ckpt_dir = tmp_path / "store" / "runs" / "torn" / "ckpt"
    torn = [d for d in ckpt_dir.iterdir() if not (d / "COMMIT").exists()]
    assert len(torn) == 1 and (torn[0] / "state.pt").exists()
    complete = sorted(d.name for d in ckpt_dir.iterdir() if (d / "COMMIT").exists())
    # damage the newest complete checkpoint as well: the loader must fall back to an older one
    newest = ckpt_dir / complete[-1] / "state.pt"
    newest.write_bytes(newest.read_bytes()[: newest.stat().st_size // 2])
    proc = start(config)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err
    assert "damaged" in err
    assert summary(tmp_path, "torn")["weights_sha256"] == reference["weights_sha256"]
