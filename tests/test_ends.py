"""Every end of a run, through the real flow under the Prefect harness: it writes the report with its spend,
reaches the run's notification blocks once, and says what to do next, in one sentence that is also the flow run's
state message. A job that reached its end is never stopped or reported as over budget; a Retry of a run its cap
stopped says how to go on instead of turning into bad input. (Cancellation from the UI: tests/test_deployments_e2e.)"""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from conftest import REPO, latest_artifacts
from thrifty.config import build_config
from thrifty.money import savings
from thrifty.money.budget import spend_usd
from thrifty.money.ledger import read_attempts
from thrifty.numbers import money
from thrifty.storage import open_store

pytestmark = pytest.mark.slow


class _Hook(BaseHTTPRequestHandler):
    received: list[dict] = []

    def do_POST(self):  # noqa: N802
        body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
        _Hook.received.append(json.loads(body))
        self.send_response(200)
        self.end_headers()

    def log_message(self, *args):
        pass


@pytest.fixture(scope="module")
def webhook(prefect_harness):
    from prefect.blocks.notifications import CustomWebhookNotificationBlock

    server = ThreadingHTTPServer(("127.0.0.1", 0), _Hook)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    CustomWebhookNotificationBlock(
        name="thrifty-ends", url=f"http://127.0.0.1:{server.server_port}/hook",
        json_data={"subject": "{{subject}}", "body": "{{body}}"},
    ).save("thrifty-ends", overwrite=True)
    yield _Hook.received
    server.shutdown()


def config(store: Path, run_name: str, train: dict | None = None, recipe: str = "digits", **budget):
    return build_config({
        "run_name": run_name, "recipe": recipe, "store": str(store),
        "recipe_params": {"limit": 400},
        "train": {"max_epochs": 2, "micro_batch": 32, "precision": "fp32", "checkpoint_every": 5, "log_every": 5,
                  **(train or {})},
        "compute": {"emulate": "aws:g5.xlarge", "max_restarts": 0},
        "budget": {"notify": ["custom-webhook/thrifty-ends"], "max_usd": 1.0, **budget},
    })


def ends_said(received: list[dict], run: str) -> list[str]:
    """The notifications that say the run's end (the end hooks'): one sentence starting with 'run <name> '."""
    return [m["body"] for m in received if m["body"].startswith(f"run {run} ") and "Next:" in m["body"]]


def summary_artifact(run: str) -> str:

    from tasks.report import artifact_key

    key = artifact_key(run, "summary")
    return latest_artifacts(key)[key].data


def check_end(received: list[dict], store: Path, run: str, state, said: str, next_step: str, launched: bool = True):
    """One notification of the end, which is the state's message and the report's first line, with the spend."""
    [message] = ends_said(received, run)
    assert message == state.message if state.message else True
    assert message.startswith(f"run {run} {said}: spent $"), message
    assert f"Next: {next_step}" in message, message
    assert message.count(f"run {run} {said}") == 1, f"said twice: {message}"
    assert message in summary_artifact(run), "the report opens with the same sentence"
    if launched:
        spent = spend_usd(read_attempts(open_store(str(store)), run))
        assert f"spent {money(spent)} of its" in message
        figures = savings.read(open_store(str(store)), run)
        assert figures is not None and figures.end == message and figures.actual_usd == pytest.approx(spent, abs=1e-6)
    return message


def test_completed_and_stopped_early_say_their_spend_saving_and_best_weights(webhook, tmp_path):
    from flows.train_pipeline import train_pipeline

    store = tmp_path / "store"
    webhook.clear()
    state = train_pipeline(config(store, "done", {"early_stopping": {"patience": 50}}), poll_s=0.2, return_state=True)
    assert state.is_completed()
    message = check_end(webhook, store, "done", state, "completed", "Its best weights are runs/done/ckpt/step-")
    assert "saved $" in message and "against the same work on-demand" in message

    webhook.clear()
    early = {"max_epochs": 40, "early_stopping": {"patience": 1, "min_delta": 1e6}}
    state = train_pipeline(config(store, "early", early), poll_s=0.2, return_state=True)
    assert state.is_completed()
    message = check_end(webhook, store, "early", state, "stopped early", "Its best weights are runs/early/ckpt/")
    assert "stopped 38 epochs before max_epochs; at this run's rate that is $" in message


