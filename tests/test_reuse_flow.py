"""Reuse through the train pipeline flow: a nightly run warm-starts from the previous night, deduplicated data and
the warm start show in the report, and a warm start that does not fit is bad input before anything is rented."""

from __future__ import annotations

import datetime as dt
import os
from pathlib import Path

import pytest

from conftest import REPO, latest_artifacts, python_env
from flows.train_pipeline import train_pipeline
from thrifty.config import build_config
from thrifty.money import savings
from thrifty.storage import open_store
from training.loop import train

pytestmark = pytest.mark.slow


def config(store: Path, run_name: str, params: dict | None = None, **train_cfg):
    return build_config({
        "run_name": run_name, "recipe": "recipes_custom:duplicated", "store": str(store),
        "recipe_params": params or {"hidden": 32, "limit": 600}, "data": {"dedup": "exact"},
        "train": {"max_epochs": 6, "micro_batch": 32, "precision": "fp32", "checkpoint_every": 20, "log_every": 5,
                  "lr": 3e-3, "eval_every": 5, "early_stopping": {"patience": 2, "min_delta": 0.002}, **train_cfg},
        "compute": {"emulate": "aws:g5.xlarge"},
    })




def test_nightly_warm_start_through_the_flow(prefect_harness, tmp_path, monkeypatch):
    monkeypatch.setenv("PYTHONPATH", python_env()["PYTHONPATH"] + os.pathsep + str(REPO / "tests"))  # its own recipe
    store = tmp_path / "store"
    yesterday = (dt.datetime.now(dt.timezone.utc).date() - dt.timedelta(days=1)).strftime("%Y%m%d")
    first = train(config(store, f"nightly-{yesterday}"))  # last night, from scratch
    assert first.summary.init_from is None

    out = train_pipeline(config(store, "nightly-{date}", init_from="previous"), poll_s=0.2)
    warm = out.summary.init_from
    assert warm.source == f"run:nightly-{yesterday}:gold" and warm.run == f"nightly-{yesterday}"
    assert warm.reference_run == f"nightly-{yesterday}" and warm.steps_not_trained is not None
    figures = savings.read(open_store(str(store)), out.run_name)
    assert "warm_start" in figures.levers_usd
    assert figures.levers_usd["warm_start"] > 0 or warm.steps_not_trained == 0

    key = f"thrifty-summary-{out.run_name}"
    summary = latest_artifacts(key)[key].data
    assert "| deduplication | exact: 12 duplicates removed (train 12); 5 validation examples were also in train |" \
        in summary
    assert f"| weights from | `run:nightly-{yesterday}:gold`" in summary and "steps not trained against" in summary
    assert "| warm start |" in summary


def test_a_warm_start_that_does_not_fit_is_bad_input_before_launch(prefect_harness, tmp_path):
    store = tmp_path / "store"
    train(config(store, "narrow", max_epochs=1))
    state = train_pipeline(config(store, "wide", {"hidden": 48, "limit": 600}, init_from="run:narrow"),
                           return_state=True)
    assert state.is_failed() and state.name == "BadInput"
    assert "0.weight is [32, 64] there and [48, 64] here" in state.message
    assert not (store / "runs" / "wide").exists(), "nothing rented, nothing written for the run"
