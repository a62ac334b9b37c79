"""Budget guardrails: alerts once per threshold, burn-rate alerts without fatigue, the cap, the gate, hooks."""

from __future__ import annotations

import asyncio
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from thrifty.money.budget import AlertState, Snapshot, due_alerts, snapshot, stop_margin_s, stop_reserve_s
from thrifty.money.estimate import OverBudgetPlan, estimate_run, gate, smallest_budget_usd
from thrifty.config import BudgetConfig, build_config
from thrifty.numbers import money


# ----------------------------------------------------------------------------- pure functions


def snap(spend: float, burn: float = 1.0, gpu_hours: float = 0.0, max_usd: float = 10.0) -> Snapshot:
    return Snapshot(spend, burn, gpu_hours, spend, None, spend / max_usd)


def test_each_threshold_alerts_once_and_cap_is_exceeded():
    budget = BudgetConfig(max_usd=10.0, thresholds=[0.5, 0.8, 1.0], burn_rate_alert_usd_per_hour=None)
    state = AlertState()
    kinds = []
    for spend in [1, 4.9, 5.0, 5.5, 7.9, 8.2, 8.3, 9.9, 10.0, 10.5]:
        kinds.append([(a.kind, a.payload.get("threshold")) for a in due_alerts(snap(spend), budget, state, "r", 0.0)])
    assert kinds[:2] == [[], []]
    assert kinds[2] == [("threshold", 0.5)]
    assert kinds[3] == [] and kinds[4] == []
    assert kinds[5] == [("threshold", 0.8)] and kinds[6] == [] and kinds[7] == []
    assert kinds[8] == [("threshold", 1.0), ("exceeded", None)]
    assert kinds[9] == [("exceeded", None)]  # the cap keeps saying stop; thresholds never repeat


def test_cap_holds_back_the_reserve_at_the_planned_rate_between_attempts():
    budget = BudgetConfig(max_usd=10.0, thresholds=[1.0], burn_rate_alert_usd_per_hour=None)
    # burning $36/h, 600 s of reserve is $6: stop at $4 spent, not at $10
    assert [a.kind for a in due_alerts(snap(3.9, burn=36.0), budget, AlertState(), "r", 0.0, 600)] == []
    assert [a.kind for a in due_alerts(snap(4.1, burn=36.0), budget, AlertState(), "r", 0.0, 600)] == ["exceeded"]
    # between two attempts nothing burns, but the next one will at the planned rate: the reserve still counts
    assert [a.kind for a in due_alerts(snap(4.1, burn=0.0), budget, AlertState(), "r", 0.0, 600, 36.0)] == ["exceeded"]


def test_the_reserve_is_a_poll_interval_plus_the_stop_margin():
    local = build_config({"budget": {"max_usd": 1.0}})
    assert stop_margin_s(local) == 30.0 and stop_reserve_s(local, 5.0) == 35.0
    cloud = build_config({"compute": {"launcher": "skypilot"}, "budget": {"stop_margin_s": 300}})
    assert stop_reserve_s(cloud, 10.0) == 310.0


def test_thresholds_of_a_larger_budget_alert_again():
    state = AlertState()
    due_alerts(snap(6.0), BudgetConfig(max_usd=10.0, thresholds=[0.5]), state, "r", 0.0)
    again = due_alerts(snap(10.0, max_usd=20.0), BudgetConfig(max_usd=20.0, thresholds=[0.5]), state, "r", 0.0)
    assert [a.kind for a in again if a.kind == "threshold"] == ["threshold"]


def test_burn_rate_alert_repeats_at_most_once_per_interval():
    budget = BudgetConfig(max_usd=100.0, thresholds=[1.0], burn_rate_alert_usd_per_hour=5.0, burn_rate_alert_every_s=600)
    state = AlertState()
    fired = [t for t in range(0, 1801, 60) if due_alerts(snap(1.0, burn=8.0), budget, state, "r", float(t))]
    assert fired == [0, 600, 1200, 1800]
    assert due_alerts(snap(1.0, burn=4.0), budget, AlertState(), "r", 0.0) == []


def test_gpu_hour_cap():
    budget = BudgetConfig(max_usd=100.0, max_gpu_hours=2.0, burn_rate_alert_usd_per_hour=None)
    alerts = due_alerts(snap(1.0, gpu_hours=2.5), budget, AlertState(), "r", 0.0)
    assert [a.kind for a in alerts] == ["exceeded"] and "GPU-hour" in alerts[0].message


