"""Two "nodes" on the local launcher: process groups that rendezvous through torchrun's c10d on loopback from the
variables a SkyPilot node gets, train DDP (gloo), stop together when either is preempted, resume from the shared
checkpoint to the weights of a run never preempted, and are both billed."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from thrifty.config import build_config
from thrifty.launchers.base import JobState, skypilot_node_vars, torchrun_command
from thrifty.launchers.local import LocalLauncher
from thrifty.money.ledger import read_attempts
from thrifty.storage import open_store

pytestmark = pytest.mark.slow


def two_nodes(tmp_path: Path, name: str, **compute):
    return build_config({
        "run_name": name, "recipe": "digits", "recipe_params": {"hidden": 32, "limit": 800},
        "store": str(tmp_path / "store"),
        "train": {"max_epochs": 3, "max_steps": 36, "micro_batch": 16, "precision": "fp32", "checkpoint_every": 4,
                  "log_every": 1, "early_stopping": {"enabled": False}},
        "compute": {"num_nodes": 2, "emulate": "aws:g5.xlarge", "preempt_grace_s": 60, **compute},
    })


def run(cfg) -> tuple[str, dict]:
    launcher = LocalLauncher.last = LocalLauncher()
    job = launcher.submit(cfg)
    status = launcher.wait(job, timeout=240)
    summary_path = Path(cfg.store) / "runs" / cfg.run_name / "summary.json"
    assert status.state == JobState.SUCCEEDED, (status.message, _logs(cfg))
    return job, json.loads(summary_path.read_text())


def _logs(cfg) -> str:
    return "\n".join(p.read_text()[-2000:] for p in (Path(cfg.store) / "runs" / cfg.run_name / "logs").rglob("*.log"))


def test_torchrun_command_reads_the_skypilot_node_variables() -> None:
    env = skypilot_node_vars(["10.0.0.5", "10.0.0.6"], 1)
    assert env == {"SKYPILOT_NODE_IPS": "10.0.0.5\n10.0.0.6", "SKYPILOT_NODE_RANK": "1", "SKYPILOT_NUM_NODES": "2"}
    cmd = torchrun_command(env, 29400, "job-1")
    assert {"--nnodes=2", "--node-rank=1", "--rdzv-backend=c10d", "--rdzv-endpoint=10.0.0.5:29400",
            "--rdzv-conf=is_host=0"} <= set(cmd)
    assert cmd[-2:] == ["-m", "training"]


@pytest.fixture(scope="module")
def whole(tmp_path_factory) -> dict:
    """The 2-node run never preempted."""
    _, summary = run(two_nodes(tmp_path_factory.mktemp("whole"), "whole"))
    assert summary["world_size"] == 2 and summary["steps"] == 36
    return summary


@pytest.mark.parametrize("hit,mode", [(1, "sigterm"), (0, "kill")])
def test_a_preempted_node_stops_both_and_the_job_resumes_to_the_same_weights(tmp_path, whole, hit, mode) -> None:
    cfg = two_nodes(tmp_path, "preempted", preempt_after_steps=10, preempt_node=hit, preempt_mode=mode)
    job, resumed = run(cfg)
    assert resumed["weights_sha256"] == whole["weights_sha256"]  # the shared checkpoint carried both nodes on
    assert resumed["resumes"] == 1 and resumed["world_size"] == 2
    assert [a.end_reason for a in LocalLauncher.last.attempts(job)] == ["preempted", "succeeded"]
    attempts = read_attempts(open_store(cfg.store), cfg.run_name)  # the nodes' own meter records
    assert len(attempts) == 2 and all(a.nodes == 2 for a in attempts)  # both nodes billed, every attempt
    assert attempts[0].cost_usd(attempts[0].ended_unix) == pytest.approx(
        2 * attempts[0].usd_per_hour * (attempts[0].ended_unix - attempts[0].started_unix) / 3600)
    logs = {p.name for p in (Path(cfg.store) / "runs" / cfg.run_name / "logs" / job).iterdir()}
    assert logs == {"attempt-1.log", "attempt-1-node1.log", "attempt-2.log", "attempt-2-node1.log"}
    if mode == "sigterm":  # a notice on either node: the ranks agree on a step, rank 0 saves it, nothing is redone
        assert "resumed run 'preempted' from step" in (Path(cfg.store) / "runs" / cfg.run_name / "logs" / job /
                                                        "attempt-2.log").read_text()
