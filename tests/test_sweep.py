"""The hyperparameter search under a budget: the space (seeded draws, validation), the ASHA scheduler on scripted
results, the cap arithmetic with trials in flight, a rung's end in the real training loop, and the thrifty-sweep
flow end to end on digits (a learning rate far too small loses; a cap that forces pruning; a killed search resumed)."""

from __future__ import annotations

import asyncio
import json
import math
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import REPO, python_env
from thrifty.config import ConfigError, build_config
from thrifty.sweep import SweepConfig, TrialState, best_trial, build_sweep, next_job, settle
from thrifty.sweep.caps import Need, committed_usd, need_for, refusal

BASE = {"recipe": "digits", "train": {"max_epochs": 9}}


def sweep(**kw) -> SweepConfig:
    return build_sweep({"name": "s", "base": BASE, "space": {"train.lr": {"log_uniform": [1e-4, 1e-2]}}, **kw})


# ---------------------------------------------------------------- the space


def test_draws_are_seeded_in_range_and_independent_of_max_trials():
    space = {"train.lr": {"log_uniform": [1e-5, 1e-1]}, "train.weight_decay": {"uniform": [0.0, 0.1]},
             "train.seed": {"int": [3, 5]}, "recipe_params.hidden": {"choice": [32, 64, 128]}}
    a = sweep(space=space, max_trials=40, seed=7)
    b = sweep(space=space, max_trials=5, seed=7)
    c = sweep(space=space, max_trials=5, seed=8)
    draws = [a.values(i) for i in range(40)]
    assert [b.values(i) for i in range(5)] == draws[:5], "trial i is the same point whatever max_trials is"
    assert [c.values(i) for i in range(5)] != draws[:5], "another seed, other trials"
    assert all(1e-5 <= d["train.lr"] <= 1e-1 and 0.0 <= d["train.weight_decay"] <= 0.1 for d in draws)
    assert {d["train.seed"] for d in draws} == {3, 4, 5}, "int bounds are both included"
    assert {d["recipe_params.hidden"] for d in draws} == {32, 64, 128}
    logs = [math.log10(d["train.lr"]) for d in draws]
    assert min(logs) < -3.5 and max(logs) > -1.5, "log-uniform spreads over the decades"
    trial = a.trial(3, stop_at_epoch=3, max_usd=0.5)
    assert trial.run_name == "s-t003" and trial.train.lr == draws[3]["train.lr"]
    assert trial.recipe_params["hidden"] == draws[3]["recipe_params.hidden"]
    assert (trial.train.max_epochs, trial.train.stop_at_epoch, trial.budget.max_usd) == (9, 3, 0.5)
    assert a.trial(3, stop_at_epoch=9).train.stop_at_epoch is None, "the last rung trains to the end"
    assert a.rungs() == [1, 3, 9] and sweep(min_epochs=2, eta=2, max_epochs=9).rungs() == [2, 4, 8, 9]
    # shape: the lr does not change the model, the hidden size does (one smoke test per distinct shape)
    same = sweep(space={"train.lr": {"choice": [1e-3, 1e-2]}}, max_trials=6)
    assert len({same.shape_key(i) for i in range(6)}) == 1
    assert len({a.shape_key(i) for i in range(40)}) == 3


@pytest.mark.parametrize("space, extra, match", [
    ({"train.lrr": {"uniform": [0.1, 1]}}, {}, "did you mean 'train.lr'"),
    ({"train.early_stoping.patience": {"int": [1, 3]}}, {}, "did you mean 'train.early_stopping.patience'"),
    ({"compute.use_spot": {"choice": [True, False]}}, {}, "not a setting a trial can vary"),
    ({"train.max_epochs": {"int": [1, 3]}}, {}, "the search's own"),
    ({"train.lr": {"log_uniform": [0.0, 0.1]}}, {}, "log_uniform needs lo > 0"),
    ({"train.lr": {"uniform": [0.1, 0.01]}}, {}, "lo > hi; write it as"),
    ({"train.lr": {"beta": [1, 2]}}, {}, r"must be one of \{choice"),
    ({"train.lr": {"uniform": [-0.01, 0.01]}}, {"max_trials": 8}, r"trial \d .*train.lr.*greater than 0"),
    ({"train.micro_batch": {"choice": [0, 32]}}, {"max_trials": 8}, "micro_batch"),
    ({"train.lr": {"choice": [0.1]}}, {"min_epochs": 10}, "min_epochs 10 is more than max_epochs 9"),
    ({"train.lr": {"choice": [0.1]}}, {"metric": "val_accuracy"}, "set mode to max"),
    ({}, {}, "space is empty"),
])
def test_bad_sweeps_fail_before_anything_runs_naming_the_fix(space, extra, match):
    with pytest.raises(ConfigError, match=match):
        build_sweep({"name": "s", "base": BASE, "space": space, **extra})