def test_projection_uses_the_estimate_until_throughput_is_measured():
    from thrifty.money.ledger import Attempt

    running = [Attempt("j", 1, "aws", "local", "g5.xlarge", True, 3.6, 1, started_unix=0.0)]
    budget = BudgetConfig(max_usd=1.0)
    # 10 s in at $3.6/h = $0.01 spent; the estimate says 1000 steps of 0.5 s are left: $0.50 more
    early = snapshot(running, {"step": 0}, None, budget, 1, now=10.0, estimated_step_s=0.5 * 1000 / 1000,
                     planned_usd_per_hour=3.6)
    assert early.projected_usd == pytest.approx(0.01, abs=1e-9), "no steps known yet: nothing to project from"
    early = snapshot(running, {"step": 0, "estimated_steps": 1000}, None, budget, 1, now=10.0, estimated_step_s=0.5,
                     planned_usd_per_hour=3.6)
    assert early.projected_usd == pytest.approx(0.01 + 0.5) and not early.measured
    measured = snapshot(running, {"step": 500, "total_steps": 1000}, 100.0, budget, 1, now=10.0)
    assert measured.projected_usd == pytest.approx(0.01 + 5 / 3600 * 3.6) and measured.measured


def test_gate_refuses_an_over_budget_plan_and_says_what_to_change():
    est = estimate_run(10_000_000, 0.001, 32, usd_per_hour=1.0, nodes=1, accelerator="A10G:1", launcher="skypilot")
    assert est.hours > 0 and "16x per A10G" in est.assumption and est.basis == "scaled"
    with pytest.raises(OverBudgetPlan) as err:
        gate(est, 0.5, False, 250.0, "auto")
    for hint in ("even the low end of the estimate", "budget.max_usd", "train.max_epochs", "allow_over_budget",
                 "held back", est.summary()):
        assert hint in str(err.value)
    gate(est, 0.5, True, 250.0, "auto")  # the user's override: the cap still stops it


def test_gate_refuses_a_budget_that_cannot_buy_one_checkpoint_even_when_allowed_over():
    """Issue 9.1: p4d.24xlarge spot ($11.57/h) with $0.05: 35 s of reserve alone costs $0.11."""
    est = estimate_run(300, 0.0001, 64, usd_per_hour=11.57, nodes=1, accelerator=None, launcher="local")
    smallest, why = smallest_budget_usd(est, 35.0, "auto")
    assert smallest == pytest.approx((5.0 + 10 * est.step_s + 35.0) / 3600 * 11.57)
    for allowed in (False, True):
        with pytest.raises(OverBudgetPlan) as err:
            gate(est, 0.05, allowed, 35.0, "auto")
        assert money(smallest) in str(err.value) and "cannot buy a single checkpoint" in str(err.value)
        assert "35 s held back" in str(err.value)
    gate(est, smallest * 1.01, True, 35.0, "auto")
    # what the run spent before counts: the same budget is too small for a run that already spent most of it
    with pytest.raises(OverBudgetPlan, match="already spent"):
        gate(est, smallest * 1.01, True, 35.0, "auto", spent_usd=0.05)


def test_ledger_closes_an_attempt_its_watcher_left_open_at_the_nodes_last_sign_of_life():
    from thrifty.money.ledger import METER_BEAT_S, Attempt, MeterRecord, reconcile

    def meter(started, last, ended=None, end=None, job="j"):
        return MeterRecord(job_id=job, started_unix=started, last_unix=last, ended_unix=ended, end=end,
                           usd_per_hour=3.6, nodes=1, cloud="aws", instance="g5.xlarge", spot=True)

    open_row = Attempt("j", 1, "aws", "local", "g5.xlarge", True, 3.6, 1, started_unix=100.0)
    # the node stopped itself at the cap at t=400: its watcher died and never closed the row
    [row] = reconcile([open_row], [meter(100.0, 399.0, 400.0, "budget")], now=10_000.0)
    assert (row.ended_unix, row.end_reason) == (400.0, "budget")
    # a node still beating keeps it open; one silent too long ends a beat after its last sign of life
    assert reconcile([open_row], [meter(100.0, 9_990.0)], now=10_000.0)[0].ended_unix is None
    [row] = reconcile([open_row], [meter(100.0, 500.0)], now=10_000.0)
    assert row.ended_unix == 500.0 + METER_BEAT_S and row.end_reason == "lost"
    # a job the watcher never recorded (the flow died before its first look) is still counted
    [row] = reconcile([], [meter(100.0, 200.0, 210.0, "finished", job="k")], now=10_000.0)
    assert (row.job_id, row.started_unix, row.ended_unix) == ("k", 100.0, 210.0)


