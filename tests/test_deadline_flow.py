"""A run with a deadline through the real flow and the local launcher: its emulated spot goes away, the watch loop
moves it to on-demand, back to spot once ahead, and it finishes before the deadline, every attempt in the ledger and
its spend under the cap.

Speed-independent: the node trains at a fixed pace (``THRIFTY_MIN_STEP_S``, one step per 50 ms whatever the
machine), the availability trace is in seconds from the run's first job, and the outage is long enough that every
path through it (a fast or a slow start-up, a first move back that finds spot still gone) ends the same way.
"""

from __future__ import annotations


import pytest

from flows.train_pipeline import train_pipeline
from thrifty.config import build_config
from thrifty.money.ledger import read_attempts
from thrifty.spot.deadline_run import read_record
from thrifty.storage import open_store
from conftest import latest_artifacts

pytestmark = pytest.mark.slow

PACE_S = 0.05  # seconds per optimizer step on the node
STEPS = 600  # 30 s of training
DEADLINE_S = 150.0
OUTAGE = (8, 40)  # spot capacity gone from the 8th to the 40th second of the run, back after


def test_spot_goes_away_the_run_moves_to_on_demand_and_back_and_meets_its_deadline(prefect_harness, tmp_path,
                                                                                   monkeypatch, caplog):
    monkeypatch.setenv("THRIFTY_MIN_STEP_S", str(PACE_S))
    store = tmp_path / "store"
    trace = [1] * OUTAGE[0] + [0] * (OUTAGE[1] - OUTAGE[0]) + [1]
    cfg = build_config({
        "run_name": "deadline", "recipe": "digits", "store": str(store),
        "train": {"max_epochs": 40, "max_steps": STEPS, "micro_batch": 32, "precision": "fp32",
                  "checkpoint_every": 50, "log_every": 10, "early_stopping": {"enabled": False}},
        "compute": {"emulate": "aws:p3.2xlarge", "deadline_h": DEADLINE_S / 3600, "deadline_changeover_s": 5,
                    "deadline_hysteresis_s": 3, "preempt_grace_s": 20,
                    "spot_trace": {"metadata": {"gap_seconds": 1}, "data": trace}},
        "budget": {"max_usd": 0.5},
    })
    out = train_pipeline(cfg, poll_s=0.5)

    assert out.job.end == "succeeded" and out.summary.steps == STEPS
    s = open_store(str(store))
    record = read_record(s, "deadline")
    moves = [(m.from_market, m.to_market) for m in record.moves]
    assert ("spot", "on_demand") in moves and ("on_demand", "spot") in moves, moves
    attempts = read_attempts(s, "deadline")
    finished = max(a.ended_unix for a in attempts if a.end_reason == "succeeded")
    assert finished <= record.deadline_unix, f"finished {finished - record.deadline_unix:.1f} s late"
    # every job's attempts are in the ledger, with its market: spot, then on-demand, then spot again
    jobs = {j.job_id: j.market for j in record.jobs}
    assert {a.job_id for a in attempts} <= set(jobs) and len(jobs) == len(record.moves) + 1
    assert all(a.spot == (jobs[a.job_id] == "spot") and a.ended_unix for a in attempts)
    assert {(a.spot, a.usd_per_hour) for a in attempts} == {(True, 0.918), (False, 3.06)}  # p3.2xlarge, each market
    markets = [a.spot for a in attempts]
    assert markets[0] and not all(markets) and markets[-1], markets
    assert out.job.run_spend_usd <= cfg.budget.max_usd
    assert any(a.end_reason == "preempted" for a in attempts), "the outage preempted the first spot attempt"
    logged = caplog.text  # the flow run's log: each move, and every job's attempts (each starts at 1)
    assert "deadline: run deadline: spot -> on-demand" in logged and "deadline: run deadline: on-demand -> spot" in logged
    assert "attempt 1 ended: preempted" in logged and "attempt 1 ended: cancelled" in logged
    assert "attempt 1 ended: succeeded" in logged
    summary = latest_artifacts("thrifty-summary-deadline")["thrifty-summary-deadline"].data  # the report: each market, the deadline met
    assert "| markets | spot " in summary and " on-demand " in summary
    assert "| deadline | 2.5 min (uniform_progress): finished in" in summary and "before it; moves: spot -> on-demand" in summary