def test_a_rung_is_an_end_that_says_how_it_continues(webhook, tmp_path):
    from flows.train_pipeline import train_pipeline

    store = tmp_path / "store"
    webhook.clear()
    state = train_pipeline(config(store, "rung", {"max_epochs": 4, "stop_at_epoch": 1}), poll_s=0.2,
                           return_state=True)
    assert state.is_completed()
    check_end(webhook, store, "rung", state, "trained to its milestone", "A larger train.stop_at_epoch continues it")


def test_a_failed_job_and_a_failed_smoke_test_say_what_to_fix(webhook, tmp_path, monkeypatch):
    from flows.train_pipeline import train_pipeline

    monkeypatch.setenv("PYTHONPATH", f"{REPO / 'tests'}:{REPO}")  # the job imports the test's recipe
    store = tmp_path / "store"
    webhook.clear()
    state = train_pipeline(config(store, "broken", recipe="recipes_custom:breaks_in_training"), poll_s=0.2,
                           return_state=True)
    assert state.is_failed() and state.name == "Failed", state
    message = check_end(webhook, store, "broken", state, "failed", "Fix the cause (each attempt's log is under "
                                                                   "runs/broken/logs/)")
    assert "ended FAILED" in message
    webhook.clear()
    state = train_pipeline(config(tmp_path / "other", "bug", recipe="recipes_bad:recipe"), return_state=True)
    assert state.name == "BadInput" and "SmokeTestFailed" in state.message  # the user's code: a fix before a rental
    check_end(webhook, tmp_path / "other", "bug", state, "refused its input", "Nothing was rented", launched=False)
    assert not (tmp_path / "other" / "runs").exists(), "nothing launched, nothing written"


def test_bad_input_is_reported_and_writes_nothing(webhook, tmp_path):
    from flows.train_pipeline import train_pipeline

    store = tmp_path / "store"
    webhook.clear()
    cfg = config(store, "gated", max_usd=0.00001, allow_over_budget=True)
    state = train_pipeline(cfg, poll_s=1.0, return_state=True)
    assert state.is_failed() and state.name == "BadInput", state
    message = check_end(webhook, store, "gated", state, "refused its input", "Nothing was rented", launched=False)
    assert "spent $0.00 of its $1e-05 budget" in message and "cannot buy a single checkpoint" in message
    assert not (store / "runs" / "gated").exists()


def test_a_crash_is_reported_by_its_hook(webhook, tmp_path, monkeypatch):
    import flows.train_pipeline as pipeline

    def crash(config, **_):
        raise SystemExit("the flow process was told to exit")

    monkeypatch.setattr(pipeline, "smoke", crash)
    webhook.clear()
    with pytest.raises(SystemExit):
        pipeline.train_pipeline(config(tmp_path / "store", "crashy"))
    [message] = ends_said(webhook, "crashy")
    assert message.startswith("run crashy crashed: spent $0.00 of its $1 budget") and "Next:" in message
    assert message in summary_artifact("crashy")


def test_the_cap_is_one_end_and_a_retry_with_the_same_budget_says_how_to_go_on(webhook, tmp_path):
    """A run stopped at its cap ends StoppedAtCap, reported and notified once (its 'stopped' event is no second
    message); started again with the same budget (the UI's Retry) it ends StoppedAtCap again, saying to raise
    budget.max_usd through 'Copy to new run', not BadInput."""
    from flows.train_pipeline import train_pipeline

    store = tmp_path / "store"
    # p5.48xlarge spot (~1 cent a second): $0.25 is ~20 s; 2000 epochs cannot end before it
    capped = {"max_epochs": 2000, "early_stopping": {"enabled": False}}
    cfg = build_config({**config(store, "capped", capped).model_dump(mode="json"),
                        "compute": {"emulate": "aws:p5.48xlarge"},
                        "budget": {"notify": ["custom-webhook/thrifty-ends"], "max_usd": 0.25, "stop_margin_s": 2.0,
                                   "allow_over_budget": True, "burn_rate_alert_usd_per_hour": None}})
    webhook.clear()
    state = train_pipeline(cfg, poll_s=0.2, return_state=True)
    assert state.name == "StoppedAtCap", state
    message = check_end(webhook, store, "capped", state, "stopped at its budget cap", "To go on from ")
    assert "Copy to new run and raise budget.max_usd" in message
    from flows.cli import failed
    from rich.console import Console

    console = Console(record=True, width=400)
    failed(console, "run capped", state)
    assert console.export_text().count("stopped at its budget cap") == 1, "the CLI says the sentence once"

    webhook.clear()
    again = train_pipeline(cfg, poll_s=0.2, return_state=True)
    assert again.name == "StoppedAtCap", again
    assert "Copy to new run and raise budget.max_usd" in again.message and "nothing was launched" in again.message
    [retry] = ends_said(webhook, "capped")
    assert retry == again.message
    assert savings.read(open_store(str(store)), "capped").state == "budget"


