"""A failure that repeats itself is not restarted (billed) again; preemptions and one-off failures still are.

"The same way" (thrifty.runs.exits): the same exit code and error, and no checkpoint progress in between. The
local launcher stops at the second such attempt; on a SkyPilot node the wrapper marks the job given up and exits 0
(SkyPilot restarts every other non-zero exit), and the watcher reports it failed. Exit 2 is never restarted, also
through torchrun, which ends 1 on any worker failure.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import REPO, python_env
from thrifty.config import build_config
from thrifty.launchers import JobState, JobStatus
from thrifty.launchers.failures import final_failure, program_code
from thrifty.launchers.local import LocalLauncher
from thrifty.money.ledger import Attempt
from thrifty.runs.exits import ExitRecord, given_up, read_exits, repeated_failure
from thrifty.storage import open_store


def rec(code: int, error: str = "RuntimeError: boom", step: int | None = 5, t: float = 0.0) -> ExitRecord:
    return ExitRecord(job_id="j", exit_code=code, error=error, checkpoint_step=step, time_unix=t)


@pytest.mark.parametrize("history, repeated", [
    ([rec(1, t=1), rec(1, t=2)], True),                          # the same error at the same checkpoint
    ([rec(1, t=1), rec(1, step=10, t=2)], False),                # it got further: a retry may get further still
    ([rec(1, t=1), rec(1, "OSError: disk full", t=2)], False),   # another error: a one-off
    ([rec(1, t=1), rec(0, "", t=2), rec(1, t=3)], False),        # an attempt between ended otherwise (preempted)
    ([rec(1, t=1)], False),                                      # the first failure is always retried
    ([rec(1, "", t=1), rec(1, "", t=2)], False),                 # no error to compare: not known to be the same
    ([rec(3, "", t=1), rec(3, "", t=2)], False),                 # the budget cap is no failure
])
def test_the_same_way_is_the_same_code_and_error_with_no_progress(history, repeated):
    assert (repeated_failure(history, since_unix=history[-1].time_unix) is not None) == repeated
    assert repeated_failure(history, since_unix=history[-1].time_unix + 1) is None, "only this attempt's record"


def test_the_programs_own_code_wins_over_torchruns_and_exit_2_is_final():
    history = [rec(2, "ConfigError: run 'r' has a checkpoint that does not fit", t=5)]
    assert program_code(1, history, since_unix=4) == 2, "torchrun says 1 for any worker failure"
    assert program_code(0, history, since_unix=4) == 0 and program_code(1, history, since_unix=6) == 1
    assert final_failure(history, 4, 1).startswith("bad input (exit 2): ConfigError: run 'r' has a checkpoint")
    assert final_failure([rec(1, t=5)], 4, 1) is None


CRASHES = '''
import os, sys
import torch
from thrifty import session

sess = session.init(total_steps=20)
step, state = sess.load_latest() or (0, None)
while step < 20:
    step += 1
    if step == 7 and not os.path.exists(sys.argv[1]):
        if sys.argv[2] == "once":
            open(sys.argv[1], "w").close()  # a one-off: the next attempt gets past it
        raise RuntimeError("the batch at step 7 is broken")
    sess.log(step, loss=1.0 / step)
    stop = sess.should_stop()
    if stop or sess.should_save(step) or step == 20:
        sess.save({"w": torch.tensor(float(step))}, step)
    if stop:
        break
'''


def crash_config(tmp_path: Path, name: str, how: str):
    script = tmp_path / "crashes.py"
    script.write_text(CRASHES)
    return build_config({"run_name": name, "recipe": "script", "store": str(tmp_path / "store"),
                         "recipe_params": {"command": f"python {script} {tmp_path / (name + '.passed')} {how}"},
                         "train": {"checkpoint_every": 5, "log_every": 1},
                         "compute": {"launcher": "local", "max_restarts": 3}})


@pytest.mark.slow
def test_the_local_launcher_stops_a_failure_that_repeats_and_retries_a_one_off(tmp_path, monkeypatch):
    monkeypatch.setenv("PYTHONPATH", str(REPO))
    launcher = LocalLauncher()
    same = crash_config(tmp_path, "same", "always")
    status = launcher.wait(launcher.submit(same), timeout=300)
    assert status.state is JobState.FAILED
    assert [a.end_reason for a in status.attempts] == ["failed", "failed"], "2 attempts, not 1 + max_restarts (3)"
    assert "not restarted: this attempt failed the same way as the one before it" in status.message
    assert "RuntimeError: the batch at step 7 is broken (newest checkpoint step 5)" in status.message
    exits = read_exits(open_store(same.store), "same", status.job_id)
    assert [(r.exit_code, r.checkpoint_step) for r in exits] == [(1, 5), (1, 5)]

    once = crash_config(tmp_path, "once", "once")
    status = launcher.wait(launcher.submit(once), timeout=300)
    assert status.state is JobState.SUCCEEDED, status.message
    assert [a.end_reason for a in status.attempts] == ["failed", "succeeded"]


@pytest.mark.slow
def test_a_skypilot_node_gives_up_a_repeated_failure_and_the_watcher_reports_it(tmp_path):
    """The task's real ``run:`` script (the notice wrapper around torchrun, CPU), twice, as SkyPilot's restart would
    run it: the first failure exits non-zero (SkyPilot restarts it), the same failure again exits 0 with the job marked
    given up, and the watch loop's outcome says failed, not succeeded."""
    from tasks.launch import outcome
    from thrifty.launchers.skypilot import RUN_SINGLE, VENV

    activate = Path(sys.executable).parent / "activate"
    if not activate.is_file():
        pytest.skip("needs the project's venv (its bin/activate) to stand in for the node's")
    home = tmp_path / "home"
    venv_bin = home / VENV.removeprefix("~/") / "bin"
    venv_bin.mkdir(parents=True)
    (venv_bin / "activate").symlink_to(activate)
    cfg = crash_config(tmp_path, "node", "always")
    env = {**python_env(), "HOME": str(home), "THRIFTY_RUN_CONFIG": cfg.to_env_json(), "THRIFTY_RUN_ID": "node",
           "SKYPILOT_MANAGED_JOB_ID": "9", "SKYPILOT_NUM_GPUS_PER_NODE": "1"}

    codes = []
    for _ in range(2):
        started = time.time()
        node = subprocess.run(["bash", "-c", RUN_SINGLE], env=env, cwd=tmp_path, capture_output=True, text=True,
                              timeout=180)
        codes.append(node.returncode)
        assert "the batch at step 7 is broken" in node.stderr, node.stderr[-3000:]
    assert codes == [1, 0], "restarted once; the same failure again ends the job"
    store = open_store(cfg.store)
    assert "failed the same way" in (given_up(store, "node", "sky-9") or "")

    finished = JobStatus("sky-9", JobState.SUCCEEDED, [Attempt("sky-9", 1, "aws", "us-east-1", "g5.xlarge", True, 1.0,
                                                                1, started, started + 1, "succeeded", 0)])
    ended = outcome(cfg, store, finished, [], started - 60, stopped_at_cap=False, reattached=False)
    assert ended.end == "failed" and "not restarted" in ended.message and "step 7 is broken" in ended.message


