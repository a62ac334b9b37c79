"""prefect.yaml checked against the code, then end to end as a user would: a real Prefect server on
loopback, `thrifty deploy`, a process worker, and a `train` run started with UI-style parameters."""

from __future__ import annotations

import importlib
import json
import re
import subprocess
import time
import uuid
from pathlib import Path
from typing import Any, Iterator

import pytest
import yaml
from prefect import Flow

from deployments.deploy import WORK_POOL, WORK_POOL_TYPE
from conftest import REPO, python_env
from prefect_server import BIN, WORKER_ENV, Server, tail
from thrifty.archive import build_settings
from thrifty.config import build_config
from thrifty.money.ledger import read_attempts
from thrifty.numbers import money
from thrifty.storage import open_store

SPEC = yaml.safe_load((REPO / "prefect.yaml").read_text())
DEPLOYMENTS = {d["name"]: d for d in SPEC["deployments"]}
NIGHTLY_CRON, NIGHTLY_TZ = "0 3 * * *", "America/New_York"
WEEKLY_S = 7 * 24 * 3600  # every 7 days from a Sunday 05:00 New York (an interval: the list shows a cron as "+1")


def load_entrypoint(entrypoint: str) -> Any:
    path, func = entrypoint.split(":")
    assert (REPO / path).is_file(), f"entrypoint file {path} does not exist"
    module = importlib.import_module(".".join(Path(path).with_suffix("").parts))
    return getattr(module, func)


def strings(node: Any) -> Iterator[str]:
    if isinstance(node, dict):
        for value in node.values():
            yield from strings(value)
    elif isinstance(node, list):
        for value in node:
            yield from strings(value)
    elif isinstance(node, str):
        yield node


# ---------------------------------------------------------------- fast: prefect.yaml against the code


def test_prefect_yaml_matches_the_code():
    assert SPEC["name"] == "thrifty" and SPEC["prefect-version"] == "3.8.8"
    assert set(DEPLOYMENTS) == {"train", "nightly-retrain", "weekly-archive", "sweep"}
    assert "pull" not in SPEC and not any("pull" in d for d in DEPLOYMENTS.values()), \
        "no pull section: `prefect deploy` records the project directory itself"
    assert not [s for s in strings(SPEC) if s.startswith(("/", "~"))], "no machine paths in prefect.yaml"
    for name, dep in DEPLOYMENTS.items():
        flow = load_entrypoint(dep["entrypoint"])
        assert isinstance(flow, Flow), f"{name}: {dep['entrypoint']} is not a Prefect flow"
        assert dep["work_pool"]["name"] == WORK_POOL, f"{name} must use the pool deploy.py creates"
        params = dep.get("parameters") or {}
        assert set(params) <= set(flow.parameters.properties), f"{name}: unknown flow parameters"
        if "config" in params:
            build_config(params["config"], source=f"prefect.yaml {name}")  # raises ConfigError when invalid
    weekly = DEPLOYMENTS["weekly-archive"]
    build_settings({k: v for k, v in weekly["parameters"].items() if k != "dry_run"}, "prefect.yaml weekly-archive")
    assert weekly["concurrency_limit"] == 1
    [schedule] = weekly["schedules"]
    assert (schedule["interval"], schedule["timezone"]) == (WEEKLY_S, NIGHTLY_TZ)
    assert "America/New_York" in schedule["slug"], "the deployment page shows the slug: the zone in sight"
    # a manual run previews; the schedule carries its own parameters and applies
    assert weekly["parameters"]["dry_run"] is True and schedule["parameters"] == {"dry_run": False}
    # the sweep's UI form is the SweepConfig (its base is a RunConfig form of its own)
    sweep_params = load_entrypoint(DEPLOYMENTS["sweep"]["entrypoint"]).parameters
    assert sweep_params.properties["config"]["$ref"] == "#/definitions/SweepConfig"
    assert sweep_params.definitions["SweepConfig"]["properties"]["base"]["$ref"] == "#/definitions/TrialBase"
    trial_base = sweep_params.definitions["TrialBase"]["properties"]
    train_params = load_entrypoint(DEPLOYMENTS["train"]["entrypoint"]).parameters
    assert trial_base.keys() == train_params.definitions["RunConfig"]["properties"].keys(), \
        "a sweep's base is the whole RunConfig"
    assert trial_base["run_name"]["description"].startswith("Not used by a sweep")
    assert {"max_usd", "space", "eta", "min_epochs"} <= set(sweep_params.definitions["SweepConfig"]["properties"])
    nightly = DEPLOYMENTS["nightly-retrain"]
    assert nightly["parameters"]["config"]["run_name"] == "nightly-{date}"
    assert nightly["concurrency_limit"] == 1
    [schedule] = nightly["schedules"]
    assert (schedule["cron"], schedule["timezone"]) == (NIGHTLY_CRON, NIGHTLY_TZ)
    assert "America/New_York" in schedule["slug"] and "America/New_York" in nightly["description"]