def test_a_node_process_killed_on_this_machine_is_gone_at_once_not_after_the_silence():
    """A worker's machine that was also the node died (kill -9): a rerun on this machine need not wait
    METER_STALE_S for the dead job's record to fall silent; a live process, or one on another host, still counts."""
    import socket
    import subprocess
    import sys

    from thrifty.money.ledger import MeterRecord
    from thrifty.procs import process_started

    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    started = process_started(proc.pid)

    def meter(host: str) -> MeterRecord:
        return MeterRecord(job_id="j", started_unix=100.0, last_unix=1_000.0, usd_per_hour=3.6, nodes=1, cloud="aws",
                           instance="g5.xlarge", spot=True, host=host, pid=proc.pid, pid_started=started)

    try:
        assert not meter(socket.gethostname()).gone(1_001.0)
    finally:
        proc.kill()
        proc.wait()
    assert meter(socket.gethostname()).gone(1_001.0)
    assert not meter("another-node").gone(1_001.0)  # a node elsewhere: only its silence tells


def test_the_node_matches_its_price_or_charges_the_dearest_it_may_be():
    from thrifty.money.meter import NodeIdentity, Price, match_price

    prices = [Price("aws", "g5.xlarge", True, 0.302), Price("aws", "g5.xlarge", False, 1.006),
              Price("gcp", "n1-standard-4+T4", True, 0.18), Price("gcp", "g2-standard-4", True, 0.283)]
    assert match_price(prices, NodeIdentity("aws", "g5.xlarge", True))[0].usd_per_hour == 0.302
    assert match_price(prices, NodeIdentity("gcp", "n1-standard-4", True))[0].usd_per_hour == 0.18
    # spot unknown: the on-demand price (never less than what is billed)
    price, note = match_price(prices, NodeIdentity("aws", "g5.xlarge", None))
    assert price.usd_per_hour == 1.006 and "dearest" in note
    assert match_price(prices, NodeIdentity(None))[0].usd_per_hour == 1.006


def test_the_cap_timer_stops_the_job_on_time_whatever_the_loop_is_doing():
    """The watch loop may look late (a starved machine); the timer armed at each look still fires when the money left
    covers only the stop, and the next look's re-arming replaces the old timer."""
    import logging
    import time as _time

    from tasks.launch import CapTimer

    calls = []

    class Launcher:
        def cancel(self, job_id, deadline_s=None):
            calls.append((job_id, deadline_s, _time.monotonic()))

    timer = CapTimer(Launcher(), "j", margin_s=0.5, logger=logging.getLogger("test"))
    t0 = _time.monotonic()
    timer.arm(spend_usd=0.0, burn_usd_per_hour=36_000.0, max_usd=100.0)  # $10 a second: $100 lasts 10 s
    timer.arm(spend_usd=0.0, burn_usd_per_hour=36_000.0, max_usd=10.0)  # re-armed: $10 lasts 1 s, less the margin
    assert timer.fired.wait(30.0)
    [(job, deadline, when)] = calls
    # at 0.5 s, not before; the first arming's timer (9.5 s) was replaced: its firing would come after 9 s
    assert job == "j" and deadline == 0.5 and 0.3 <= when - t0 < 9.0
    timer.arm(0.0, 36_000.0, 10.0)  # fired once: never again
    _time.sleep(0.8)
    assert len(calls) == 1


def test_the_node_wrapper_never_lets_skypilot_restart_a_budget_stop():
    from thrifty.launchers.notice import exit_code
    from thrifty.protocol import EXIT_BUDGET

    for notice_seen in (False, True):
        assert exit_code(EXIT_BUDGET, False, notice_seen, False, False) == 0


def test_budget_validation():
    from thrifty.config import ConfigError

    for bad in ({"max_usd": -1}, {"thresholds": [0.8, 0.5]}, {"thresholds": [0.5, 1.5]}, {"notify": ["no-slash"]}):
        with pytest.raises(ConfigError) as err:
            build_config({"budget": bad})
        assert "budget." in str(err.value)


