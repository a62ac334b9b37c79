"""Budget guardrails: alerts once per threshold, burn-rate alerts without fatigue, the cap, the gate, hooks."""

from __future__ import annotations

import asyncio
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from thrifty.budget import AlertState, OverBudgetPlan, Snapshot, due_alerts, estimate_run, gate
from thrifty.config import BudgetConfig, build_config


# ----------------------------------------------------------------------------- pure functions


def snap(spend: float, burn: float = 1.0, gpu_hours: float = 0.0, max_usd: float = 10.0) -> Snapshot:
    return Snapshot(spend, burn, gpu_hours, spend, None, spend / max_usd)


def test_each_threshold_alerts_once_and_cap_is_exceeded():
    budget = BudgetConfig(max_usd=10.0, thresholds=[0.5, 0.8, 1.0], burn_rate_alert_usd_per_hour=None, stop_margin_s=0)
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


def test_cap_leaves_a_margin_for_the_graceful_stop():
    budget = BudgetConfig(max_usd=10.0, thresholds=[1.0], burn_rate_alert_usd_per_hour=None, stop_margin_s=600)
    # burning $36/h, 600 s of margin is $6: stop at $4 spent, not at $10
    assert [a.kind for a in due_alerts(snap(3.9, burn=36.0), budget, AlertState(), "r", 0.0)] == []
    assert [a.kind for a in due_alerts(snap(4.1, burn=36.0), budget, AlertState(), "r", 0.0)] == ["exceeded"]


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


def test_gate_refuses_an_over_budget_plan_and_says_what_to_change():
    est = estimate_run(10_000, 0.001, 32, usd_per_hour=1.0, nodes=1, accelerator="A10G:1", launcher="skypilot")
    assert est.hours > 0 and "16x per A10G" in est.assumption
    with pytest.raises(OverBudgetPlan) as err:
        gate(est, BudgetConfig(max_usd=0.01))
    for hint in ("estimated cost", "budget.max_usd", "train.max_epochs", "allow_over_budget"):
        assert hint in str(err.value)
    gate(est, BudgetConfig(max_usd=0.01, allow_over_budget=True))  # the user's override


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
        "run_name": run_name, "recipe": "digits", "store": str(store),
        "recipe_params": {"hidden": 512},  # slow enough that the cap lands mid-training, even on a quiet machine
        "train": {"max_epochs": 60, "micro_batch": 16, "precision": "fp32", "checkpoint_every": 25, "log_every": 5,
                  **(train or {})},
        # p5.48xlarge spot (~$39/h = ~1 cent a second) makes a seconds-long local run cost real cents
        "compute": {"emulate": "aws:p5.48xlarge", "preempt_grace_s": 20},
        "budget": {"notify": ["custom-webhook/thrifty-test"], "allow_over_budget": True, "stop_margin_s": 2.0,
                   **budget},
    })


def messages(received: list[dict], run: str) -> list[str]:
    return [m["body"] for m in received if f"run {run} " in m["body"]]


def test_one_alert_per_threshold_crossed(webhook, tmp_path):
    from flows.train_pipeline import train_pipeline

    webhook.clear()
    cfg = run_config(tmp_path / "store", "alerts", max_usd=1.0, thresholds=[0.02, 0.04],
                     burn_rate_alert_usd_per_hour=10.0)
    out = train_pipeline(cfg, poll_s=0.2)
    assert out.cost_usd > 0.04, "the run must cost enough to cross both thresholds"
    got = messages(webhook, "alerts")
    assert sum("2% of its $1 budget" in m for m in got) == 1
    assert sum("4% of its $1 budget" in m for m in got) == 1
    assert sum("above the $10/hour alert level" in m for m in got) == 1
    assert sum("starting: budget $1" in m for m in got) == 1, "on_running hook"
    assert sum("alerts completed: spent $" in m and "saved $" in m for m in got) == 1, "on_completion hook"
    alerts = json.loads((tmp_path / "store" / "runs" / "alerts" / "budget-alerts.json").read_text())
    assert len(alerts["fired"]) == 2


