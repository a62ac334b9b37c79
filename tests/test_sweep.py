"""The hyperparameter search under a budget: the space (seeded draws, validation), the ASHA scheduler on scripted
results, the cap arithmetic with trials in flight, a rung's end in the real training loop, and the thrifty-sweep
flow end to end on digits (a learning rate far too small loses; a cap that forces pruning; a killed search resumed)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import os
import random
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import REPO, latest_artifacts, python_env
from thrifty.config import ConfigError, build_config
from thrifty.sweep import SweepConfig, TrialState, best_trial, build_sweep, leader, next_job, settle
from thrifty.sweep.scheduler import rung_closed
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
    ({"train.lr": {"choice": [0.1]}}, {"name": "a/b"}, "'name' must be 1-58 letters"),
])
def test_bad_sweeps_fail_before_anything_runs_naming_the_fix(space, extra, match):
    with pytest.raises(ConfigError, match=match):
        build_sweep({"name": "s", "base": BASE, "space": space, **extra})


def test_a_run_config_built_in_python_is_a_base():
    from thrifty.sweep.config import SweepConfig

    base = build_config({"run_name": "x", "train": {"max_epochs": 9, "lr": 0.01}})
    cfg = SweepConfig(name="py", base=base, space={"train.lr": {"choice": [1e-3]}})
    assert cfg.base == base and cfg.base.train.max_epochs == 9


def test_stop_at_epoch_is_a_pause_not_a_new_training():
    cfg = build_config({"train": {"max_epochs": 9}})
    paused = cfg.updated({"train": {**cfg.train.model_dump(mode="json"), "stop_at_epoch": 3}})
    assert paused.training_fingerprint() == cfg.training_fingerprint(), "a finished run is finished at any rung"
    assert paused.train.job_steps(1000, 1) == 3 * (1000 // 64) and cfg.train.job_steps(1000, 1) == 9 * (1000 // 64)
    with pytest.raises(ConfigError, match="stop_at_epoch 10 is past max_epochs 9"):
        build_config({"train": {"max_epochs": 9, "stop_at_epoch": 10}})


@pytest.mark.parametrize("extra, match", [
    ({"space": {"recipe_params.hiden": {"choice": [64, 128]}}}, "hiden.*not an option of this recipe"),
    ({"metric": "val_f1", "mode": "max"}, "reports val_loss, val_accuracy, not 'val_f1'"),
])
def test_the_cli_refuses_a_bad_recipe_option_or_metric_with_exit_2(tmp_path, extra, match):
    config = tmp_path / "sweep.json"
    config.write_text(json.dumps({"name": "bad", "base": {**BASE, "store": str(tmp_path / "store")},
                                  "space": {"train.lr": {"choice": [1e-3]}}, **extra}))
    proc = subprocess.run([sys.executable, "-m", "thrifty.cli", "sweep", "--config", str(config)], cwd=REPO,
                          env=python_env(), capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2, proc.stderr
    assert re.search(match, proc.stderr.replace("\n", " ")), proc.stderr
    assert not (tmp_path / "store").exists(), "nothing written, nothing launched"


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
    assert rung_closed(ts, rungs, 0) and settle(ts, rungs, 3, "min") == [] and ts[2].status == "paused", \
        "rung 1 closed with t1 ahead: t2's promotion still stands (a killed search decides as one not killed)"
    ts[1].status = "paused"
    assert settle(ts, rungs, 3, "min") == [] and ts[1].status == "paused", "the top of a closed rung is kept"
    assert best_trial(ts, "min") is None, "none trained to its end: no best (the README's rule)"
    assert leader(ts, "min").index == 1
    ts[2].status, ts[2].reached, ts[2].metrics[9] = "finished", 9, 0.9
    assert best_trial(ts, "min").index == 2, "only a trial trained to its end is the best, however t1 ranks"


# ---------------------------------------------------------------- the caps


def test_a_relaunch_after_its_cap_stopped_it_gets_twice_what_the_stopped_jobs_spent():
    """Faster siblings measured the epoch; a loaded machine's start-up outran it and the cap stopped the job before
    its first checkpoint (CI: three such stops failed a trial). Its relaunch repeats that work, so it is given at
    least twice what the stopped jobs spent on this milestone, plus the reserve, and time in proportion."""
    doubled = need_for(0.001, 0.01, 0.0005, gpus=2, factor=3.0, epochs=1)  # once stopped: 1.5 x 2 headroom
    assert doubled.usd == pytest.approx(0.0035) and "raised" not in doubled.why
    after = need_for(0.001, 0.01, 0.0005, gpus=2, factor=3.0, epochs=1, stopped_usd=0.004)
    assert after.usd == pytest.approx(0.0085) and "raised to $0.0085: twice the $0.004" in after.why
    assert after.hours == pytest.approx(0.03 * 0.008 / 0.003) and after.gpu_hours == pytest.approx(2 * after.hours)
    assert need_for(0.001, 0.01, 0.0005, 2, 3.0, 1, stopped_usd=0.001) == doubled, "below the headroom: no raise"


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
    assert why and "cannot cover" in why and "$0.20 of max_usd $1 left" in why
    ts[1].gpu_hours, ts[1].cap_gpu_hours = 0.1, 0.5
    assert "GPU-hours" in refusal(Need(0.01, 0.6, 0, ""), ts, 1.0, 1.0, None, 0.0)
    assert "deadline" in refusal(Need(0.01, 0, 1.0, ""), ts, 1.0, None, 3000.0, 0.0)
    assert refusal(Need(0.01, 0, 0.5, ""), ts, 1.0, None, 3600.0, 0.0) is None
    ts[2].status, ts[2].spent_usd, ts[2].cap_usd = "paused", 0.01, 0.15  # a killed search's job, still training
    assert committed_usd(ts) == pytest.approx(0.95), "an orphan's cap stays committed until its job is seen gone"


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


@pytest.mark.slow
def test_at_the_deadline_a_trial_in_flight_is_stopped_the_graceful_way(prefect_harness, tmp_path, monkeypatch):
    """What the search does when max_wall_h runs out with trials in flight: it asks each trial's watch loop to stop
    its job as its launcher stops one gracefully (the local launcher: SIGTERM, a checkpoint, exit; SkyPilot: the
    stop request and a cancel), so no step is lost, and the run resumes from there."""
    import threading

    from flows.train_pipeline import train_pipeline
    from tasks.launch import request_stop
    from thrifty.config import build_config

    store = tmp_path / "store"
    monkeypatch.setenv("THRIFTY_MIN_STEP_S", "0.01")  # 3,000 steps of at least 10 ms: the stop comes long before the end
    cfg = build_config({"run_name": "deadline", "recipe": "digits", "store": str(store),
                        "recipe_params": {"limit": 600},
                        "train": {"max_epochs": 200, "micro_batch": 32, "precision": "fp32", "checkpoint_every": 50,
                                  "log_every": 1, "early_stopping": {"enabled": False}},
                        "compute": {"emulate": "aws:g5.xlarge"}})
    ended = {}
    flow = threading.Thread(target=lambda: ended.update(state=train_pipeline(config=cfg, poll_s=0.2,
                                                                             return_state=True)))
    flow.start()
    give_up = time.time() + 120
    while max((r.get("step", 0) for r in run_records(store, "deadline") if "loss" in r), default=0) < 30:
        assert flow.is_alive() and time.time() < give_up, "the run never reached step 30"
        time.sleep(0.1)
    request_stop("deadline", "the search's max_wall_h is up")
    flow.join(120)
    state = ended["state"]
    assert not state.is_completed() and "cancelled" in state.message, state.message
    records = run_records(store, "deadline")
    reached = max(r["step"] for r in records if "loss" in r)
    [stopped] = [r for r in records if r.get("event") == "interrupted"]
    assert stopped["reason"] == "signal" and stopped["step"] == reached, stopped
    from thrifty.runs.checkpoints import committed
    from thrifty.storage import open_store
    assert committed(open_store(str(store)), "deadline")[-1].step == reached, "the step it stopped at is saved"


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
    last = train(build_config({**rung, "train": {**base["train"], "async_checkpoint": False}}))  # where writes run
    assert "changed settings" not in caplog.text, "only the rung and the write thread moved: no 'changed setting'"
    assert second.status == "rung" and last.status == "completed"
    assert last.summary.weights_sha256 == straight.summary.weights_sha256
    assert last.summary.resumes == 2 and last.summary.steps == straight.summary.steps
    rungs = [r for r in read_metrics(store, "rungs") if r.get("event") == "rung"]
    assert [(r["epoch"], r["step"]) for r in rungs] == [(1, first.step), (2, second.step)]
    assert second.step == 2 * first.step and all("val_loss" in r for r in rungs)
    evals = {r["step"]: r["val_loss"] for r in read_metrics(store, "straight") if r.get("event") == "eval"}
    assert [r["val_loss"] for r in rungs] == [evals[first.step], evals[second.step]], \
        "the metric at a rung is the one the uninterrupted run measured there"


# ---------------------------------------------------------------- end to end: the flow on digits


def digits_sweep(store: Path, name: str, max_usd: float, **extra) -> SweepConfig:
    """5 trials, lr 1e-6 (far too small) or 3e-3, rungs 1 -> 3 -> 9 epochs, two at a time, on the local launcher."""
    return build_sweep({
        "name": name, "seed": 0, "max_trials": 5, "min_epochs": 1, "eta": 3, "max_epochs": 9, "concurrency": 2,
        "max_usd": max_usd, "space": {"train.lr": {"choice": [1e-6, 3e-3]}, "train.seed": {"int": [0, 999]}},
        "base": {"recipe": "digits", "store": str(store), "recipe_params": {"limit": 600},
                 "train": {"micro_batch": 32, "precision": "fp32", "checkpoint_every": 5, "log_every": 5,
                           "early_stopping": {"patience": 20}},  # the winner trains to epoch 9
                 "compute": {"emulate": "aws:g5.xlarge"}, "budget": {"stop_margin_s": 5}},
        **extra})


def ledger_rows(store: Path, run: str) -> list[dict]:
    from thrifty.money.ledger import read_attempts
    from thrifty.storage import open_store

    return [a.row() for a in read_attempts(open_store(str(store)), run)]


def run_records(store: Path, run: str) -> list[dict]:
    from thrifty.runs import read_metrics
    from thrifty.storage import open_store

    return read_metrics(open_store(str(store)), run)


def saved_state(store: Path, name: str) -> dict:
    path = store / "sweeps" / name / "state.json"
    return json.loads(path.read_text()) if path.exists() else {}


@pytest.fixture(scope="module")
def e2e_store(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("sweep") / "store"


@pytest.mark.slow
def test_killed_search_resumes_and_finds_the_known_answer(prefect_harness, e2e_store):
    """The search is killed (its process and its jobs, as a machine dies) once two trials have a result and one
    has a checkpoint on its way to its next milestone; started again it reruns nothing that had finished, every
    killed job resumes from its checkpoint (its promotion stands) and reaches its milestone, and the far-too-small
    learning rate loses. The kill is checked on the frozen processes, so no job moves past the moment checked."""
    import psutil
    from prefect.client.orchestration import get_client
    from prefect.settings import PREFECT_API_URL

    from flows.sweep import sweep

    cfg = digits_sweep(e2e_store, "lr", max_usd=1.0)
    config_file = e2e_store.parent / "lr.json"
    config_file.write_text(cfg.model_dump_json())
    script = ("import sys; from thrifty.sweep import SweepConfig; from flows.sweep import sweep; "
              "sweep(SweepConfig.model_validate_json(open(sys.argv[1]).read()), poll_s=0.2)")
    proc = subprocess.Popen([sys.executable, "-c", script, str(config_file)], cwd=REPO,
                            env={**python_env(), "PREFECT_API_URL": PREFECT_API_URL.value()},
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    def ready() -> bool:
        """Two trials have a result, every job in flight is training, and one has a checkpoint on its way to a
        milestone it has not reached yet."""
        state = saved_state(e2e_store, "lr")
        done = [t for t in state.get("trials", []) if t["reached"] >= 1]
        running = [t for t in state.get("trials", []) if t["status"] == "running"]
        records = {t["run_name"]: run_records(e2e_store, t["run_name"]) for t in running}
        started = all(any(r.get("event") == "start" for r in records[t["run_name"]]) for t in running)
        on_its_way = any(any(r.get("event") == "checkpoint" for r in records[t["run_name"]]) and
                         not any(r.get("event") == "rung" and r["epoch"] == t["target"] for r in records[t["run_name"]])
                         for t in running)
        return len(done) >= 2 and bool(running) and started and on_its_way

    def family() -> list[psutil.Process]:
        with contextlib.suppress(psutil.NoSuchProcess):
            return [psutil.Process(proc.pid), *psutil.Process(proc.pid).children(recursive=True)]
        return []

    def signal_all(victims: list[psutil.Process], sig: int) -> None:
        for p in victims:
            with contextlib.suppress(psutil.NoSuchProcess):
                p.send_signal(sig)

    try:  # no deadline of its own: a loaded machine takes longer to get there (pytest-timeout bounds a hang)
        while True:
            assert proc.poll() is None, "the search ended before two trials had a result and one a checkpoint"
            if ready():  # freeze the flow and its jobs, and look again at what the frozen store holds: the kill
                frozen: list[psutil.Process] = []  # comes at a moment checked, not one a job may have moved past
                while new := [p for p in family() if p.pid not in {f.pid for f in frozen}]:
                    signal_all(new, signal.SIGSTOP)  # (a child started meanwhile is caught by the next look)
                    frozen += new
                if ready():
                    break
                signal_all(frozen, signal.SIGCONT)
            time.sleep(0.1)
    finally:  # the flow and its training jobs at once, as a machine dies (and none left behind by a failure)
        signal_all(family(), signal.SIGKILL)
    proc.wait(10)
    killed_unix = time.time()
    killed_at = {t["run_name"]: t for t in saved_state(e2e_store, "lr")["trials"]}
    before = {run: ledger_rows(e2e_store, run) for run in killed_at}
    interrupted = [r for r, t in killed_at.items() if t["status"] == "running"]
    checkpointed = {r: max([c["step"] for c in run_records(e2e_store, r) if c.get("event") == "checkpoint"],
                           default=0) for r in interrupted}

    t0 = time.time()
    state = sweep(cfg, poll_s=0.2, return_state=True)
    resume_s = time.time() - t0
    assert state.is_completed(), state.message
    out = state.result()

    # the known answer: lr 1e-6 barely moves in 9 epochs; 3e-3 wins, and its best checkpoint is gold
    assert out.best_values["train.lr"] == 3e-3 and out.best_epochs == 9
    small = [r for r in out.leaderboard if r["train.lr"] == 1e-6]
    assert small and all(r["state"] == "pruned" and r["epochs"] == 1 for r in small), \
        [(r["trial"], r["state"], r["epochs"], r["note"]) for r in small]
    assert all(r["val_loss"] > out.best_value + 0.5 for r in small)
    policy = json.loads((e2e_store / "archive-policy.json").read_text())
    assert policy["gold"] == [out.gold] and out.gold.startswith(f"runs/{out.best_run}/ckpt/step-")
    assert (e2e_store / out.gold / "COMMIT").exists(), "the gold mark names a committed checkpoint"
    # nothing that had finished was trained again: their ledgers only grew by promotions after the kill
    for run, t in killed_at.items():
        after = ledger_rows(e2e_store, run)
        assert [r["started_unix"] for r in after[:len(before[run])]] == [r["started_unix"] for r in before[run]]
        if t["status"] in ("paused", "pruned") and t["reached"] and run not in interrupted:
            rungs_after = [r["epoch"] for r in run_records(e2e_store, run) if r.get("event") == "rung"]
            assert rungs_after.count(t["reached"]) == 1, f"{run}: its epoch-{t['reached']} rung ran once"
    # the trial killed mid-rung resumed from its checkpoint, not from step 0
    assert any(checkpointed.values()), "a trial was killed with a checkpoint to resume from"
    resumed_from = {}
    for run in interrupted:
        target = killed_at[run]["target"]
        records = run_records(e2e_store, run)
        restarts = [r["step"] for r in records if r.get("event") == "start" and r["time_unix"] > killed_unix]
        done_before = any(r.get("event") == "rung" and r["epoch"] == target and r["time_unix"] <= killed_unix
                          for r in records)  # the kill came between its job's last record and the flow seeing it
        # its promotion stands whatever came in since (a killed search decides as one not killed): it goes again
        # first, from its checkpoint, and reaches the milestone it was training to
        assert restarts or done_before, f"{run}: interrupted on its way to epoch {target}, never started again"
        assert all(step >= checkpointed[run] for step in restarts), \
            f"{run}: resumed to epoch {target} from before its checkpoint at step {checkpointed[run]}: {restarts}"
        reached = [r for r in records if r.get("event") == "rung" and r["epoch"] == target] or target == 9
        assert reached, f"{run}: did not reach epoch {target}"
        if restarts:
            resumed_from[run] = restarts[0]
    assert any(step > 0 for step in resumed_from.values()), f"no trial resumed from a checkpoint: {resumed_from}"
    # money: the search's spend is its trials' ledgers, under the cap; every job kept its own cap
    from thrifty.money.budget import spend_usd
    from thrifty.money.ledger import read_attempts
    from thrifty.storage import open_store

    spent_now = sum(spend_usd(read_attempts(open_store(str(e2e_store)), t["trial"])) for t in out.leaderboard)
    # (equal but for an attempt the kill caught before its node's first meter record: its row stays open)
    assert 0 < out.spent_usd <= spent_now + 1e-9 and spent_now <= cfg.max_usd
    assert out.full_usd > out.spent_usd, "training all five to 9 epochs costs more than the search"
    # two jobs at a time, never more: the billed intervals of the attempts that ended by themselves (a killed
    # one's end is only known to within a meter beat)
    spans = sorted((r["started_unix"], r["ended_unix"]) for t in out.leaderboard
                   for r in ledger_rows(e2e_store, t["trial"]) if r["end_reason"] == "succeeded")
    overlap = max(sum(1 for s, e in spans if s <= start < e) for start, _ in spans)
    assert overlap <= 2  # never more than concurrency (on a loaded machine two may happen not to overlap at all)
    # each trial is its own thrifty-train flow run, a child of the sweep's flow run
    sweep_id = state.state_details.flow_run_id

    async def children():
        from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterParentFlowRunId

        async with get_client() as client:
            return await client.read_flow_runs(flow_run_filter=FlowRunFilter(
                parent_flow_run_id=FlowRunFilterParentFlowRunId(any_=[sweep_id])))

    kids = asyncio.run(children())
    assert kids and all(k.name.startswith("lr-t") and k.state.is_final() for k in kids)
    # the leaderboard artifact, with cost per trial and the saving
    arts = latest_artifacts("thrifty-sweep-lr", "thrifty-sweep-summary-lr")
    table = arts["thrifty-sweep-lr"].data
    assert "cost $" in table and "cumulative $" in table and "lr-t00" in table
    shown = [v for row in (json.loads(table) if isinstance(table, str) else table) for v in row.values()]
    decimals = [v for v in shown if isinstance(v, (str, float)) and re.fullmatch(r"-?\d+\.\d+", str(v))]
    assert decimals and all(len(str(v).strip("-").replace(".", "").lstrip("0")) <= 4 for v in decimals), shown
    summary = arts["thrifty-sweep-summary-lr"].data
    assert "saved" in summary and "data:image/svg+xml;base64," in summary and out.best_run in summary
    print(f"resume took {resume_s:.1f} s; spent ${out.spent_usd:.5f}, all to the end ~${out.full_usd:.5f}")


@pytest.mark.slow
def test_a_cap_that_cannot_carry_every_trial_forces_pruning_and_holds(prefect_harness, e2e_store, monkeypatch):
    """At a fixed pace the search's least work (5 trials to epoch 1, one to 3, one to 9: 195 steps of 0.3 s) costs
    more than $0.0049 at g5.xlarge's $0.302/h, so $0.004 cannot carry it on any machine, while it covers the first
    job (its estimate x 1.5 plus 5 s to stop in, never less than its first checkpoint): the rest are refused with
    the reason, nothing is launched past the cap, and the spend stays under it."""
    from flows.sweep import sweep

    pace_s = 0.3
    monkeypatch.setenv("THRIFTY_MIN_STEP_S", str(pace_s))  # the node's steps take at least this long
    assert 195 * pace_s * 0.302 / 3600 > 0.004
    cfg = digits_sweep(e2e_store, "tight", max_usd=0.004)
    out = sweep(cfg, poll_s=0.2)
    refused = [r for r in out.leaderboard if r["state"] == "out_of_budget"]
    assert refused and all("cannot cover" in r["note"] for r in refused)
    assert 0 < out.spent_usd <= cfg.max_usd
    ran = [r for r in out.leaderboard if r["epochs"]]
    assert ran and all(len(ledger_rows(e2e_store, r["trial"])) >= 1 for r in ran)
    # a trial refused before its first rung was never rented, or its first job was stopped by its own cap short of
    # the rung (a slow start-up on a loaded machine) and the search refused to pay for more: its spend is counted
    for r in refused:
        if not r["epochs"] and ledger_rows(e2e_store, r["trial"]):
            assert r["cost $"] > 0, r
    assert sum(r["cost $"] for r in out.leaderboard) == pytest.approx(out.spent_usd, abs=1e-5), out.leaderboard