def test_stop_at_epoch_is_a_pause_not_a_new_training():
    cfg = build_config({"train": {"max_epochs": 9}})
    paused = cfg.updated({"train": {**cfg.train.model_dump(mode="json"), "stop_at_epoch": 3}})
    assert paused.training_fingerprint() == cfg.training_fingerprint(), "a finished run is finished at any rung"
    assert paused.train.job_steps(1000, 1) == 3 * (1000 // 64) and cfg.train.job_steps(1000, 1) == 9 * (1000 // 64)
    with pytest.raises(ConfigError, match="stop_at_epoch 10 is past max_epochs 9"):
        build_config({"train": {"max_epochs": 9, "stop_at_epoch": 10}})


# ---------------------------------------------------------------- the scheduler


def trials(n: int) -> list[TrialState]:
    return [TrialState(index=i, run_name=f"s-t{i:03d}", values={}) for i in range(n)]


def finish(t: TrialState, epochs: int, value: float) -> None:
    t.status, t.reached, t.target = "paused", epochs, None
    t.metrics[epochs] = value


def test_asha_promotes_the_top_third_as_results_come_and_prunes_at_a_closed_rung():
    rungs, eta = [1, 3, 9], 3
    ts = trials(9)
    assert next_job(ts, rungs, eta, "min") == (0, 1), "new trials start at the first rung, in index order"
    losses = [0.9, 0.5, 0.7, 0.2, 0.8, 0.6, 0.4, 0.3, 1.0]
    for i in range(2):
        finish(ts[i], 1, losses[i])
    assert next_job(ts, rungs, eta, "min") == (2, 1), "2 results: floor(2/3) = 0 promoted yet"
    finish(ts[2], 1, losses[2])
    assert next_job(ts, rungs, eta, "min") == (1, 3), "3 results: the best (t1, 0.5) goes on before any new trial"
    ts[1].status = "running"
    for i in range(3, 9):
        finish(ts[i], 1, losses[i])
    # 9 at rung 1: top 3 are t3 (0.2), t7 (0.3), t6 (0.4); t1 is running already
    assert next_job(ts, rungs, eta, "min") == (3, 3)
    ts[3].status = "running"
    assert next_job(ts, rungs, eta, "min") == (7, 3)
    ts[7].status = "running"
    # rung 1 is closed now (every trial reached it): its top 3 go on, and t6 (0.4) is one of them, although t1
    # (fourth) was promoted early: ASHA's early promotions are never taken back
    assert next_job(ts, rungs, eta, "min") == (6, 3)
    ts[6].status = "running"
    assert next_job(ts, rungs, eta, "min") is None
    said = settle(ts, rungs, eta, "min")
    assert sorted(t.index for t in ts if t.status == "pruned") == [0, 2, 4, 5, 8] and len(said) == 5
    assert "pruned at epoch 1: not in the top 3 of 9" in ts[0].note
    for i, v in ((1, 0.30), (3, 0.10), (7, 0.20), (6, 0.25)):
        finish(ts[i], 3, v)
    assert next_job(ts, rungs, eta, "min") == (3, 9), "rung 3 closed with 4: max(1, 4 // 3) = 1 goes on: t3"
    assert next_job(ts, rungs, eta, "max") == (1, 9), "higher is better: the worst loss would win"
    ts[3].status = "running"
    assert next_job(ts, rungs, eta, "min") is None
    settle(ts, rungs, eta, "min")
    assert {t.index for t in ts if t.status == "pruned"} == {0, 1, 2, 4, 5, 6, 7, 8}
    ts[3].status, ts[3].reached, ts[3].metrics[9] = "finished", 9, 0.05
    assert best_trial(ts, "min").index == 3


def test_a_killed_job_resumes_first_and_failures_never_rank():
    rungs = [1, 3, 9]
    ts = trials(3)
    finish(ts[0], 1, float("nan"))  # diverged: no finite metric
    ts[0].status = "failed"
    finish(ts[1], 1, 0.4)
    ts[2].status, ts[2].reached, ts[2].target = "paused", 1, 3  # was training to epoch 3 when the search died
    ts[2].metrics[1] = 0.9
    assert next_job(ts, rungs, 3, "min") == (2, 3), "the interrupted job goes first, whatever its rank"
    assert best_trial(ts, "min").index == 1


# ---------------------------------------------------------------- the caps


def test_the_caps_never_launch_what_the_rest_cannot_cover():
    need = need_for(estimate_usd=0.10, estimate_hours=0.5, reserve_usd=0.02, gpus=1, factor=1.5, epochs=3)
    assert need.usd == pytest.approx(0.17) and need.hours == pytest.approx(0.75)
    measured = need_for(0.10, 0.5, 0.02, 1, 1.5, 3, measured_usd_per_epoch=0.05, measured_hours_per_epoch=0.1)
    assert measured.usd == pytest.approx(1.5 * 0.15 + 0.02) and "measured" in measured.why
    ts = trials(3)
    ts[0].spent_usd = 0.50  # ended
    ts[1].status, ts[1].spent_usd, ts[1].cap_usd = "running", 0.05, 0.30  # in flight: may reach its cap
    assert committed_usd(ts) == pytest.approx(0.80)
    assert refusal(Need(0.19, 0, 0, ""), ts, 1.0, None, None, 0.0) is None
    why = refusal(Need(0.21, 0, 0, "x"), ts, 1.0, None, None, 0.0)
    assert why and "cannot cover" in why and "$0.20000 of max_usd $1 left" in why
    ts[1].gpu_hours, ts[1].cap_gpu_hours = 0.1, 0.5
    assert "GPU-hours" in refusal(Need(0.01, 0.6, 0, ""), ts, 1.0, 1.0, None, 0.0)
    assert "deadline" in refusal(Need(0.01, 0, 1.0, ""), ts, 1.0, None, 3000.0, 0.0)
    assert refusal(Need(0.01, 0, 0.5, ""), ts, 1.0, None, 3600.0, 0.0) is None


def test_spend_stays_under_the_cap_with_concurrent_trials_reserving():
    """A randomised search: launches reserve caps, jobs spend anything up to their cap (the run's own cap holds),
    results come back in any order; the search's spend never passes max_usd."""
    rng = random.Random(0)
    for trial_run in range(200):
        max_usd, ts, flying = rng.uniform(0.5, 5.0), trials(12), []
        for step in range(60):
            t = rng.choice(ts)
            if t.status != "running" and rng.random() < 0.6:
                need = Need(rng.uniform(0.05, 1.0), 0.0, 0.0, "")
                if refusal(need, ts, max_usd, None, None, 0.0) is None:
                    t.status, t.cap_usd = "running", t.spent_usd + need.usd
                    flying.append(t)
            elif flying:
                done = flying.pop(rng.randrange(len(flying)))
                done.spent_usd += rng.uniform(0.0, done.cap_usd - done.spent_usd)  # never past its own cap
                done.status, done.cap_usd = "paused", None
            assert committed_usd(ts) <= max_usd + 1e-12
        for t in flying:
            t.spent_usd = t.cap_usd  # the worst case: each ends exactly at its cap
        assert sum(t.spent_usd for t in ts) <= max_usd + 1e-12


# ---------------------------------------------------------------- a rung's end in the real training loop


def test_rungs_continue_the_same_schedule_bit_exact(tmp_path, caplog):
    """A run trained to epoch 1, then to 2, then to its end ends with the very weights of one trained straight
    through: the LR schedule runs to max_epochs all along. A rung's end is no finish, and no 'changed setting'."""
    from thrifty.runs import read_metrics, read_summary
    from thrifty.storage import open_store
    from training.loop import train

    base = {"recipe": "digits", "store": str(tmp_path / "store"), "recipe_params": {"limit": 400, "dropout": 0.1},
            "train": {"max_epochs": 3, "micro_batch": 32, "precision": "fp32", "checkpoint_every": 5,
                      "early_stopping": {"patience": 50}}}
    straight = train(build_config({**base, "run_name": "straight"}))
    rung = {**base, "run_name": "rungs"}
    first = train(build_config({**rung, "train": {**base["train"], "stop_at_epoch": 1}}))
    store = open_store(base["store"])
    assert first.status == "rung" and read_summary(store, "rungs") is None, "a rung's end is not a finish"
    caplog.set_level("WARNING", logger="thrifty.train")
    second = train(build_config({**rung, "train": {**base["train"], "stop_at_epoch": 2}}))
    last = train(build_config(rung))
    assert "changed settings" not in caplog.text, "only the rung moved: no warning about a changed setting"
    assert second.status == "rung" and last.status == "completed"
    assert last.summary.weights_sha256 == straight.summary.weights_sha256
    assert last.summary.resumes == 2 and last.summary.steps == straight.summary.steps
    rungs = [r for r in read_metrics(store, "rungs") if r.get("event") == "rung"]
    assert [(r["epoch"], r["step"]) for r in rungs] == [(1, first.step), (2, second.step)]
    assert second.step == 2 * first.step and all("val_loss" in r for r in rungs)
    evals = {r["step"]: r["val_loss"] for r in read_metrics(store, "straight") if r.get("event") == "eval"}
    assert [r["val_loss"] for r in rungs] == [evals[first.step], evals[second.step]], \
        "the metric at a rung is the one the uninterrupted run measured there"
