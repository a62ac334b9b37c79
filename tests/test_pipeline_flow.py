"""The train pipeline flow under one Prefect test harness: preemption survived bit-exact, cache hit, smoke gate."""

from __future__ import annotations

from pathlib import Path

import pytest

from flows.train_pipeline import train_pipeline
from thrifty.config import build_config
from conftest import latest_artifacts

pytestmark = pytest.mark.slow


def config(store: Path, run_name: str, **compute):
    return build_config({
        "run_name": run_name, "recipe": "digits", "store": str(store),
        "recipe_params": {"dropout": 0.2},
        "train": {"max_epochs": 3, "micro_batch": 32, "precision": "fp32", "checkpoint_every": 20, "log_every": 5},
        "compute": {"emulate": "aws:g5.xlarge", "preempt_grace_s": 20, **compute},
    })


def ledger(store: Path, run_name: str) -> list[dict]:
    from thrifty.money.ledger import read_attempts
    from thrifty.storage import open_store

    return [a.row() for a in read_attempts(open_store(str(store)), run_name)]


@pytest.fixture(scope="module")
def store(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("pipeline") / "store"


@pytest.fixture(scope="module")
def reference(prefect_harness, store) -> dict:
    """An uninterrupted run; it is also the first run on this data, so preprocessing is a miss."""
    out = train_pipeline(config(store, "ref"), poll_s=0.2)
    assert out.cache_hit is False
    assert len(out.job.attempts) == 1 and out.job.attempts[0].end_reason == "succeeded"
    return out


@pytest.mark.parametrize("mode", ["sigterm", "kill"])
def test_preempted_run_resumes_and_matches_uninterrupted(prefect_harness, store, reference, mode):
    run = f"preempted-{mode}"
    out = train_pipeline(config(store, run, preempt_after_steps=40, preempt_mode=mode), poll_s=0.2)
    assert out.cache_hit is True, "same data, code and params: the second run is a cache hit"
    attempts = out.job.attempts
    assert [a.end_reason for a in attempts] == ["preempted", "succeeded"]
    assert out.summary.resumes == 1
    assert out.summary.weights_sha256 == reference.summary.weights_sha256
    assert out.summary.final_metrics["val_accuracy"] > 0.8  # 3 epochs; the demo trains 30
    rows = ledger(store, run)
    assert [r["end_reason"] for r in rows] == ["preempted", "succeeded"]
    assert all(r["spot"] and r["instance"] == "g5.xlarge" and r["usd_per_hour"] > 0 for r in rows)
    assert 0 < out.cost_usd < out.on_demand_usd


def test_report_artifacts_published(prefect_harness, store, reference):
    by_key = latest_artifacts("thrifty-summary-ref", "thrifty-attempts-ref")
    summary = by_key["thrifty-summary-ref"].data
    assert "preprocessing cache | miss" in summary and "smoke test | passed" in summary
    assert "final val_accuracy" in summary and "on-demand" in summary
    table = by_key["thrifty-attempts-ref"].data
    assert "succeeded" in table


def test_smoke_failure_stops_before_launch(prefect_harness, tmp_path):
    store = tmp_path / "store"
    cfg = build_config({"run_name": "bug", "recipe": "recipes_bad:recipe", "store": str(store)})
    state = train_pipeline(cfg, return_state=True)
    assert state.is_failed()
    assert "SmokeTestFailed" in state.message and "building the model" not in state.message
    assert "mat1 and mat2 shapes cannot be multiplied" in state.message
    assert not (store / "runs").exists(), "nothing may be launched (no ledger, no checkpoints) after a failed smoke test"


def test_unknown_emulated_instance_fails_before_any_work(prefect_harness, tmp_path):
    store = tmp_path / "store"
    cfg = config(store, "badprice", emulate="aws:g99.mega")
    state = train_pipeline(cfg, return_state=True)
    assert state.is_failed()
    assert "compute.emulate" in state.message and "g5.xlarge" in state.message
    assert not store.exists()


def test_prefect_cache_never_stands_in_for_another_stores_shards(prefect_harness, tmp_path):
    """Prefect's record of a hit on one store must not make a fresh store skip preprocessing."""
    from tasks.preprocess import preprocess

    first, second = tmp_path / "a", tmp_path / "b"
    assert preprocess(config(first, "a")).hit is False
    preprocess(config(first, "a"))  # the key exists once the manifest does: this run records it
    assert preprocess(config(first, "a"), return_state=True).name == "Cached"
    out = preprocess(config(second, "b"), return_state=True)
    assert out.name != "Cached" and out.result().hit is False
    assert list((second / "cache").glob("*/manifest.json")), "the fresh store got its own shards"


def test_a_finished_run_is_not_launched_again(prefect_harness, store, reference):
    """Run the same config again: preprocessing is a hit and nothing is rented just to load the last checkpoint."""
    before = ledger(store, "ref")
    out = train_pipeline(config(store, "ref"), poll_s=0.2)
    assert out.already_finished is True and out.cache_hit is True and out.job is None
    assert out.summary.weights_sha256 == reference.summary.weights_sha256
    assert ledger(store, "ref") == before, "no new attempt"
    assert out.cost_usd == pytest.approx(reference.cost_usd, abs=1e-6)