# ----------------------------------------------------------------------------- flows


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
    """A loopback webhook server and a Prefect Custom Webhook block pointing at it."""
    from prefect.blocks.notifications import CustomWebhookNotificationBlock

    server = ThreadingHTTPServer(("127.0.0.1", 0), _Hook)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    CustomWebhookNotificationBlock(
        name="thrifty-test", url=f"http://127.0.0.1:{server.server_port}/hook",
        json_data={"subject": "{{subject}}", "body": "{{body}}"},
    ).save("thrifty-test", overwrite=True)
    yield _Hook.received
    server.shutdown()


def run_config(store: Path, run_name: str, train: dict | None = None, **budget):
    return build_config({
        "run_name": run_name, "recipe": "digits", "store": str(store), "recipe_params": {"hidden": 64},
        "train": {"max_epochs": 60, "micro_batch": 16, "precision": "fp32", "checkpoint_every": 25, "log_every": 5,
                  **(train or {})},
        # p5.48xlarge spot (~$39/h = ~1 cent a second) makes a seconds-long local run cost real cents
        "compute": {"emulate": "aws:p5.48xlarge", "preempt_grace_s": 20},
        "budget": {"notify": ["custom-webhook/thrifty-test"], "allow_over_budget": True, "stop_margin_s": 2.0,
                   **budget},
    })


def messages(received: list[dict], run: str) -> list[str]:
    return [m["body"] for m in received if f"run {run} " in m["body"]]


def paced(monkeypatch, step_s: float) -> float:
    """A fixed speed: every step takes at least ``step_s`` (thrifty.faults.pace), so a run of N steps lasts at least
    N * step_s seconds on any machine, and costs at least that many seconds of its instance."""
    monkeypatch.setenv("THRIFTY_MIN_STEP_S", str(step_s))  # the local launcher passes its environment to the node
    return step_s


def p5_usd_per_s() -> float:
    from thrifty.money.pricing import quote_emulated

    return quote_emulated("aws:p5.48xlarge", True).usd_per_hour / 3600  # what the runs below are metered at


def test_one_alert_per_threshold_crossed(webhook, tmp_path, monkeypatch):
    from flows.train_pipeline import train_pipeline

    webhook.clear()
    step_s = paced(monkeypatch, 0.01)
    train = {"max_epochs": 6, "early_stopping": {"enabled": False}}  # 6 x 89 steps
    assert 6 * 89 * step_s * p5_usd_per_s() > 0.05, "the steps alone cost more than both thresholds"
    cfg = run_config(tmp_path / "store", "alerts", train, max_usd=1.0, thresholds=[0.02, 0.04],
                     burn_rate_alert_usd_per_hour=10.0)
    out = train_pipeline(cfg, poll_s=0.2)
    assert out.cost_usd > 0.04, "the run must cost enough to cross both thresholds"
    got = messages(webhook, "alerts")
    assert sum("2% of its $1 budget" in m for m in got) == 1
    assert sum("4% of its $1 budget" in m for m in got) == 1
    assert sum("above the $10/hour alert level" in m for m in got) == 1
    assert sum("starting: budget $1" in m for m in got) == 1, "on_running hook"
    assert sum(("alerts completed: spent $" in m or "alerts stopped early: spent $" in m) and "saved $" in m
               for m in got) == 1, "on_completion hook"
    alerts = json.loads((tmp_path / "store" / "runs" / "alerts" / "budget-alerts.json").read_text())
    assert len(alerts["fired"]) == 2


