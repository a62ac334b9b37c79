"""The local launcher's injected preemption lands at exactly the step asked (compute.preempt_after_steps), however fast
the machine trains: a notice checkpoints that step and the job resumes from it; a kill loses the steps since the last
checkpoint. The managed loop and a script's session alike; a paced (slow) run and a fast one alike."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from conftest import python_env
from scripting import records, starts
from thrifty.config import build_config
from thrifty.launchers.base import JobState
from thrifty.launchers.local import LocalLauncher
from thrifty.protocol import ENV_PREEMPT_AT_STEP
from training.boundary import StepBoundary

pytestmark = pytest.mark.slow

AT = 13  # the step asked; checkpoints every 8 steps, so a kill there redoes 5
SCRIPT = '''
import torch
from thrifty import session
sess = session.init(total_steps=30)
step, state = sess.load_latest() or (0, None)
w = state["w"] if state else torch.zeros(3)
while step < 30:
    w += 1
    step += 1
    sess.log(step, loss=1.0 / step)
    stop = sess.should_stop()
    if stop or sess.should_save(step) or step == 30:
        sess.save({"w": w}, step)
    if stop:
        break
'''


def launch(cfg) -> list[dict]:
    launcher = LocalLauncher()
    job = launcher.submit(cfg)
    status = launcher.wait(job, timeout=240)
    logs = "\n".join(p.read_text()[-3000:] for p in (Path(cfg.store) / "runs" / cfg.run_name / "logs").rglob("*.log"))
    assert status.state == JobState.SUCCEEDED, (status.message, logs)
    assert [a.end_reason for a in status.attempts] == ["preempted", "succeeded"]  # what the flow's ledger records
    return records(Path(cfg.store), cfg.run_name)


def first_attempt(recs: list[dict]) -> list[dict]:
    second = [i for i, r in enumerate(recs) if r.get("event") == "start"][1]
    return recs[:second]


def check_landed(cfg, mode: str, recs: list[dict]) -> None:
    store, run = Path(cfg.store), cfg.run_name
    attempt = first_attempt(recs)
    assert max(r["step"] for r in attempt if "loss" in r) == AT, "attempt 1 trained up to the step asked, not past it"
    if mode == "sigterm":  # the notice: that step saved, nothing redone
        assert [(r["step"], r["reason"]) for r in attempt if r.get("event") == "interrupted"] == [(AT, "signal")]
        assert starts(store, run) == [0, AT]
    else:  # the kill: no word from the node, the steps since the checkpoint at 8 are redone
        assert not [r for r in attempt if r.get("event") == "interrupted"]
        assert starts(store, run) == [0, 8]


@pytest.mark.parametrize("mode, pace_s", [("sigterm", 0.0), ("kill", 0.05)])  # a fast run, a slow one
def test_the_recipe_loop_is_preempted_at_exactly_the_step_asked(tmp_path, monkeypatch, mode, pace_s):
    if pace_s:
        monkeypatch.setenv("THRIFTY_MIN_STEP_S", str(pace_s))  # a slow machine: 20 steps a second
    cfg = build_config({
        "run_name": f"at-{mode}", "recipe": "digits", "recipe_params": {"hidden": 16, "limit": 400},
        "store": str(tmp_path / "store"),
        "train": {"max_epochs": 2, "micro_batch": 16, "precision": "fp32", "checkpoint_every": 8, "log_every": 1,
                  "async_checkpoint": False, "early_stopping": {"enabled": False}},
        "compute": {"emulate": "aws:g5.xlarge", "preempt_after_steps": AT, "preempt_mode": mode, "preempt_grace_s": 60},
    })
    recs = launch(cfg)
    check_landed(cfg, mode, recs)
    summary = json.loads((tmp_path / "store" / "runs" / cfg.run_name / "summary.json").read_text())
    assert summary["status"] == "completed" and summary["resumes"] == 1


@pytest.mark.parametrize("mode", ["sigterm", "kill"])
def test_a_scripts_session_is_preempted_at_exactly_the_step_asked(tmp_path, monkeypatch, mode):
    monkeypatch.setenv("PYTHONPATH", python_env()["PYTHONPATH"])  # the script imports thrifty from this checkout
    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    cfg = build_config({
        "run_name": f"script-{mode}", "recipe": "script", "recipe_params": {"command": f"python {script}"},
        "store": str(tmp_path / "store"),
        "train": {"checkpoint_every": 8, "log_every": 1, "async_checkpoint": False},
        "compute": {"emulate": "aws:g5.xlarge", "preempt_after_steps": AT, "preempt_mode": mode, "preempt_grace_s": 60},
    })
    recs = launch(cfg)
    check_landed(cfg, mode, recs)
    assert max(r["step"] for r in recs if "loss" in r) == 30


class _Stop:
    signum = None


def test_the_node_waits_at_its_step_for_its_launcher_and_trains_on_if_it_is_gone(tmp_path):
    """The flag is whole before the node waits; a launcher process that has ended cannot preempt it: it trains on."""
    import subprocess
    import sys

    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    flag = tmp_path / "flag"
    boundary = StepBoundary.from_env({ENV_PREEMPT_AT_STEP: json.dumps(
        {"step": 5, "node": 0, "mode": "sigterm", "flag": str(flag), "launcher_pid": gone.pid})})
    stop = _Stop()
    boundary.passed(4, stop)
    assert not flag.exists()
    boundary.passed(5, stop)  # returns: its launcher is gone
    assert json.loads(flag.read_text())["step"] == 5 and stop.signum is None
    flag.unlink()
    boundary.passed(6, stop)  # once per job
    assert not flag.exists()
    other = StepBoundary.from_env({ENV_PREEMPT_AT_STEP: json.dumps({"step": 5, "node": 1, "mode": "kill", "flag": "x"}),
                                   "SKYPILOT_NODE_RANK": "0"})
    assert other.preempt_at is None, "only the node asked for stops"