def test_the_weekly_schedule_fires_sundays_at_0500_new_york_across_dst():
    """The interval keeps the cron's promise: every fire is a Sunday 05:00 in New York, winter and summer."""
    import asyncio
    import datetime as dt
    from zoneinfo import ZoneInfo

    from prefect.server.schemas.schedules import IntervalSchedule

    [raw] = DEPLOYMENTS["weekly-archive"]["schedules"]
    schedule = IntervalSchedule(interval=dt.timedelta(seconds=raw["interval"]),
                                anchor_date=dt.datetime.fromisoformat(raw["anchor_date"]), timezone=raw["timezone"])
    dates = schedule.get_dates(n=60, start=dt.datetime(2027, 1, 1, tzinfo=dt.timezone.utc))
    dates = asyncio.run(dates) if asyncio.iscoroutine(dates) else dates
    local = {d.astimezone(ZoneInfo(NIGHTLY_TZ)).strftime("%a %H:%M") for d in dates}
    assert local == {"Sun 05:00"} and len(dates) == 60
    assert {d.astimezone(dt.timezone.utc).hour for d in dates} == {9, 10}, "summer and winter both covered"


def test_form_schema_drops_null_defaults_and_keeps_the_rest():
    from deployments.deploy import form_schema
    from prefect.utilities.callables import parameter_schema

    from flows.train_pipeline import train_pipeline
    from thrifty.config import RunConfig

    schema = parameter_schema(train_pipeline.fn).model_dump()
    tidy = form_schema(schema)
    assert '"default": null' not in json.dumps(tidy) and '"default": null' in json.dumps(schema)
    # what the form sends for an untouched config is the same run: the defaults less their nulls
    assert RunConfig.model_validate(tidy["properties"]["config"]["default"]) == RunConfig()
    assert tidy["definitions"]["TrainConfig"]["properties"]["grad_clip"]["default"] == 1.0  # a real default stays
    assert tidy["properties"]["poll_s"] == schema["properties"]["poll_s"]
    assert form_schema(tidy) == tidy


