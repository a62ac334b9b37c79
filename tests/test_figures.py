"""What a run saved, said the same way everywhere: the headline compares the same work done the naive way, early
stopping is a line of its own, an unmeasured lever says "assumed" with its factor, a sweep's "trained to the end"
counts every trial it drew, and one run's figures agree with its ledger on every surface that shows them."""

from __future__ import annotations

import asyncio
import base64
import json
import re
from pathlib import Path

import pytest

from thrifty.money import savings
from thrifty.money.ledger import Attempt
from thrifty.report import figures
from thrifty.runs import BestMetric, RunSummary

T0 = 1_800_000_000.0


def summary(steps: int, total_steps: int, epochs: float, stopped_early: bool, precision: str = "fp32",
            device: str = "cpu") -> RunSummary:
    return RunSummary(run_id="r", recipe="digits", status="stopped_early" if stopped_early else "completed",
                      steps=steps, total_steps=total_steps, epochs=epochs, stopped_early=stopped_early,
                      best_metric=BestMetric(name="val_loss", value=0.1, step=steps, checkpoint_step=steps),
                      wall_time_s=100.0, data_wait_fraction=0.0, checkpoint_time_fraction=0.0, checkpoints_written=1,
                      resumes=0, precision=precision, device=device, world_size=1, cache_key="k",
                      weights_sha256="0" * 64)


def one_hour_of_g5() -> list[Attempt]:  # g5.xlarge spot: $0.302/h, on-demand $1.006/h
    return [Attempt("j", 1, "aws", "us-east-1", "g5.xlarge", True, 0.302, 1, T0, T0 + 3600, "succeeded", 0)]


def test_early_stopping_is_its_own_line_and_never_inflates_the_headline():
    """A user typed 2000 epochs and early stopping ended the run after 10: the headline compares the 10 epochs it
    trained, the same either way; the 1990 it skipped are a line of their own, at this run's rate."""
    stopped = savings.breakdown("r", one_hour_of_g5(), summary(100, 20_000, 10.0, True), False, 0.0, [])
    planned_ten = savings.breakdown("r", one_hour_of_g5(), summary(100, 100, 10.0, False), False, 0.0, [])
    assert stopped.naive_usd == planned_ten.naive_usd == pytest.approx(1.006, abs=1e-6)
    assert stopped.saved_fraction == planned_ten.saved_fraction == pytest.approx(1 - 0.302 / 1.006, abs=1e-4)
    assert "early_stopping" not in stopped.levers_usd
    line = figures.early_stop_line(stopped)
    assert line == "stopped 1990 epochs before max_epochs; at this run's rate that is $60.09800 not spent"
    assert stopped.early_stop.usd == pytest.approx(0.302 / 100 * 19_900)
    assert figures.early_stop_line(planned_ten) is None
    assert "saved $0.70400 (70%)" in figures.headline(stopped)


def test_an_unmeasured_lever_says_assumed_with_its_factor_wherever_it_is_shown(tmp_path, capsys):
    """bf16 on a GPU: the precision saving comes from an assumed fp32 slowdown, not a measurement."""
    from tasks.report import render_summary, savings_rows
    from thrifty.cli import main
    from thrifty.money.ledger import write_job_attempts
    from thrifty.storage import open_store

    figs = savings.breakdown("r", one_hour_of_g5(), summary(100, 100, 10.0, False, "bf16", "cuda"), False, 0.0, [])
    assert figs.lever_basis["precision"].startswith("assumed: fp32 2x slower than bf16")
    assert figs.levers_usd["precision"] == pytest.approx(1.006)
    for shown in (figures.headline(figs), render_summary("r", None, None, None, None, figs, one_hour_of_g5()),
                  savings_rows([figs])[0]["assumed"]):
        assert "precision assumed: fp32 2x slower" in shown or "| precision | 1.00600 | assumed: fp32 2x" in shown
    store = open_store(str(tmp_path / "store"))
    write_job_attempts(store, "r", "j", one_hour_of_g5())
    savings.write(store, figs)
    assert main(["report", "--set", f"store={tmp_path / 'store'}"]) == 0
    printed = capsys.readouterr().out
    assert "precision assumed: fp32 2x slower than bf16 on a GPU (not measured) (runs r)" in printed
    measured = savings.breakdown("r", one_hour_of_g5(), summary(100, 100, 10.0, False), False, 0.0, [])
    assert figures.assumed(measured) == {} and "assumed" not in figures.headline(measured)


def test_a_sweeps_trained_to_the_end_counts_every_trial_it_drew():
    """Paused, refused and never-run trials are trained to the end the naive way too: at their own measured cost
    per epoch, or their trials' typical one when they never measured it."""
    from thrifty.sweep import TrialState
    from thrifty.sweep.report import saving

    def trial(i: int, status: str, reached: int, spent: float, epoch_usd: float) -> TrialState:
        return TrialState(index=i, run_name=f"s-t{i:03d}", values={}, status=status, reached=reached,
                          spent_usd=spent, epoch_usd=epoch_usd)

    trials = [trial(0, "finished", 9, 0.90, 0.10), trial(1, "pruned", 1, 0.12, 0.10),
              trial(2, "paused", 3, 0.35, 0.12), trial(3, "out_of_budget", 0, 0.0, 0.0),
              trial(4, "paused", 0, 0.02, 0.0)]  # stopped by its cap before its first epoch: spent, measured nothing
    money = saving(trials, 9)
    assert money.trials == 5
    typical = 0.10  # the median of the measured 0.10, 0.10, 0.12
    assert money.full_usd == pytest.approx(0.90 + (0.12 + 8 * 0.10) + (0.35 + 6 * 0.12) + 9 * typical
                                           + (0.02 + 9 * typical))
    assert money.spent_usd == pytest.approx(1.39)
