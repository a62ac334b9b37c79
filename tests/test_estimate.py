"""The pre-launch estimate: one figure with its basis and a range; from the store's history of the same model on
the same hardware once there is one (start-up and the all-in cost of a step, evaluation and checkpoints included),
else scaled from the smoke test's CPU measurement with its evaluation and checkpoints measured too. The gate
refuses only when even the low end exceeds the cap, and says the one figure set it logs. A search's trial is never
given a cap that stops it before its first checkpoint while the search has the money. Accuracy against real runs:
bench/bench_estimate.py (timing is this machine's: no test depends on it)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from thrifty.config import build_config
from thrifty.money.estimate import OverBudgetPlan, RANGE, estimate_run, gate
from thrifty.money.history import LOCAL, job_history
from thrifty.money.ledger import Attempt, write_job_attempts
from thrifty.money.throughput import speed_key
from thrifty.numbers import money
from thrifty.results import PrepResult, SmokeResult
from thrifty.runs import run_key
from thrifty.storage import open_store

T0 = 1_800_000_000.0


def cfg_of(store: Path, run_name: str, **train):
    return build_config({"run_name": run_name, "recipe": "digits", "store": str(store),
                         "train": {"max_epochs": 10, "micro_batch": 32, "precision": "fp32", "checkpoint_every": 50,
                                   **train}})


def an_earlier_run(store: Path, run_name: str, key: str, startup_s: float, steps: int, all_in_s: float,
                   step_s: float, region: str = "local", instance: str = "g5.xlarge") -> None:
    """What a finished job leaves: its ledger row and its metric lines (a start record after start-up, steps
    logged every 10 at ``step_s``, evaluations and checkpoints between them, the end)."""
    s = open_store(str(store))
    began = T0 + startup_s
    ended = began + steps * all_in_s
    write_job_attempts(s, run_name, "j1", [Attempt("j1", 1, "aws", region, instance, True, 3.6, 1, T0, ended,
                                                   "succeeded", 0)])
    lines = [{"time_unix": began, "event": "start", "step": 0, "total_steps": steps, "speed_key": key,
              "device": "cpu" if region == "local" else "cuda:0", "world_size": 1, "train_examples": 1000}]
    lines += [{"time_unix": began + k * all_in_s, "step": k, "loss": 1.0, "step_time_s": step_s}
              for k in range(10, steps + 1, 10)]
    lines += [{"time_unix": ended, "event": "end", "status": "completed", "steps": steps}]
    s.put_bytes(run_key(run_name, "metrics", "20260101T000000-1.jsonl"),
                "".join(json.dumps(r) + "\n" for r in lines).encode())


def smoke(step_s: float = 0.01, eval_s: float = 0.5, save_s: float = 0.2) -> SmokeResult:
    return SmokeResult(recipe="digits", steps=5, losses=[1.0], cpu_step_time_s=step_s, cpu_eval_s=eval_s,
                       cpu_save_s=save_s, examples_per_step=32, parameters=1, precision_checked="fp32", cache_key="k")


PREP = PrepResult(key="k", hit=True, seconds=0.1, cold_seconds=1.0, examples={"train": 3200, "val": 320}, bytes=1)


def test_the_history_of_the_same_model_prices_each_step_all_in_with_its_start_up(tmp_path):
    from tasks.budget import estimate_for

    store = tmp_path / "store"
    cfg = cfg_of(store, "second")
    an_earlier_run(store, "first", speed_key(cfg), startup_s=12.0, steps=1000, all_in_s=0.03, step_s=0.02)
    an_earlier_run(store, "other-model", "another-key", startup_s=99.0, steps=1000, all_in_s=9.0, step_s=9.0)
    [local] = job_history(open_store(str(store)), speed_key(cfg)).values()
    assert (local.where, local.runs, local.startup_s, local.steps) == (LOCAL, ["first"], 12.0, 1000)
    assert local.all_in_step_s == pytest.approx(0.03) and local.overhead == pytest.approx(1.5)
    est = estimate_for(cfg, PREP, smoke())
    assert est.basis == "measured" and est.steps == 1000  # 10 epochs of 100 steps
    assert est.startup_s == 12.0 and est.step_s == pytest.approx(0.03)
    assert est.usd == pytest.approx((12.0 + 1000 * 0.03) / 3600 * 0.302)  # g5.xlarge spot, the emulated default
    assert (est.low_usd, est.high_usd) == pytest.approx((est.usd * RANGE["measured"][0], est.usd * RANGE["measured"][1]))
    assert "measured on this machine's CPU" in est.summary() and "first" in est.summary()


def test_without_history_the_smoke_tests_evaluation_and_checkpoints_are_priced_in(tmp_path):
    from tasks.budget import estimate_for

    cfg = cfg_of(tmp_path / "store", "fresh")
    est = estimate_for(cfg, PREP, smoke(step_s=0.01, eval_s=0.5, save_s=0.2))
    # 100 steps an epoch: an evaluation every 100 steps (0.5 s), a checkpoint every 50 and one per evaluation (0.2 s)
    per_step = 0.01 + 0.5 / 100 + 0.2 * (1 / 100 + 1 / 50)
    assert est.basis == "scaled" and est.step_s == pytest.approx(per_step)
    assert est.overhead_s == pytest.approx(1000 * (per_step - 0.01))
    assert est.usd == pytest.approx((5.0 + 1000 * per_step) / 3600 * 0.302)
    assert (est.low_usd, est.high_usd) == pytest.approx((est.usd / 3, est.usd * 3))


def test_the_gate_refuses_only_when_even_the_low_end_exceeds_the_cap():
    est = estimate_run(100_000, 0.001, 32, usd_per_hour=36.0, nodes=1, accelerator=None, launcher="local")
    assert est.usd == pytest.approx((5 + 3200) / 3600 * 36.0)  # $32.05; range $10.68-$96.15
    gate(est, 20.0, False, 30.0, 50)  # over the estimate, but the low end fits: the hard cap holds whatever happens
    with pytest.raises(OverBudgetPlan) as err:
        gate(est, 10.0, False, 30.0, 50)
    assert "even the low end of the estimate exceeds budget.max_usd $10" in str(err.value)
    assert money(est.low_usd + 0.3) in str(err.value) and est.summary() in str(err.value), "one figure set"


def test_a_trial_is_given_at_least_its_first_checkpoint_at_the_estimates_high_end():
    from thrifty.sweep.caps import need_for

    small = need_for(estimate_usd=0.001, estimate_hours=0.001, reserve_usd=0.0005, gpus=1, factor=1.5, epochs=1,
                     first_checkpoint_usd=0.004)
    assert small.usd == 0.004 and "first checkpoint" in small.why
    big = need_for(0.01, 0.01, 0.0005, 1, 1.5, 1, first_checkpoint_usd=0.004)
    assert big.usd == pytest.approx(0.0155) and "first checkpoint" not in big.why


def test_the_smoke_tests_step_time_leaves_out_the_first_step(tmp_path):
    """The first step pays for lazy initialisation: priced at it, a tiny model's run looked ~10x dearer."""
    import training.smoke as smoke_module
    from training.smoke import smoke_test

    calls = []
    real = smoke_module.optimizer_step

    def slow_first(*args, **kwargs):
        calls.append(1)
        if len(calls) == 1:
            import time

            time.sleep(0.5)
        return real(*args, **kwargs)

    smoke_module.optimizer_step = slow_first
    try:
        result = smoke_test(build_config({"run_name": "s", "recipe": "digits", "store": str(tmp_path / "store"),
                                          "recipe_params": {"limit": 400}, "train": {"precision": "fp32"}}))
    finally:
        smoke_module.optimizer_step = real
    assert len(calls) == 5 and result.cpu_step_time_s < 0.25
    assert result.cpu_eval_s > 0 and result.cpu_save_s > 0