@pytest.mark.slow
def test_exit_2_through_torchrun_is_never_restarted_on_a_node(tmp_path):
    from thrifty.launchers.skypilot import RUN_SINGLE, VENV

    activate = Path(sys.executable).parent / "activate"
    if not activate.is_file():
        pytest.skip("needs the project's venv (its bin/activate) to stand in for the node's")
    home = tmp_path / "home"
    venv_bin = home / VENV.removeprefix("~/") / "bin"
    venv_bin.mkdir(parents=True)
    (venv_bin / "activate").symlink_to(activate)
    script = tmp_path / "never_saves.py"  # the session's verdict: exit 2 (it would pay for its steps again)
    script.write_text("from thrifty import session\nsess = session.init(total_steps=3)\n"
                      "for s in range(1, 4):\n    sess.log(s, loss=1.0)\n")
    cfg = build_config({"run_name": "bad", "recipe": "script", "store": str(tmp_path / "store"),
                        "recipe_params": {"command": f"python {script}"}})
    env = {**python_env(), "HOME": str(home), "THRIFTY_RUN_CONFIG": cfg.to_env_json(), "THRIFTY_RUN_ID": "bad",
           "SKYPILOT_MANAGED_JOB_ID": "4", "SKYPILOT_NUM_GPUS_PER_NODE": "1"}
    node = subprocess.run(["bash", "-c", RUN_SINGLE], env=env, cwd=tmp_path, capture_output=True, text=True,
                          timeout=180)
    assert node.returncode == 0, node.stderr[-3000:]
    why = given_up(open_store(cfg.store), "bad", "sky-4") or ""
    assert why.startswith("bad input (exit 2)") and "without a single sess.save" in why
    assert json.loads((tmp_path / "store" / "runs" / "bad" / "exits" / "sky-4" / "given-up.json").read_text())[
        "exit_code"] == 2
