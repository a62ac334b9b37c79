"""The Lightning callback: a Trainer with `callbacks=[ThriftyCallback()]` resumes after kill -9 from its last
COMMIT and, on SIGTERM (a spot notice), saves the step it reached and stops: no step lost."""

from __future__ import annotations

import signal
import time

import pytest

from conftest import REPO
from scripting import committed_steps, kill_group, logged_step, records, start, starts, summary, wait_for_step, \
    write_config

pytestmark = pytest.mark.slow

SCRIPT = REPO / "examples" / "script" / "lightning_train.py"

def test_lightning_resumes_after_kill_and_loses_no_step_on_sigterm(tmp_path):
    store = tmp_path / "store"
    config = write_config(tmp_path, "lit", f"python {SCRIPT} --epochs 4")  # 4 x 44 batches: room for the signals

    t0 = time.time()
    proc = start(config, tmp_path)
    wait_for_step(proc, store, "lit", 25, since=t0)
    kill_group(proc)  # kill -9: the wrapper and the script
    killed_at = committed_steps(store, "lit")[-1]
    assert killed_at >= 20, "checkpoints every 10 steps"

    t0 = time.time()
    proc = start(config, tmp_path)
    wait_for_step(proc, store, "lit", killed_at + 12, since=t0)
    proc.send_signal(signal.SIGTERM)  # a spot notice to the node program, forwarded to the script
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err
    reached = logged_step(store, "lit", since=t0)
    stopped = [r for r in records(store, "lit") if r.get("event") == "interrupted"][-1]
    assert stopped["reason"] == "signal"
    assert committed_steps(store, "lit")[-1] == stopped["step"] == reached, "0 steps lost on SIGTERM"

    proc = start(config, tmp_path)
    out, err = proc.communicate(timeout=180)
    assert proc.returncode == 0, err
    assert starts(store, "lit") == [0, killed_at, reached], "each attempt resumed from the last COMMIT"
    done = summary(store, "lit")
    assert done["status"] == "completed" and done["resumes"] == 2
    assert done["steps"] == done["total_steps"] == 176
