"""A job that finished while no flow watched it (issue 21.8): the next look at the run says so and closes its row.

The issue's case: worker and flow SIGKILLed while the job finished training; Prefect said "Crashed ... run it again
to resume" and the ledger row stayed open. Here the flow process of `thrifty run` is killed as soon as its job's
first attempt is in the ledger (the node is still starting: it cannot have trained yet), the job trains to its end
alone, and then a rerun of the same run and `thrifty report` find it finished, close its ledger row with what the
node recorded, and say so.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest
import yaml

from conftest import REPO
from test_money import THRIFTY, cli_env, thrifty, wait_for
from thrifty.money.budget import spend_usd
from thrifty.money.ledger import ledger_rows, read_attempts, read_meters
from thrifty.numbers import amount
from thrifty.storage import open_store

pytestmark = pytest.mark.slow


def test_a_job_that_finished_unwatched_is_found_finished_and_its_row_closed(prefect_harness, tmp_path):
    store_dir = tmp_path / "store"
    cfg = tmp_path / "unwatched.yaml"
    cfg.write_text(yaml.safe_dump({
        "run_name": "unwatched", "recipe": "digits", "store": str(store_dir),
        "recipe_params": {"hidden": 32, "limit": 400},
        "train": {"max_epochs": 3, "micro_batch": 16, "checkpoint_every": 10, "early_stopping": {"enabled": False}},
        "compute": {"emulate": "aws:g5.xlarge"},
    }))
    ledger = store_dir / "runs" / "unwatched" / "ledger"
    first = subprocess.Popen([*THRIFTY, "run", "--config", str(cfg)], env=cli_env(), cwd=REPO,
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        wait_for(lambda: ledger.is_dir() and ledger_rows(open_store(str(store_dir)), "unwatched"), 240,
                 "the job's first attempt")
        os.killpg(first.pid, signal.SIGKILL)  # the flow and its watch loop; the job lives on, alone
        first.wait(timeout=30)
    finally:
        if first.poll() is None:
            os.killpg(first.pid, signal.SIGKILL)
    store = open_store(str(store_dir))
    [row] = ledger_rows(store, "unwatched")
    assert row.ended_unix is None, "the watcher died before its job ended: its row is open"

    wait_for(lambda: any(m.end for m in read_meters(store, "unwatched")), 240, "the job to finish alone")
    [meter] = read_meters(store, "unwatched")
    assert meter.end == "finished"
    assert json.loads((store_dir / "runs" / "unwatched" / "summary.json").read_text())["status"] == "completed"
    time.sleep(0.5)  # the node process exits after its last record

    again = thrifty("run", "--config", str(cfg))
    out = again.stdout + again.stderr
    assert again.returncode == 0, out
    assert "finished training" in out and "while no flow run watched it" in out and "closed now" in out, out
    assert "already finished training" in out  # and nothing is launched again
    [closed] = ledger_rows(store, "unwatched")  # the job's ledger file itself, not only what reports compute
    assert closed.end_reason == "succeeded" and closed.ended_unix == pytest.approx(meter.ended_unix)
    spent = spend_usd(read_attempts(store, "unwatched"))
    assert spent == pytest.approx(closed.cost_usd())

    report = thrifty("report", "--config", str(cfg))
    assert report.returncode == 0, report.stderr
    row_line = next(line for line in report.stdout.splitlines() if "unwatched" in line)
    assert "completed" in row_line and amount(spent) in row_line
    assert "closed now" not in report.stderr  # said once, by the look that closed it
    assert Path(ledger / f"{closed.job_id}.jsonl").read_text().count("\n") == 1
