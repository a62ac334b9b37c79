"""Multi-process training under torchrun (2 CPU processes, gloo): it trains, resumes, and only rank 0 writes."""

from __future__ import annotations

import json
import subprocess

import pytest

from conftest import PYTHON, python_env

pytestmark = pytest.mark.slow


def torchrun(config_path, *overrides: str) -> subprocess.CompletedProcess:
    cmd = [PYTHON, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
           "-m", "training", "--config", str(config_path)]
    for o in overrides:
        cmd += ["--set", o]
    return subprocess.run(cmd, env=python_env(), capture_output=True, text=True, timeout=180)


def test_two_process_ddp_trains_and_resumes(tmp_path):
    store = tmp_path / "store"
    config = tmp_path / "ddp.json"
    config.write_text(json.dumps({
        "run_name": "ddp", "recipe": "digits", "store": str(store),
        "train": {"max_epochs": 3, "max_steps": 20, "micro_batch": 16, "precision": "fp32", "checkpoint_every": 5},
    }))
    first = torchrun(config)
    assert first.returncode == 0, first.stderr[-3000:]
    summary = json.loads((store / "runs" / "ddp" / "summary.json").read_text())
    assert summary["world_size"] == 2 and summary["steps"] == 20

    second = torchrun(config, "train.max_steps=40")
    assert second.returncode == 0, second.stderr[-3000:]
    summary = json.loads((store / "runs" / "ddp" / "summary.json").read_text())
    assert summary["steps"] == 40 and summary["resumes"] == 1
    assert "[rank 1]" in second.stderr and "resumed run 'ddp' from step 20" in second.stderr

    # rank 0 alone writes: one metrics file per invocation, and each checkpoint once
    assert len(list((store / "runs" / "ddp" / "metrics").glob("*.jsonl"))) == 2
    steps = sorted(int(d.name.split("-")[1]) for d in (store / "runs" / "ddp" / "ckpt").iterdir())
    assert steps[-1] == 40
