"""Crash safety: a run killed (kill -9 or SIGTERM) at any point and restarted ends bit-identical to one never killed."""

from __future__ import annotations

import json
import random
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


def test_kill9_at_random_points_resumes_bit_exact(tmp_path, reference):
    config = write_config(tmp_path, "killed")
    rng = random.Random(20261122)
    # five kills: three at random optimizer steps, one in the middle of a checkpoint write (data written,
    # commit marker not yet), one from outside at a random moment of progress
    faults = [f"step:{rng.randint(3, 40)}", "after_data:2", f"step:{rng.randint(3, 40)}", None,
              f"step:{rng.randint(3, 40)}"]
    kills = 0
    for fault in faults:
        if fault:
            proc = start(config, THRIFTY_FAULT=fault)
            proc.communicate(timeout=120)
        else:
            proc = start(config)
            before = latest_step(tmp_path / "store", "killed")
            target = before + rng.randint(5, 30)
            deadline = time.monotonic() + 60
            while latest_step(tmp_path / "store", "killed") < target and proc.poll() is None:
                assert time.monotonic() < deadline
                time.sleep(0.002)
            proc.send_signal(signal.SIGKILL)
            proc.communicate(timeout=30)
        assert proc.returncode == -signal.SIGKILL, f"fault {fault} did not kill the run"
        kills += 1
    assert kills == 5
    assert not (tmp_path / "store" / "runs" / "killed" / "summary.json").exists()

    proc = start(config)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err
    resumed = summary(tmp_path, "killed")
    assert resumed["steps"] == reference["steps"]
    assert resumed["resumes"] >= 1
    assert resumed["weights_sha256"] == reference["weights_sha256"]
    assert resumed["final_metrics"] == reference["final_metrics"]


def test_sigterm_saves_and_exits_zero_then_resumes_bit_exact(tmp_path, reference):
    config = write_config(tmp_path, "spot")
    store = tmp_path / "store"
    for target in (30, 90):
        proc = start(config)
        deadline = time.monotonic() + 60
        while latest_step(store, "spot") < target and proc.poll() is None:
            assert time.monotonic() < deadline
            time.sleep(0.002)
        sent = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=30)
        assert time.monotonic() - sent < 5, "SIGTERM must checkpoint and exit within seconds"
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
