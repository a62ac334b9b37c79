"""The local launcher when its own I/O fails (issue 21.2): the job is reported failed at once, saying why, and nothing
that did not run is billed.

The issue's case: TMPDIR (where an S3 run's attempt logs go) read-only, then an injected preemption; opening
``attempt-2.log`` raised, the supervisor thread died, and the flow watched a job "STARTING" for minutes, billing an
attempt that never ran. Here ``attempt-2.log`` is a directory, which no open() for writing gets past (a read-only
directory would not stop root).
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from thrifty.config import build_config
from thrifty.launchers.base import JobState
from thrifty.launchers.local import LocalLauncher
from thrifty.money.budget import spend_usd
from thrifty.money.ledger import read_attempts
from thrifty.storage import open_store


def test_a_launcher_that_cannot_open_an_attempt_log_fails_the_job_at_once_and_bills_nothing_more(tmp_path):
    cfg = build_config({
        "run_name": "nolog", "recipe": "digits", "store": str(tmp_path / "store"),
        "recipe_params": {"hidden": 16, "limit": 400},
        "train": {"max_epochs": 500, "micro_batch": 16, "checkpoint_every": 10, "log_every": 1,
                  "early_stopping": {"enabled": False}},
        "compute": {"emulate": "aws:g5.xlarge", "preempt_after_steps": 20, "preempt_grace_s": 60},
    })
    launcher = LocalLauncher()
    job = launcher.submit(cfg)
    logs = Path(cfg.store) / "runs" / "nolog" / "logs" / job
    (logs / "attempt-2.log").mkdir(parents=True)  # the recovery's attempt log cannot be opened
    (logs / "attempt-2.log" / "keep").write_text("")  # (not empty: the node sweeps empty directories of its run)
    status = launcher.wait(job, timeout=180)
    failed_at = time.time()

    assert status.state is JobState.FAILED, (status.state, status.message)
    assert "the local launcher failed" in status.message and "attempt-2.log" in status.message, status.message
    [attempt] = status.attempts  # no phantom attempt 2: it never ran, so it is not billed
    assert attempt.end_reason == "preempted" and attempt.ended_unix is not None
    assert failed_at - attempt.ended_unix < 30, "reported failed at once, not after minutes of 'STARTING'"
    assert spend_usd(status.attempts, now=failed_at + 3600) == pytest.approx(attempt.cost_usd())  # spend stops
    nodes = read_attempts(open_store(cfg.store), "nolog")  # the node's own records: one attempt, ended
    assert len(nodes) == 1 and nodes[0].ended_unix is not None