def test_a_job_that_reached_its_rung_is_never_stopped_or_called_over_budget(prefect_harness, tmp_path):
    """The job wrote its rung record (its work is saved) and is exiting when the money would say stop: no
    'exceeded' alert, no stop, and the job is reported as the milestone it reached."""
    import time as _time

    from prefect import flow, get_run_logger

    from tasks.alerts import BudgetGuard
    from tasks.launch import watch
    from thrifty.launchers import JobState, JobStatus
    from thrifty.money.ledger import Attempt
    from training.progress import MetricsWriter

    cfg = config(tmp_path / "store", "rung-late", {"max_epochs": 3, "stop_at_epoch": 1}, max_usd=0.01,
                 notify=[])
    store = open_store(cfg.store)
    since = _time.time() - 1.0  # the watch began before the job wrote anything
    metrics = MetricsWriter(store, "rung-late")
    metrics.write({"event": "start", "step": 0, "total_steps": 30, "stop_step": 10})
    metrics.write({"event": "rung", "step": 10, "epoch": 1, "val_loss": 1.0})
    metrics.close()
    looks = {"n": 0}

    class Exiting:  # running, and already past its cap ($39 for an hour): it exits on the third look
        def status(self, job_id):
            looks["n"] += 1
            state = JobState.SUCCEEDED if looks["n"] >= 3 else JobState.RUNNING
            return JobStatus(job_id, state, [Attempt(job_id, 1, "aws", "local", "p5.48xlarge", True, 39.33, 1,
                                                     since - 3600, since if state.terminal else None,
                                                     "succeeded" if state.terminal else None, 0)])

        def cancel(self, job_id, deadline_s=None):
            raise AssertionError("a job that reached its end is never stopped for money")

    sent = []

    @flow
    def watch_it():
        guard = BudgetGuard(cfg, store, "rung-late", get_run_logger(), None, 0.05)
        guard._send = lambda kind, message, payload, notify_blocks=True: sent.append(kind)
        return watch(cfg, store, Exiting(), "j-1", guard, [], since, 0.05, False, get_run_logger())

    out = watch_it()
    assert out.end == "succeeded" and "trained to epoch 1" in out.message, out
    assert "exceeded" not in sent and "stopped" not in sent, sent


def test_a_search_says_its_end_once(webhook, tmp_path):
    """A sweep's end reaches its base config's notification blocks once, with its spend over every trial's ledger
    and its best; each trial's own end is its run's (one each)."""
    from flows.sweep import sweep
    from thrifty.sweep import build_sweep

    store = tmp_path / "store"
    base = config(store, "x", {"max_epochs": 1}).model_dump(mode="json")
    cfg = build_sweep({"name": "said", "base": base, "max_trials": 2, "min_epochs": 1, "eta": 3, "max_epochs": 1,
                       "max_usd": 0.5, "concurrency": 1, "space": {"train.lr": {"choice": [1e-3, 3e-3]}}})
    webhook.clear()
    state = sweep(cfg, poll_s=0.2, return_state=True)
    assert state.is_completed(), state.message
    out = state.result()
    said = [m["body"] for m in webhook if m["body"].startswith("sweep said ")]
    assert len(said) == 1, said
    spent = sum(spend_usd(read_attempts(open_store(str(store)), f"said-t{i:03d}")) for i in range(2))
    assert said[0].startswith(f"sweep said completed: spent {money(spent)} of its $0.5 cap; best {out.best_run}")
    for i in range(2):  # a trial its cap stopped is relaunched (a loaded machine's start-up outruns the estimate):
        jobs = {a.job_id for a in read_attempts(open_store(str(store)), f"said-t{i:03d}")}  # each job's end, once
        assert len(ends_said(webhook, f"said-t{i:03d}")) == len(jobs), "each trial's end, once"