def test_hard_cap_stops_with_checkpoint_then_resumes_with_larger_budget(webhook, tmp_path, capsys, monkeypatch):
    from flows.train_pipeline import train_pipeline
    from thrifty.money import savings
    from thrifty.money.budget import spend_usd
    from thrifty.money.ledger import read_attempts
    from thrifty.storage import open_store

    store = tmp_path / "store"
    cap = 0.25  # ~23 s at ~1 cent a second: training is well under way even when start-up is slow
    # no early stopping, a fixed speed: the run's steps alone cost more than the cap, so it cannot finish before it
    step_s = paced(monkeypatch, 0.02)
    long_run = {"max_epochs": 30, "early_stopping": {"enabled": False}}  # 30 x 89 steps
    assert 30 * 89 * step_s * p5_usd_per_s() > 2 * cap
    state = train_pipeline(run_config(store, "capped", long_run, max_usd=cap, burn_rate_alert_usd_per_hour=None),
                           poll_s=0.2, return_state=True)
    assert state.is_failed() and state.name == "StoppedAtCap", state
    assert "stopped at its budget cap" in state.message and "budget.max_usd" in state.message
    attempts = read_attempts(open_store(str(store)), "capped")
    assert [a.end_reason for a in attempts] in (["cancelled"], ["budget"])  # the watch loop's stop, or the node's
    spent = spend_usd(attempts)
    assert spent <= cap, f"spent ${spent:.4f} of a ${cap} cap"
    assert not (store / "runs" / "capped" / "summary.json").exists()
    ckpts = sorted(int(p.parent.name.split("-")[1]) for p in (store / "runs" / "capped" / "ckpt").glob("*/COMMIT"))
    assert ckpts, "the stop at the cap must leave a complete checkpoint"
    assert f"checkpoint at step {ckpts[-1]} is kept" in state.message, "the message names the checkpoint that exists"
    report = savings.read(open_store(str(store)), "capped")
    assert report is not None and report.state == "budget" and report.actual_usd == pytest.approx(spent, abs=1e-5)
    assert any("capped stopped at its budget cap: spent $" in m for m in messages(webhook, "capped")), "on_failure hook"

    monkeypatch.delenv("THRIFTY_MIN_STEP_S")  # the rest at this machine's speed
    out = train_pipeline(run_config(store, "capped", max_usd=5.0, burn_rate_alert_usd_per_hour=None), poll_s=0.2)
    summary = out.summary
    assert summary.resumes >= 1 and summary.status in ("completed", "stopped_early")
    attempts = read_attempts(open_store(str(store)), "capped")
    assert [a.end_reason for a in attempts][-1] == "succeeded" and len(attempts) == 2
    assert out.savings.actual_usd == pytest.approx(spend_usd(attempts), abs=1e-5)  # figures are rounded to 6 places
    assert out.savings.levers_usd["spot"] > 0 and out.savings.naive_usd > out.savings.actual_usd

    from thrifty.cli import main

    assert main(["report", "--set", f"store={store}"]) == 0
    printed = capsys.readouterr().out
    assert "capped" in printed and "total of 1 run(s): spent $" in printed


def test_pre_launch_gate_refuses_a_budget_that_cannot_buy_one_checkpoint(prefect_harness, tmp_path):
    """Issue 9.1: digits on an emulated p4d.24xlarge ($11.57/h spot) with $0.05 and allow_over_budget."""
    from flows.train_pipeline import train_pipeline

    store = tmp_path / "store"
    cfg = build_config({"run_name": "gated", "recipe": "digits", "store": str(store),
                        "compute": {"emulate": "aws:p4d.24xlarge"}, "budget": {"max_usd": 0.05,
                                                                               "allow_over_budget": True}})
    state = train_pipeline(cfg, poll_s=5.0, return_state=True)
    assert state.is_failed() and state.name == "BadInput", state
    assert "OverBudgetPlan" in state.message and "cannot buy a single checkpoint" in state.message
    assert "the smallest budget that can make progress is $0.1" in state.message  # 35 s held back alone is $0.11
    assert "Traceback" not in state.message
    assert not (store / "runs" / "gated").exists(), "nothing launched, nothing recorded"


def test_a_job_that_finished_is_never_called_over_budget(prefect_harness, tmp_path):
    """The job's status is read before the money: a job that SUCCEEDED past the cap is reported as finished."""
    import time as _time

    from prefect import flow, get_run_logger

    from tasks.alerts import BudgetGuard
    from tasks.launch import watch
    from thrifty.launchers import JobState, JobStatus
    from thrifty.money.ledger import Attempt
    from thrifty.runs import BestMetric, RunSummary, write_summary
    from thrifty.storage import open_store

    cfg = run_config(tmp_path / "store", "done-late", max_usd=0.01)
    store = open_store(cfg.store)
    since = _time.time()
    write_summary(store, RunSummary(run_id="done-late", recipe="digits", status="completed", steps=10, total_steps=10,
                                    epochs=1.0, stopped_early=False, best_metric=BestMetric(name="val_loss", value=1.0,
                                    step=10, checkpoint_step=10), wall_time_s=1.0, data_wait_fraction=0.0,
                                    checkpoint_time_fraction=0.0, checkpoints_written=1, resumes=0, precision="fp32",
                                    device="cpu", world_size=1, cache_key="k", weights_sha256="0" * 64))

    class Finished:  # its one attempt cost $39 (an hour of p5 spot): far past the cap, but it has ended
        def status(self, job_id):
            return JobStatus(job_id, JobState.SUCCEEDED, [Attempt(job_id, 1, "aws", "local", "p5.48xlarge", True,
                                                                  39.33, 1, since - 3600, since, "succeeded", 0)])

        def cancel(self, job_id, deadline_s=None):
            raise AssertionError("a job that has ended is never stopped")

    @flow
    def watch_it():
        guard = BudgetGuard(cfg, store, "done-late", get_run_logger(), None, 0.1)
        return watch(cfg, store, Finished(), "j-1", guard, [], since, 0.1, False, get_run_logger())

    out = watch_it()
    assert out.end == "succeeded" and out.summary is not None and "budget" not in out.message