def test_deploy_without_a_server_says_how_to_start_one(tmp_path):
    env = {k: v for k, v in python_env().items() if k != "PREFECT_API_URL"}
    env["PREFECT_HOME"] = str(tmp_path / "prefect")  # no profile that could name a server
    proc = subprocess.run([str(BIN / "thrifty"), "deploy"], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2, proc.stderr
    assert "prefect server start" in proc.stderr and "PREFECT_API_URL" in proc.stderr


def test_alerts_webhook_must_be_a_url_for_a_custom_webhook_block():
    from deployments.deploy import DeployError, create_webhook_block

    with pytest.raises(DeployError, match="not an http\\(s\\) URL") as bad_url:
        create_webhook_block("hooks.example/abc", None)
    with pytest.raises(DeployError, match="custom-webhook/NAME") as bad_block:
        create_webhook_block("https://hooks.example/abc", "slack-webhook/ops")
    assert bad_url.value.exit_code == bad_block.value.exit_code == 2


def test_pool_concurrency_must_be_positive_or_zero():
    from deployments.deploy import DeployError, set_pool_concurrency

    with pytest.raises(DeployError, match="at least 1") as err:
        set_pool_concurrency(WORK_POOL, -1)  # checked before the server is asked
    assert err.value.exit_code == 2


# ---------------------------------------------------------------- slow: a real server, deploy, worker, run


@pytest.fixture(scope="module")
def deployed(deployed_ui_server: Server) -> Server:
    """A fresh server with `thrifty deploy` run in the repo root, as a user would (shared with test_ui_browser)."""
    assert f"work pool '{WORK_POOL}' ({WORK_POOL_TYPE}) created" in deployed_ui_server.deploy_output.stderr
    return deployed_ui_server


@pytest.fixture(scope="module")
def worker(deployed: Server) -> subprocess.Popen:
    return deployed.worker


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_deployments_registered_on_the_server(deployed):
    with deployed.client() as client:
        pool = client.read_work_pool(WORK_POOL)
        train = client.read_deployment_by_name("thrifty-train/train")
        nightly = client.read_deployment_by_name("thrifty-train/nightly-retrain")
        weekly = client.read_deployment_by_name("thrifty-archive/weekly-archive")
        backstop = client.read_automations_by_name("thrifty-budget-backstop")
    assert pool.type == WORK_POOL_TYPE
    # no pull section in prefect.yaml: `prefect deploy` recorded the directory it ran in
    assert train.pull_steps == [{"prefect.deployments.steps.set_working_directory": {"directory": str(REPO)}}]
    assert train.work_pool_name == nightly.work_pool_name == WORK_POOL
    assert not train.schedules and train.global_concurrency_limit is None
    [schedule] = nightly.schedules
    assert (schedule.schedule.cron, schedule.schedule.timezone) == (NIGHTLY_CRON, NIGHTLY_TZ)
    assert schedule.active
    # deployment.concurrency_limit is always None in Prefect 3: the limit lives on a global concurrency limit
    assert nightly.global_concurrency_limit is not None and nightly.global_concurrency_limit.limit == 1
    assert nightly.parameters["config"]["run_name"] == "nightly-{date}"
    [schedule] = weekly.schedules
    assert (schedule.schedule.interval.total_seconds(), schedule.schedule.timezone) == (WEEKLY_S, NIGHTLY_TZ)
    assert weekly.work_pool_name == WORK_POOL and weekly.parameters["dry_run"] is True
    assert schedule.parameters == {"dry_run": False}
    assert train.enforce_parameter_schema and nightly.enforce_parameter_schema
    # the forms draw optional fields as inputs: thrifty deploy left no null default in any deployment's schema
    for dep in (train, nightly, weekly):
        assert ": null" not in json.dumps(dep.parameter_openapi_schema), dep.name
    preempt = train.parameter_openapi_schema["definitions"]["ComputeConfig"]["properties"]["preempt_after_steps"]
    assert {"type": "null"} in preempt["anyOf"], "null is still a value a client may send"
    # thrifty deploy installed the budget backstop (the failure alert needs a notification block): proactive, so it
    # only acts for a watch loop that said "exceeded" and never "stopped"
    assert len(backstop) == 1 and backstop[0].actions[0].type == "cancel-flow-run"
    assert backstop[0].trigger.posture == "Proactive" and backstop[0].trigger.expect == {"thrifty.budget.stopped"}


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_server_rejects_a_bad_config_before_any_worker_sees_it(deployed):
    # the server checks parameters against RunConfig's JSON schema, as the UI form does
    out = deployed.run(str(BIN / "prefect"), "deployment", "run", "thrifty-train/train",
                       "--param", 'config={"train": {"max_epochs": 0}}')
    assert out.returncode != 0
    assert "config.train.max_epochs" in out.stdout + out.stderr


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_train_deployment_runs_on_a_worker_and_survives_a_preemption(deployed, worker, tmp_path):
    run_name, store = f"e2e-{uuid.uuid4().hex[:8]}", tmp_path / "store"
    config = {  # what the UI's RunConfig form sends: a partial config, the rest are defaults
        "run_name": run_name, "recipe": "digits", "store": str(store),
        # 2 epochs (88 steps): the preemption lands at exactly step 20 (training.boundary)
        "train": {"max_epochs": 2, "micro_batch": 32, "precision": "fp32", "checkpoint_every": 10, "log_every": 5},
        "compute": {"preempt_after_steps": 20, "preempt_grace_s": 20},
    }
    out = deployed.run(str(BIN / "prefect"), "deployment", "run", "thrifty-train/train",
                       "--param", f"config={json.dumps(config)}", "--param", "poll_s=0.5")
    assert out.returncode == 0, f"prefect deployment run failed:\n{out.stdout}\n{out.stderr}"
    match = re.search(r"UUID: ([0-9a-f\-]{36})", out.stdout)
    assert match, out.stdout
    flow_run_id = match.group(1)

    deadline = time.monotonic() + 240
    with deployed.client() as client:
        while True:
            flow_run = client.read_flow_run(flow_run_id)
            if flow_run.state is not None and flow_run.state.is_final():
                break
            assert worker.poll() is None, f"worker exited {worker.returncode}:\n{tail(deployed.home / 'worker.log')}"
            assert time.monotonic() < deadline, (f"flow run still {flow_run.state_name} after 4 min:\n"
                                                 f"{tail(deployed.home / 'worker.log')}")
            time.sleep(0.25)
    assert flow_run.state.is_completed(), \
        f"flow run ended {flow_run.state_name}: {flow_run.state.message}\n{tail(deployed.home / 'worker.log')}"
    assert flow_run.name == run_name  # flow_run_name="{config.run_name}"
    assert flow_run.parameters["config"]["store"] == str(store)

    run_dir = store / "runs" / run_name
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["resumes"] == 1
    assert 0.0 <= summary["final_metrics"]["val_accuracy"] <= 1.0
    rows = [a.row() for a in read_attempts(open_store(str(store)), run_name)]
    assert [r["end_reason"] for r in rows] == ["preempted", "succeeded"]
    assert sorted(p.name for p in (run_dir / "logs").glob("*/attempt-*.log")) == ["attempt-1.log", "attempt-2.log"]


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_a_deployed_run_stopped_at_its_cap_ends_failed_with_its_report(deployed, worker, tmp_path):
    """Issue 9.2/9.3: deployed (poll_s 5, automations installed), a capped run is stopped by its own watch loop,
    reported, and ends Failed ('StoppedAtCap') under its cap; the backstop automation never cancels it."""
    from thrifty.money import savings
    from thrifty.money.budget import spend_usd

    # ~18 s of spend: the first checkpoint (step 25) comes within a few seconds of billing even on a loaded machine;
    # 26,700 steps at the worker's pace of at least 2 ms a step (WORKER_ENV) cannot end before the cap
    run_name, store, cap = f"capped-{uuid.uuid4().hex[:8]}", tmp_path / "store", 0.2
    assert 300 * 89 * float(WORKER_ENV["THRIFTY_MIN_STEP_S"]) > 2 * cap / (39.33 / 3600)
    config = {"run_name": run_name, "recipe": "digits", "store": str(store), "recipe_params": {"hidden": 64},
              "train": {"max_epochs": 300, "micro_batch": 16, "precision": "fp32", "checkpoint_every": 25,
                        "early_stopping": {"enabled": False}},
              "compute": {"emulate": "aws:p5.48xlarge"},  # ~1.1 cents a second
              "budget": {"max_usd": cap, "allow_over_budget": True, "stop_margin_s": 3}}
    out = deployed.run(str(BIN / "prefect"), "deployment", "run", "thrifty-train/train",
                       "--param", f"config={json.dumps(config)}")  # the deployment's poll_s: 5 s
    assert out.returncode == 0, f"prefect deployment run failed:\n{out.stdout}\n{out.stderr}"
    flow_run_id = re.search(r"UUID: ([0-9a-f\-]{36})", out.stdout).group(1)
    deadline = time.monotonic() + 240
    with deployed.client() as client:
        while not ((flow_run := client.read_flow_run(flow_run_id)).state and flow_run.state.is_final()):
            assert time.monotonic() < deadline, f"still {flow_run.state_name}:\n{tail(deployed.home / 'worker.log')}"
            time.sleep(0.25)
    assert flow_run.state.type.value == "FAILED" and flow_run.state_name == "StoppedAtCap", \
        f"{flow_run.state_name}: {flow_run.state.message}\n{tail(deployed.home / 'worker.log')}"
    assert "stopped at its budget cap" in flow_run.state.message and "checkpoint at step" in flow_run.state.message
    s = open_store(str(store))
    spent = spend_usd(read_attempts(s, run_name))
    assert spent <= cap, f"spent ${spent:.4f} of ${cap}"
    report = savings.read(s, run_name)
    assert report is not None and report.state == "budget"
    # the capped run's summary, as the UI draws it, fits the artifact pane (it was 1,636 px wide in 828)
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterKey

    from browser import browser_page, too_wide

    with deployed.client() as client:
        [summary] = client.read_artifacts(artifact_filter=ArtifactFilter(key=ArtifactFilterKey(
            any_=[f"thrifty-summary-{run_name}"])))
    with browser_page(deployed.url) as page:
        page.goto(f"/artifacts/artifact/{summary.id}")
        page.get_by_text("Loss and spend").first.wait_for()
        assert page.get_by_text("stopped at its budget cap").first.is_visible()
        wide = too_wide(page)
        page.screenshot(path=str(tmp_path / "capped-summary.png"), full_page=True)
        assert not wide, f"the capped run's summary must fit without scrolling sideways: {wide}"



@pytest.mark.slow
@pytest.mark.timeout(600)
def test_a_run_cancelled_from_the_ui_stops_its_job_and_leaves_its_report(deployed, worker, tmp_path):
    """The UI's Cancel (the flow run set Cancelling): the job is stopped with a checkpoint first, the run ends
    Cancelled with its own sentence (spend, checkpoint, what next; never 'cancelling'), and its summary, attempts
    and savings are written as for any other end; no crash, no 'Finished in state Running()'."""
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId
    from prefect.states import Cancelling

    from thrifty.money import savings
    from thrifty.money.budget import spend_usd
    from thrifty.runs.checkpoints import committed

    run_name, store = f"cancel-{uuid.uuid4().hex[:8]}", tmp_path / "store"
    config = {"run_name": run_name, "recipe": "digits", "store": str(store),
              "train": {"max_epochs": 2000, "micro_batch": 32, "precision": "fp32", "checkpoint_every": 10,
                        "early_stopping": {"enabled": False}},
              "budget": {"max_usd": 5.0}}
    out = deployed.run(str(BIN / "prefect"), "deployment", "run", "thrifty-train/train",
                       "--param", f"config={json.dumps(config)}", "--param", "poll_s=0.5")
    assert out.returncode == 0, f"prefect deployment run failed:\n{out.stdout}\n{out.stderr}"
    flow_run_id = re.search(r"UUID: ([0-9a-f\-]{36})", out.stdout).group(1)
    s = open_store(str(store))
    deadline = time.monotonic() + 240
    while not committed(s, run_name):  # training, with a checkpoint to keep
        assert time.monotonic() < deadline, f"no checkpoint yet:\n{tail(deployed.home / 'worker.log')}"
        assert worker.poll() is None, tail(deployed.home / "worker.log")
        time.sleep(0.5)
    with deployed.client() as client:
        client.set_flow_run_state(flow_run_id, Cancelling(), force=True)  # what the UI's Cancel button sends
    deadline = time.monotonic() + 240
    with deployed.client() as client:
        while not ((flow_run := client.read_flow_run(flow_run_id)).state and flow_run.state.is_final()):
            assert time.monotonic() < deadline, f"still {flow_run.state_name}:\n{tail(deployed.home / 'worker.log')}"
            time.sleep(0.5)
        artifacts = {a.key for a in client.read_artifacts(flow_run_filter=FlowRunFilter(
            id=FlowRunFilterId(any_=[flow_run.id]))) if a.key}
    log = tail(deployed.home / "worker.log", 200_000)
    message = flow_run.state.message or ""
    assert flow_run.state_name == "Cancelled", f"{flow_run.state_name}: {message}\n{log[-4000:]}"
    assert message.startswith(f"run {run_name} was cancelled: spent $") and "cancelling" not in message.lower()
    assert "its checkpoint at step" in message and "Next: Run it again with the same run_name" in message
    attempts = read_attempts(s, run_name)
    assert attempts and all(a.ended_unix is not None for a in attempts), "the job was stopped, its ledger closed"
    spent = spend_usd(attempts)
    assert f"spent {money(spent)}" in message
    figures = savings.read(s, run_name)
    assert figures is not None and figures.state == "cancelled" and figures.end == message
    key = re.sub(r"[^a-z0-9-]+", "-", run_name)
    assert {f"thrifty-summary-{key}", f"thrifty-attempts-{key}", "thrifty-savings"} <= artifacts, artifacts
    mine = [line for line in log.splitlines() if run_name in line or flow_run_id in line]
    assert not [line for line in mine if "Finished in state Running()" in line or "Crash detected" in line], mine