def test_hard_cap_stops_with_checkpoint_then_resumes_with_larger_budget(webhook, tmp_path, capsys):
    from flows.train_pipeline import train_pipeline

    store = tmp_path / "store"
    cap = 0.12  # ~11 s at ~1 cent a second: training is well under way (start-up takes a few seconds)
    # no early stopping and many epochs: the run cannot finish before the cap
    long_run = {"max_epochs": 300, "early_stopping": {"enabled": False}}
    state = train_pipeline(run_config(store, "capped", long_run, max_usd=cap, burn_rate_alert_usd_per_hour=None),
                           poll_s=0.2, return_state=True)
    assert state.is_failed()
    assert "stopped at its budget cap" in state.message and "budget.max_usd" in state.message
    ledger = [json.loads(line) for line in (store / "runs" / "capped" / "ledger.jsonl").read_text().splitlines()]
    assert [r["end_reason"] for r in ledger] == ["cancelled"]
    spent = sum((r["ended_unix"] - r["started_unix"]) / 3600 * r["usd_per_hour"] for r in ledger)
    assert spent <= cap * 1.1, f"spent ${spent:.4f}: the stop margin keeps the overshoot small"
    assert not (store / "runs" / "capped" / "summary.json").exists()
    ckpts = sorted(p.parent.name for p in (store / "runs" / "capped" / "ckpt").glob("*/COMMIT"))
    assert ckpts, "the graceful cancel must leave a complete checkpoint"
    assert any("capped failed: spent $" in m for m in messages(webhook, "capped")), "on_failure hook"

    out = train_pipeline(run_config(store, "capped", max_usd=5.0, burn_rate_alert_usd_per_hour=None), poll_s=0.2)
    summary = out.summary
    assert summary.resumes >= 1 and summary.status in ("completed", "stopped_early")
    ledger = [json.loads(line) for line in (store / "runs" / "capped" / "ledger.jsonl").read_text().splitlines()]
    assert [r["end_reason"] for r in ledger] == ["cancelled", "succeeded"]
    assert out.savings.actual_usd == pytest.approx(sum(
        (r["ended_unix"] - r["started_unix"]) / 3600 * r["usd_per_hour"] for r in ledger), abs=1e-5)  # figures are rounded to 6 places
    assert out.savings.levers_usd["spot"] > 0 and out.savings.naive_usd > out.savings.actual_usd

    from thrifty.cli import main

    assert main(["report", "--set", f"store={store}"]) == 0
    printed = capsys.readouterr().out
    assert "capped" in printed and "1 run(s): spent $" in printed


def test_pre_launch_gate_refuses_over_budget_plan(prefect_harness, tmp_path):
    from flows.train_pipeline import train_pipeline

    store = tmp_path / "store"
    cfg = run_config(store, "gated", max_usd=0.001, allow_over_budget=False)
    state = train_pipeline(cfg, return_state=True)
    assert state.is_failed() and "OverBudgetPlan" in state.message and "estimated cost" in state.message
    assert not (store / "runs" / "gated" / "ledger.jsonl").exists(), "nothing launched"


def test_crash_hook_posts_final_cost(webhook, tmp_path, monkeypatch):
    import flows.train_pipeline as pipeline

    def crash(config):
        raise SystemExit("the flow process was told to exit")

    monkeypatch.setattr(pipeline, "smoke", crash)
    webhook.clear()
    with pytest.raises(SystemExit):
        pipeline.train_pipeline(run_config(tmp_path / "store", "crashy", max_usd=1.0))
    assert any("crashy crashed: spent $0.0000" in m for m in messages(webhook, "crashy"))


def test_automations_file_loads_on_a_real_server(webhook):
    from prefect.client.orchestration import get_client

    from deployments.automations import install

    async def go():
        async with get_client() as client:
            names = await install(client, notify_block="custom-webhook/thrifty-test")
            again = await install(client, notify_block="custom-webhook/thrifty-test")  # idempotent
            stored = {a.name: a for a in await client.read_automations()}
            return names, again, stored

    names, again, stored = asyncio.run(go())
    assert names == again == ["thrifty-budget-cutoff", "thrifty-run-failed"]
    assert stored["thrifty-budget-cutoff"].trigger.expect == {"thrifty.budget.exceeded"}
    assert stored["thrifty-budget-cutoff"].actions[0].type == "cancel-flow-run"
    assert stored["thrifty-run-failed"].actions[0].type == "send-notification"
    assert len([a for a in stored.values() if a.name == "thrifty-budget-cutoff"]) == 1