def test_crash_hook_posts_final_cost(webhook, tmp_path, monkeypatch):
    import flows.train_pipeline as pipeline

    def crash(config, **_):
        raise SystemExit("the flow process was told to exit")

    monkeypatch.setattr(pipeline, "smoke", crash)
    webhook.clear()
    with pytest.raises(SystemExit):
        pipeline.train_pipeline(run_config(tmp_path / "store", "crashy", max_usd=1.0))
    assert any("crashy crashed: spent $0.00 of" in m for m in messages(webhook, "crashy"))


def test_automations_file_loads_on_a_real_server(webhook):
    from prefect.client.orchestration import get_client
    from prefect.events.schemas.automations import AutomationCore

    from deployments.automations import install

    async def go():
        async with get_client() as client:  # an install by an earlier version: its cut-off raced the graceful stop
            await client.create_automation(AutomationCore.model_validate({
                "name": "thrifty-budget-cutoff", "trigger": {"type": "event", "expect": ["thrifty.budget.exceeded"]},
                "actions": [{"type": "cancel-flow-run", "source": "inferred"}]}))
            names = await install(client, notify_block="custom-webhook/thrifty-test")
            again = await install(client, notify_block="custom-webhook/thrifty-test")  # idempotent
            stored = {a.name: a for a in await client.read_automations()}
            for automation in stored.values():  # the session's server runs every later test's flows: left active,
                await client.delete_automation(automation.id)  # they would act on them (a webhook gone, cancels)
            return names, again, stored

    names, again, stored = asyncio.run(go())
    assert names == again == ["thrifty-budget-backstop", "thrifty-run-failed", "thrifty-zombie-run"]
    assert "thrifty-budget-cutoff" not in stored, "the retired cut-off is removed"
    backstop = stored["thrifty-budget-backstop"].trigger
    assert backstop.posture == "Proactive" and backstop.after == {"thrifty.budget.exceeded"}
    assert backstop.expect == {"thrifty.budget.stopped"} and backstop.within.total_seconds() >= 300
    assert stored["thrifty-budget-backstop"].actions[0].type == "cancel-flow-run"
    assert stored["thrifty-run-failed"].actions[0].type == "send-notification"
    alert = stored["thrifty-run-failed"].trigger  # every end that is not Completed, of a run, a search or a pass
    assert {f"prefect.flow-run.{s}" for s in ("Failed", "Crashed", "StoppedAtCap", "BadInput", "Cancelled")} \
        == alert.expect
    assert set(alert.match_related["prefect.resource.name"]) == {"thrifty-train", "thrifty-sweep", "thrifty-archive"}
    assert "flow_run.state.message" in stored["thrifty-run-failed"].actions[0].body  # names the run: its sentence
    assert len([a for a in stored.values() if a.name == "thrifty-budget-backstop"]) == 1
    # a run whose heartbeats stop is marked Crashed, never one that still beats: every deployment beats at least
    # three times within the window (prefect.yaml sets the beat; Prefect's own default, 180 s, would be too slow)
    zombie = stored["thrifty-zombie-run"]
    assert zombie.trigger.posture == "Proactive" and zombie.trigger.after == {"prefect.flow-run.heartbeat"}
    assert zombie.actions[0].type == "change-flow-run-state" and zombie.actions[0].state.value == "CRASHED"
    import yaml

    from conftest import REPO

    for dep in yaml.safe_load((REPO / "prefect.yaml").read_text())["deployments"]:
        beat_s = int(dep["work_pool"]["job_variables"]["env"]["PREFECT_FLOWS_HEARTBEAT_FREQUENCY"])
        assert 30 <= beat_s and 3 * beat_s <= zombie.trigger.within.total_seconds(), dep["name"]
