"""Runs logged to a real MLflow tracking server (``mlflow server`` on loopback, SQLite backend), read back through
its REST API: the config as params, step-indexed histories equal to the store's metric lines and ledger, cost and
savings equal to the savings report; every end logs, an MLflow failure never fails a run, a malformed tracking URI
is bad input before anything is rented."""

from __future__ import annotations

import json
import logging
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from thrifty.config import ConfigError, RunConfig, build_config
from thrifty.config.report import tracking_uri
from thrifty.money import savings
from thrifty.money.budget import spend_usd
from thrifty.money.ledger import Attempt, read_attempts
from thrifty.report import mlflow
from thrifty.report.chart import series, training_curve
from thrifty.runs import read_metrics
from thrifty.storage import open_store

SERVER_START_S = 300  # `mlflow server` imports a lot; a starved machine starts it slowly, never fails it


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _answers(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=5) as r:
            return r.status == 200
    except (urllib.error.URLError, OSError):
        return False


@pytest.fixture(scope="module")
def mlflow_uri(tmp_path_factory) -> str:
    """A real tracking server for this module, stopped by its pid (its process group: uvicorn's worker too)."""
    home = tmp_path_factory.mktemp("mlflow")
    port = _free_port()
    log = (home / "server.log").open("wb")
    proc = subprocess.Popen(
        [sys.executable, "-m", "mlflow", "server", "--backend-store-uri", f"sqlite:///{home}/mlflow.db",
         "--default-artifact-root", str(home / "artifacts"), "--host", "127.0.0.1", "--port", str(port),
         "--workers", "1"],
        cwd=home, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
        # its job runner (seven huey processes for GenAI jobs, ~28 CPU-s over the module) serves nothing we log
        env={**os.environ, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"})
    uri = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + SERVER_START_S
        while not _answers(f"{uri}/health"):
            if proc.poll() is not None or time.monotonic() > deadline:
                pytest.fail(f"mlflow server did not start: {(home / 'server.log').read_text()[-3000:]}")
            time.sleep(0.5)
        yield uri
    finally:
        for sig, wait in ((signal.SIGTERM, 30), (signal.SIGKILL, 10)):
            try:
                os.killpg(proc.pid, sig)
                proc.wait(wait)
                break
            except ProcessLookupError:
                break
            except subprocess.TimeoutExpired:
                continue
        log.close()


def api(uri: str, endpoint: str, body: dict | None = None, **query: Any) -> dict:
    """The test's own REST reader: nothing of the code under test."""
    url = f"{uri}/api/2.0/mlflow/{endpoint}" + (f"?{urllib.parse.urlencode(query)}" if query else "")
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(url, data=data, method="POST" if body is not None else "GET",
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=30) as r:
        return json.loads(r.read() or b"{}")


def runs_named(uri: str, experiment: str, run_name: str) -> list[dict]:
    exp = api(uri, "experiments/get-by-name", experiment_name=experiment)["experiment"]["experiment_id"]
    found = api(uri, "runs/search", {"experiment_ids": [exp], "max_results": 100,
                                     "filter": f"tags.\"thrifty.run_name\" = '{run_name}'"})
    return found.get("runs", [])


def history(uri: str, run_id: str, key: str) -> list[tuple[int, float]]:
    """(step, value) in step order, then time: the curve MLflow draws."""
    rows: list[dict] = []
    token = None
    while True:
        page = api(uri, "metrics/get-history", run_id=run_id, metric_key=key, max_results=25000,
                   **({"page_token": token} if token else {}))
        rows += page.get("metrics", [])
        token = page.get("next_page_token")
        if not token:
            break
    return [(int(m.get("step", 0)), m["value"]) for m in sorted(rows, key=lambda m: (int(m.get("step", 0)),
                                                                                      int(m["timestamp"])))]


def data_of(run: dict) -> tuple[dict[str, str], dict[str, str], dict[str, float]]:
    d = run["data"]
    return ({p["key"]: p["value"] for p in d.get("params", [])}, {t["key"]: t["value"] for t in d.get("tags", [])},
            {m["key"]: m["value"] for m in d.get("metrics", [])})


def flow_config(store: Path, run_name: str, uri: str | None, **over: Any) -> RunConfig:
    return build_config({
        "run_name": run_name, "recipe": "digits", "store": str(store), "recipe_params": {"limit": 400},
        "train": {"max_epochs": 2, "micro_batch": 32, "precision": "fp32", "checkpoint_every": 5, "log_every": 5,
                  "eval_every": 5},
        "compute": {"emulate": "aws:g5.xlarge", "max_restarts": 0},
        "budget": {"max_usd": 1.0},
        "report": {"mlflow_experiment": "thrifty-test", **({"mlflow_tracking_uri": uri} if uri else {})},
        **over,
    })


def check_against_store(uri: str, run: dict, store: Path, name: str) -> None:
    """Every history and final figure equals what the run left in the store."""
    st = open_store(str(store))
    metrics, attempts, figures = read_metrics(st, name), read_attempts(st, name), savings.read(st, name)
    run_id = run["info"]["run_id"]
    curve = training_curve(metrics)
    assert curve, "the run trained"
    assert history(uri, run_id, "loss") == [(r["step"], pytest.approx(r["loss"], rel=1e-12)) for r in curve]
    assert history(uri, run_id, "samples_per_s") == [(r["step"], pytest.approx(r["samples_per_s"])) for r in curve]
    evals = {}
    for rec in sorted((m for m in metrics if m.get("event") == "eval"), key=lambda m: m["time_unix"]):
        evals[rec["step"]] = rec["val_accuracy"]
    assert evals and history(uri, run_id, "val_accuracy") == [(s, pytest.approx(v)) for s, v in sorted(evals.items())]
    spend = series(metrics, attempts)
    assert history(uri, run_id, "spend_usd") == [(p.step, pytest.approx(p.spend_usd, rel=1e-12)) for p in spend]
    assert spend[-1].spend_usd == pytest.approx(spend_usd(attempts), abs=1e-9), "the curve ends at the ledger's total"
    _, _, final = data_of(run)
    assert figures is not None
    assert final["cost_usd"] == pytest.approx(figures.actual_usd) == pytest.approx(spend_usd(attempts), abs=1e-6)
    assert final["saved_usd"] == pytest.approx(figures.saved_usd)
    assert final["naive_usd"] == pytest.approx(figures.naive_usd)
    assert final["on_demand_usd"] == pytest.approx(figures.on_demand_usd)
    assert final["saved_spot_usd"] == pytest.approx(figures.levers_usd["spot"])
    assert final["attempts"] == len(attempts)


@pytest.mark.slow
def test_a_completed_run_is_logged_with_its_config_histories_and_savings(prefect_harness, mlflow_uri, tmp_path):
    from prefect.utilities.urls import url_for

    from flows.train_pipeline import train_pipeline

    store = tmp_path / "store"
    cfg = flow_config(store, "mlf-done", mlflow_uri)
    state = train_pipeline(cfg, poll_s=0.2, return_state=True)
    assert state.is_completed(), state
    [run] = runs_named(mlflow_uri, "thrifty-test", "mlf-done")
    assert run["info"]["run_name"] == "mlf-done" and run["info"]["status"] == "FINISHED"
    params, tags, _ = data_of(run)
    assert params == mlflow.params(cfg)
    assert params["train.lr"] == "0.001" and params["recipe_params.limit"] == "400"
    assert params["report.mlflow_tracking_uri"] == mlflow_uri
    flow_run_id = str(state.state_details.flow_run_id)
    assert tags["thrifty.flow_run_id"] == flow_run_id and tags["thrifty.end"] == "completed"
    assert tags.get("thrifty.flow_run_url") == url_for("flow-run", obj_id=flow_run_id)
    assert tags["mlflow.note.content"].startswith(savings.read(open_store(str(store)), "mlf-done").end)
    check_against_store(mlflow_uri, run, store, "mlf-done")


@pytest.mark.slow
def test_a_run_stopped_at_its_cap_is_logged_from_the_environment(prefect_harness, mlflow_uri, tmp_path, monkeypatch):
    """$MLFLOW_TRACKING_URI, and an end that is not a success (the cap): it logs what exists, the run FAILED."""
    from flows.train_pipeline import train_pipeline

    monkeypatch.setenv("MLFLOW_TRACKING_URI", mlflow_uri + "/")
    store = tmp_path / "store"
    # p5.48xlarge spot (~1.1 cents a second): $0.4 is ~37 s, room for the node to start and train on a loaded machine
    # ($0.1 was not: beside stress-ng the node was still starting when the cap came, so nothing trained). At a fixed
    # pace of at least 10 ms a step, 2000 epochs (~20,000 steps, 200 s) cannot end before it on any machine.
    monkeypatch.setenv("THRIFTY_MIN_STEP_S", "0.01")
    cfg = flow_config(store, "mlf-capped", None, compute={"emulate": "aws:p5.48xlarge", "max_restarts": 0},
                      budget={"max_usd": 0.4, "stop_margin_s": 2.0, "allow_over_budget": True,
                              "burn_rate_alert_usd_per_hour": None})
    cfg = cfg.updated({"train": {**cfg.train.model_dump(mode="json"), "max_epochs": 2000,
                                 "early_stopping": {"enabled": False}}})
    state = train_pipeline(cfg, poll_s=0.2, return_state=True)
    assert state.name == "StoppedAtCap", state
    [run] = runs_named(mlflow_uri, "thrifty-test", "mlf-capped")
    _, tags, _ = data_of(run)
    assert run["info"]["status"] == "FAILED" and tags["thrifty.end"] == "budget"
    assert tags["mlflow.note.content"].startswith(state.message + "\n\nPrefect flow run: ")
    check_against_store(mlflow_uri, run, store, "mlf-capped")


@pytest.mark.slow
def test_a_malformed_tracking_uri_is_bad_input_before_anything_is_rented(prefect_harness, tmp_path, monkeypatch):
    from flows.train_pipeline import train_pipeline

    monkeypatch.setenv("MLFLOW_TRACKING_URI", "databricks")
    store = tmp_path / "store"
    state = train_pipeline(flow_config(store, "mlf-bad", None), poll_s=0.2, return_state=True)
    assert state.name == "BadInput", state
    assert "$MLFLOW_TRACKING_URI 'databricks' must be an http:// or https:// URL" in state.message
    assert read_attempts(open_store(str(store)), "mlf-bad") == []


@pytest.mark.parametrize("uri, words", [
    ("file:///tmp/mlruns", "must be an http:// or https:// URL"),
    ("http://", "names no host"),
    ("http://mlflow:port", "is not a URL"),
    ("https://mlflow.example/x?y=1", "may not hold '?' or '#'"),
    ("https://alice:s3cret@mlflow.example", "may not hold credentials"),
])
def test_a_malformed_setting_is_a_config_error_that_shows_no_password(uri, words):
    with pytest.raises(ConfigError) as err:
        build_config({"report": {"mlflow_tracking_uri": uri}})
    assert words in str(err.value) and "s3cret" not in str(err.value)


def test_the_setting_wins_over_the_environment_and_is_not_trained():
    cfg = build_config({"report": {"mlflow_tracking_uri": "https://mlflow.example:5000/"}})
    assert tracking_uri(cfg.report, {"MLFLOW_TRACKING_URI": "http://other"}) == "https://mlflow.example:5000"
    assert tracking_uri(RunConfig().report, {"MLFLOW_TRACKING_URI": " http://other/ "}) == "http://other"
    assert tracking_uri(RunConfig().report, {}) is None
    assert cfg.training_fingerprint() == RunConfig().training_fingerprint()


def _attempt(start: float, end: float) -> Attempt:
    return Attempt(job_id="job-1", number=1, cloud="aws", region="us-east-1", instance="g5.xlarge", spot=True,
                   usd_per_hour=0.36, nodes=1, started_unix=start, ended_unix=end, end_reason="succeeded")


def test_one_mlflow_run_per_flow_run_in_batches_within_the_servers_limits(mlflow_uri):
    t0 = 1_700_000_000.0
    steps = 1200  # 2400 step values and 140 params: three metric batches, two param batches
    metrics = [{"step": s, "loss": 1.0 / s, "samples_per_s": 100.0 + s, "time_unix": t0 + s}
               for s in range(1, steps + 1)]
    attempts = [_attempt(t0, t0 + steps + 5)]
    cfg = RunConfig.model_validate({"run_name": "mlf-batches", "report": {"mlflow_experiment": "thrifty-batches"},
                                    "recipe_params": {f"option_{i}": i for i in range(60)},
                                    "tags": {"team": "vision", "owner": "ana"}})
    server = mlflow.Server.from_env(mlflow_uri, {})
    for _ in range(2):  # the same flow run's end logged twice (its hook after a crash): one MLflow run
        mlflow.log_end(server, cfg, "failed", "run mlf-batches failed", None, attempts, metrics, "flow-1")
    mlflow.log_end(server, cfg, "completed", "run mlf-batches completed", None, attempts, metrics, "flow-2")
    runs = runs_named(mlflow_uri, "thrifty-batches", "mlf-batches")
    assert sorted(data_of(r)[1]["thrifty.flow_run_id"] for r in runs) == ["flow-1", "flow-2"]
    for run in runs:
        params, tags, final = data_of(run)
        assert len(params) == len(mlflow.params(cfg)) > 100 and params["recipe_params.option_59"] == "59"
        assert tags["team"] == "vision" and tags["owner"] == "ana"  # the cost tags, as MLflow tags
        assert final["cost_usd"] == pytest.approx(round(spend_usd(attempts), 6))
        loss = history(mlflow_uri, run["info"]["run_id"], "loss")
        assert loss == [(s, pytest.approx(1.0 / s)) for s in range(1, steps + 1)], "each step once, none twice"
    assert {r["info"]["status"] for r in runs} == {"FAILED", "FINISHED"}


def test_a_server_that_does_not_answer_is_a_warning_naming_its_host_only(monkeypatch, caplog):
    from tasks.report import to_mlflow

    port = _free_port()  # nothing listens there
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"http://127.0.0.1:{port}")
    monkeypatch.setenv("MLFLOW_TRACKING_USERNAME", "alice")
    monkeypatch.setenv("MLFLOW_TRACKING_PASSWORD", "s3cret")
    logger = logging.getLogger("thrifty.report")  # outside a flow run; Prefect's logging may stop it propagating
    logger.addHandler(caplog.handler)
    try:
        assert to_mlflow(RunConfig(), "completed", "run digits-demo completed", None, [], [], None) is None
    finally:
        logger.removeHandler(caplog.handler)
    [said] = {r.getMessage() for r in caplog.records if "MLflow" in r.getMessage()}  # once (or twice, propagated)
    assert f"at 127.0.0.1:{port} (" in said and "s3cret" not in said and "alice" not in said, said


def test_a_deleted_experiment_is_said_not_recreated(mlflow_uri):
    exp = api(mlflow_uri, "experiments/create", {"name": "thrifty-deleted"})["experiment_id"]
    api(mlflow_uri, "experiments/delete", {"experiment_id": exp})
    cfg = build_config({"run_name": "mlf-deleted", "report": {"mlflow_experiment": "thrifty-deleted"}})
    with pytest.raises(mlflow.MlflowError, match="is deleted on the server"):
        mlflow.log_end(mlflow.Server.from_env(mlflow_uri, {}), cfg, "completed", "", None, [], [])
