"""The Prefect UI as a user meets it, in a real browser: Debian's chromium driven by Playwright against a real Prefect
server (with its UI) and a process worker on loopback, after `thrifty deploy`. Every non-loopback address is blocked
in the browser.

It fills the `train` form (run_name, max_epochs, max_usd), submits, waits for Completed, and checks what the run
shows: its name and tag, the preemption and resume in its logs, and the summary (with the chart image), attempts and
savings artifacts. Also a bad value's toast, the nightly run's name, and the archive's manual run previewing.
Screenshots of each page go to $THRIFTY_UI_SHOTS or a temporary folder; the test prints which.
"""

from __future__ import annotations

import base64
import datetime as dt
import os
import re
import subprocess
import sys
import time
import uuid
from contextlib import nullcontext
from pathlib import Path
from typing import Any, Iterator

import pytest

from browser import browser_page, too_wide
from prefect_server import Server, tail, wait_final

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

@pytest.fixture(scope="module")
def shots(tmp_path_factory, request) -> Path:
    folder = Path(os.environ.get("THRIFTY_UI_SHOTS") or tmp_path_factory.mktemp("ui-screenshots"))
    folder.mkdir(parents=True, exist_ok=True)
    capture = request.config.pluginmanager.get_plugin("capturemanager")
    with capture.global_and_fixture_disabled() if capture else nullcontext():
        print(f"\nscreenshots of the Prefect UI: {folder}", file=sys.stderr)
    return folder


@pytest.fixture(scope="module")
def ui(deployed_ui_server: Server) -> Server:
    """The server with its UI, deployed, with a worker serving the pool (shared with test_deployments_e2e)."""
    return deployed_ui_server


@pytest.fixture(scope="module")
def page(ui: Server, shots: Path) -> Iterator[Any]:
    with browser_page(ui.url) as pg:
        yield pg


def snap(page: Any, shots: Path, name: str, full: bool = True) -> Path:
    """A screenshot of the whole page, the UI's inner scroll area included."""
    path = shots / f"{name}.png"
    if full:
        height = page.evaluate("() => Math.max(...[...document.querySelectorAll('*')].map(e => e.scrollHeight))")
        page.set_viewport_size({"width": 1400, "height": max(1000, min(int(height), 8000))})
    page.screenshot(path=str(path))
    page.set_viewport_size({"width": 1400, "height": 1000})
    return path


def field(page: Any, label: str) -> Any:
    """The input of the form property labelled ``label`` (its own input, not a nested property's)."""
    prop = page.locator(f"xpath=//span[contains(@class,'schema-form-property__label') and normalize-space()="
                        f"'{label}']/ancestor::div[contains(concat(' ',@class,' '),' schema-form-property ')][1]")
    return prop.locator("xpath=./div[contains(@class,'p-label__body')]//*[self::input or self::textarea]").first


def deployment_id(ui: Server, name: str) -> str:
    with ui.client() as client:
        return str(client.read_deployment_by_name(name).id)


def train_runs_named(ui: Server, run_name: str) -> list[Any]:
    """The train deployment's flow runs whose config names ``run_name``."""
    from prefect.client.schemas.filters import DeploymentFilter, DeploymentFilterId

    with ui.client() as client:
        runs = client.read_flow_runs(deployment_filter=DeploymentFilter(id=DeploymentFilterId(
            any_=[deployment_id(ui, "thrifty-train/train")])))
    return [r for r in runs if (r.parameters.get("config") or {}).get("run_name") == run_name]


def open_form(page: Any, ui: Server) -> None:
    page.goto(f"/deployments/deployment/{deployment_id(ui, 'thrifty-train/train')}/run")
    field(page, "Max Epochs (Optional)").wait_for()


def submit_once(page: Any, ui: Server, run_name: str, shots: Path) -> None:
    """Submit the form as a user would: click, and click again only if, half a minute on, the page is still the form
    and the server holds no flow run for it (seen now and then in a suite on 2 cores: a click that created nothing)."""
    from playwright.sync_api import TimeoutError as PlaywrightTimeout

    # the form's own address matches /deployments/deployment/ too: wait until the UI has left it (the submit took)
    left_form = "() => !location.pathname.replace(/\\/$/, '').endsWith('/run')"
    for click in range(1, 4):
        page.get_by_role("button", name="Submit").click()
        try:
            page.wait_for_function(left_form, timeout=30_000)
            return
        except PlaywrightTimeout:
            if train_runs_named(ui, run_name):
                print(f"click {click} on Submit: the run exists on the server; the page had not left the form")
                return
            snap(page, shots, f"01-submit-not-taken-{click}", full=False)
            print(f"click {click} on Submit: after 30 s no flow run on the server and the form still open")
    raise AssertionError(f"three clicks on Submit created no flow run; screenshots in {shots}")


def artifact_ids(ui: Server, flow_run_id: str) -> dict[str, str]:
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterFlowRunId

    with ui.client() as client:
        found = client.read_artifacts(artifact_filter=ArtifactFilter(flow_run_id=ArtifactFilterFlowRunId(
            any_=[flow_run_id])))
    return {a.key: str(a.id) for a in found if a.key}


def run_logs(ui: Server, flow_run_id: str) -> str:
    from prefect.client.schemas.filters import LogFilter, LogFilterFlowRunId

    with ui.client() as client:
        logs = client.read_logs(log_filter=LogFilter(flow_run_id=LogFilterFlowRunId(any_=[flow_run_id])))
    return "\n".join(f"{log.level} {log.message[:300]}" for log in logs)


def test_train_form_runs_to_completed_and_its_artifacts_render(ui, page, shots, tmp_path):
    run_name, store = f"ui-{uuid.uuid4().hex[:6]}", tmp_path / "store"
    open_form(page, ui)
    form = page.locator("main, body").first.inner_text()
    assert "/runs/RUN_NAME/" in form and "/runs//" not in form, "the run_name description must survive the markdown"
    assert "wins over the form's top 'Run Name'" in form
    assert "is a const" not in form, "'auto' must read as a choice"
    assert "Seconds between looks at the job's status" in form, "poll_s has a description"
    assert "digits: hidden" in form, "recipe_params lists the recipe's options"
    assert 'Property is type "None"' not in form, "an optional field left at its default shows its input, empty"
    field(page, "Run Name (Optional)").fill(run_name)
    field(page, "Store (Optional)").fill(str(store))
    field(page, "Max Epochs (Optional)").fill("3")  # 66 steps; the preemption lands at exactly step 20
    field(page, "Max Usd (Optional)").fill("1")
    field(page, "Preempt After Steps (Optional)").fill("20")  # one preemption, so the logs show a resume
    field(page, "Preempt Grace S (Optional)").fill("20")
    field(page, "poll_s (Optional)").fill("0.5")
    snap(page, shots, "01-train-form")
    submit_once(page, ui, run_name, shots)
    from playwright.sync_api import TimeoutError as PlaywrightTimeout

    try:  # the UI's toast: it lives a few seconds, which a page starved by a loaded machine can draw too late to see
        page.get_by_text("scheduled to start").first.wait_for(timeout=20_000)
    except PlaywrightTimeout:
        print("the 'scheduled to start' toast was not seen (a loaded machine); the run is checked on the server")
    snap(page, shots, "02-submitted", full=False)
    mine = []
    for _ in range(120):  # the UI has left the form once the server took the run; a loaded server may list it late
        if mine := train_runs_named(ui, run_name):
            break
        time.sleep(0.5)
    [flow_run_id] = [str(r.id) for r in mine]
    page.goto(f"/runs/flow-run/{flow_run_id}")

    flow_run = wait_final(ui, flow_run_id, ui.worker)
    assert flow_run.state.is_completed(), \
        f"{flow_run.state_name}: {flow_run.state.message}\n{tail(ui.home / 'worker.log')}"
    assert flow_run.name == run_name and f"thrifty-run:{run_name}" in flow_run.tags
    with ui.client() as client:
        from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterTags

        same = client.read_flow_runs(flow_run_filter=FlowRunFilter(tags=FlowRunFilterTags(
            all_=[f"thrifty-run:{run_name}"])))
    assert len(same) == 1, "one submit, one flow run"
    assert flow_run.parameters["config"]["budget"]["max_usd"] == 1
    assert flow_run.parameters["config"]["train"]["max_epochs"] == 3
    # 26.1: the Completed state's message is the run's one line: spent, saved, best metric at its step, what next
    message = flow_run.state.message or ""
    assert re.match(rf"run {run_name} completed: spent \$[0-9.]+ of its \$1 budget \(\d+%\); saved \$[0-9.]+ \(\d+%\)",
                    message) and re.search(r"val_\w+ [0-9.]+ at step \d+", message) and "Next:" in message, message
    assert "None" not in message and "\n" not in message

    page.reload()
    page.get_by_text("Completed").first.wait_for()
    page.get_by_text(f"thrifty-run:{run_name}").first.wait_for()
    # the log list loads after the page ("Waiting for logs..."): wait for its last line, the final cost
    page.get_by_text(re.compile(r"spent \$[0-9.]+ of its \$1 budget")).first.wait_for(timeout=60_000)
    snap(page, shots, "03-flow-run-logs")
    shown = page.locator("body").inner_text()
    for line in ("attempt 1 ended: preempted", "attempt 2 started", r"resumed from step \d+ of \d+",
                 f"Thrifty run {run_name}: its first flow run", r"spent \$[0-9.]+ of its \$1 budget"):
        assert re.search(line, shown), f"{line!r} not in the run's logs in the UI:\n{run_logs(ui, flow_run_id)}"
    assert "Traceback" not in shown
    # the tag is no link in the UI: the first log line carries the address of the runs page filtered by it
    runs_link = page.locator(f'a[href*="/runs?tag=thrifty-run%3A{run_name}&"]')
    assert runs_link.count() == 1, "the start log line's link to every flow run of the run"
    page.get_by_text("Artifacts", exact=True).first.click()  # the progress cards say spend against the budget
    page.get_by_text(re.compile(r"\$[0-9.]+ of \$1 budget \(\d+%\)")).first.wait_for()
    snap(page, shots, "03b-flow-run-artifacts", full=False)

    keys = artifact_ids(ui, flow_run_id)
    summary_key, attempts_key = f"thrifty-summary-{run_name}", f"thrifty-attempts-{run_name}"
    assert {summary_key, attempts_key, "thrifty-savings"} <= set(keys), keys

    page.goto(f"/artifacts/artifact/{keys[summary_key]}")
    page.get_by_text("Loss and spend").first.wait_for()
    chart = page.get_by_role("img", name="loss and spend over time")
    chart.wait_for()
    assert chart.evaluate("img => img.complete && img.naturalWidth") > 100, "the chart image must render"
    svg = base64.b64decode(chart.get_attribute("src").split("base64,", 1)[1]).decode()
    # 26.5: the validation metric beside the loss, labelled axes, the spend line's end and the $1 budget (a cap far
    # above the spend is named, not drawn)
    assert "; val_loss " in svg and ">loss" in svg and "spend (USD)</text>" in svg and "optimizer step;" in svg
    assert re.search(r">spend \$[0-9.]+ of \$1(\.00)? cap", svg), "the spend line's end against the budget"
    text = page.locator("body").inner_text()
    # 26.1: the summary opens (after its title and the link to every flow run of the run) with the state's line
    assert message[:80] in text.split("Loss and spend")[0], "the summary artifact opens with the headline"
    assert "2 in 1 job(s), 1 preemption(s) survived, 1 resume(s)" in text
    assert "-0.00000" not in text and "0.0 h" not in text
    best = re.search(r"best val_loss\s+([0-9.]+) at step", text)
    assert best and len(best.group(1).replace(".", "").lstrip("0")) <= 4, "metrics read to 4 significant digits"
    snap(page, shots, "04-summary-artifact")
    link = page.get_by_role("link", name=f"Every flow run of {run_name}")  # the summary's link to the run's runs
    href = link.get_attribute("href")
    assert href and href.startswith(f"{ui.url}/runs?tag=thrifty-run%3A{run_name}&"), href
    page.goto(href)  # (the UI opens an artifact's links in a new tab)
    page.get_by_text("1 run", exact=True).first.wait_for()  # exactly the tagged one ("one submit, one flow run")
    page.get_by_text(run_name, exact=True).first.wait_for()
    assert page.get_by_text(f"thrifty-run:{run_name}").count() >= 1, "the filter names the tag"
    snap(page, shots, "04b-every-flow-run-of-the-run", full=False)

    page.goto(f"/artifacts/artifact/{keys[attempts_key]}")
    page.get_by_text("preempted", exact=True).first.wait_for()
    page.get_by_text("succeeded", exact=True).first.wait_for()
    assert not too_wide(page), ("the attempts table must fit without scrolling sideways", too_wide(page))
    snap(page, shots, "05-attempts-artifact")

    page.goto(f"/artifacts/artifact/{keys['thrifty-savings']}")
    page.get_by_text(run_name, exact=True).first.wait_for()
    assert not too_wide(page), ("the savings table must fit without scrolling sideways", too_wide(page))
    savings_text = page.locator("body").inner_text()
    # 26.2: a saved-$ column, a total row, states as the README names them
    assert "saved $" in savings_text and re.search(r"total \(\d+ runs\)", savings_text), savings_text[:2000]
    assert "succeeded" not in savings_text and "budget\t" not in savings_text
    snap(page, shots, "06-savings-artifact")
    # 26.4: the team's month by lever and by tag, refreshed at the run's end
    page.goto(f"/artifacts/artifact/{artifact_ids(ui, flow_run_id)['thrifty-team']}")
    page.get_by_text(re.compile(r"lever", re.I)).first.wait_for()
    team_text = page.locator("body").inner_text()
    assert "spot" in team_text and "saved $" in team_text, team_text[:2000]
    assert not too_wide(page), ("the team's tables must fit", too_wide(page))
    snap(page, shots, "06b-team-artifact")
    assert not page.blocked, f"the UI tried to reach beyond loopback: {page.blocked[:5]}"


def test_a_bad_value_gets_a_clear_toast_and_a_bad_name_the_rule(ui, page, shots):
    """The server checks the form against the schema before a flow run exists: a bad number or run name is refused
    at the form, with the field's path, and no flow run is created for it."""
    for label, value, path, why, shot in (
            ("Max Epochs (Optional)", "0", "config.train.max_epochs", "0 is less than the minimum of 1",
             "07-bad-value-toast"),
            ("Run Name (Optional)", "my run!", "config.run_name",
             "'my run!' does not match '^[A-Za-z0-9][-A-Za-z0-9._{}]{0,62}$'", "07b-bad-name-toast")):
        open_form(page, ui)
        field(page, label).fill(value)
        page.get_by_role("button", name="Submit").click()
        toast = page.get_by_text(re.compile(f"Validation failed for field '{re.escape(path)}'"))
        toast.first.wait_for()
        assert why in toast.first.inner_text()
        snap(page, shots, shot, full=False)
        assert page.url.rstrip("/").endswith("/run"), "the form stays open for the fix"
    assert train_runs_named(ui, "my run!") == [], "a refused form creates no flow run"


def test_nightly_run_is_named_by_its_date(ui, page, shots, tmp_path):
    """Started as the schedule would (the deployment's config, '{date}' and all), on a small data set."""
    with ui.client() as client:
        dep = client.read_deployment_by_name("thrifty-train/nightly-retrain")
        config = {**dep.parameters["config"], "store": str(tmp_path / "store"), "recipe_params": {"limit": 400},
                  "train": {"max_epochs": 1}}
        flow_run = client.create_flow_run_from_deployment(dep.id, parameters={"config": config, "poll_s": 0.5})
    assert config["run_name"] == "nightly-{date}"
    done = wait_final(ui, str(flow_run.id), ui.worker)
    expected = f"nightly-{done.expected_start_time.astimezone(dt.timezone.utc):%Y%m%d}"
    assert done.state.is_completed(), f"{done.state_name}: {done.state.message}"
    assert done.name == expected
    page.goto(f"/runs/flow-run/{flow_run.id}")
    page.get_by_text(expected).first.wait_for()
    assert "{date}" not in page.locator("body").inner_text().split("Parameters")[0]
    snap(page, shots, "08-nightly-run", full=False)


def test_a_manual_archive_run_previews(ui, page, shots, tmp_path):
    """A manual run of weekly-archive keeps the deployment's dry_run (true); only its schedule applies."""
    store = tmp_path / "store"
    (store / "runs").mkdir(parents=True)
    from deployments.upcoming import upcoming_runs

    with ui.client() as client:
        dep = client.read_deployment_by_name("thrifty-archive/weekly-archive")
        [schedule] = dep.schedules
        assert dep.parameters["dry_run"] is True and schedule.parameters == {"dry_run": False}
        latest = upcoming_runs(client, dep.id)[-1]  # as the scheduler adds a run: a random name
        client.update_flow_run(latest.id, name="random-heron")
        flow_run = client.create_flow_run_from_deployment(dep.id, parameters={"store": str(store)})
    done = wait_final(ui, str(flow_run.id), ui.worker)
    with ui.client() as client:
        assert client.read_flow_run(latest.id).name == f"apply-archive-tier-{latest.expected_start_time:%Y%m%d}", \
            "a run of the deployment names its upcoming runs as it starts and ends"
    assert done.state.is_completed(), f"{done.state_name}: {done.state.message}"
    assert done.parameters["dry_run"] is True
    assert re.fullmatch(r"preview-archive-tier-\d{8}", done.name), done.name
    page.goto(f"/runs/flow-run/{flow_run.id}")
    page.get_by_text(done.name).first.wait_for()
    snap(page, shots, "09-archive-preview-run", full=False)
    keys = artifact_ids(ui, str(flow_run.id))
    page.goto(f"/artifacts/artifact/{keys['thrifty-archive']}")
    page.get_by_text(re.compile("dry run|preview", re.I)).first.wait_for()
    snap(page, shots, "10-archive-preview-artifact")


def runtime_name(ui: Server, flow_run_id: Any, flow_name: str, monkeypatch: Any) -> str:
    """The name the flow gives this flow run when it starts: its runtime callable, reading the run from the server."""
    from prefect.settings import PREFECT_API_URL, temporary_settings

    from flows.run_names import archive_run_name, train_run_name

    monkeypatch.setenv("PREFECT__FLOW_RUN_ID", str(flow_run_id))
    with temporary_settings(updates={PREFECT_API_URL: ui.api_url}):
        return train_run_name() if flow_name == "thrifty-train" else archive_run_name()


def test_upcoming_runs_carry_their_names_and_the_schedules_their_zone(ui, page, shots, monkeypatch):
    """`thrifty deploy` scheduled and named the upcoming runs: each under the name the flow gives it when it starts.
    The deployments list shows each schedule as one tag (no "+1") and its zone on hover; the deployment's page shows
    the zone in the schedule's name, and the next run by its name."""
    from deployments.upcoming import upcoming_runs
    from thrifty.runs.names import flow_run_name

    assert "upcoming runs of nightly-retrain: nightly-" in ui.deploy_output.stderr
    next_names = {}
    for name in ("thrifty-train/nightly-retrain", "thrifty-archive/weekly-archive"):
        flow_name = name.split("/")[0]
        with ui.client() as client:
            dep = client.read_deployment_by_name(name)
            runs = upcoming_runs(client, dep.id)
        assert runs, f"{name}: no upcoming runs"
        for run in runs:
            utc_day = f"{run.expected_start_time.astimezone(dt.timezone.utc):%Y%m%d}"
            assert run.name == flow_run_name(flow_name, run.parameters, run.expected_start_time) \
                == runtime_name(ui, run.id, flow_name, monkeypatch), (name, run.name)
            assert run.name in (f"nightly-{utc_day}", f"apply-archive-tier-{utc_day}")
        next_names[name] = (str(dep.id), runs[0].name)

    page.goto("/deployments")
    page.get_by_text("Every 7 days").first.wait_for()
    tags = [t.strip() for t in page.locator(".deployment-schedule-tags").all_inner_texts() if t.strip()]
    assert tags == ["At 03:00 AM every day", "Every 7 days"], f"one tag per schedule, none folded into '+1': {tags}"
    snap(page, shots, "12-deployments-list", full=False)
    page.get_by_text("At 03:00 AM every day").first.hover()
    page.get_by_text("At 03:00 AM every day (America/New_York)").first.wait_for()
    for name, slug in (("thrifty-train/nightly-retrain", "daily 03:00 America/New_York"),
                       ("thrifty-archive/weekly-archive", "Sundays 05:00 America/New_York")):
        dep_id, next_name = next_names[name]
        page.goto(f"/deployments/deployment/{dep_id}")
        page.get_by_text(slug).first.wait_for()  # the schedule, named with its zone, beside the runs
        page.get_by_text(next_name).first.wait_for()  # the Next Run card: the name it will run under
        snap(page, shots, f"13-deployment-{name.split('/')[1]}", full=False)


def test_deploy_says_the_missing_alert_block_as_a_next_step(ui):
    out = ui.deploy_output
    assert "next steps:" in out.stderr and "thrifty-run-failed' is NOT installed" in out.stderr
    assert "--alerts-webhook" in out.stderr
    again = subprocess.run([sys.executable, "-m", "thrifty.cli", "deploy", "--alerts-webhook",
                            "http://127.0.0.1:9/hook"], cwd=Path(__file__).parent.parent, env=ui.env,
                           capture_output=True, text=True, timeout=180)
    assert again.returncode == 0, again.stderr
    assert "notification block custom-webhook/thrifty-alerts saved" in again.stderr
    assert "automations installed: thrifty-budget-backstop, thrifty-run-failed" in again.stderr
    assert "NOT installed" not in again.stderr


def test_input_errors_say_the_fix_once_without_tracebacks(ui, page, shots, tmp_path):
    """A recipe-option typo (refused by the flow) and parameters the flow's model refuses (the server's schema lets
    them through): each run ends failed with its fix in the message and no traceback in its logs."""
    store = str(tmp_path / "store")
    cases = {"typo": ({"run_name": "typo", "store": store, "recipe_params": {"hiden": 256}}, "Known options"),
             "bad-thresholds": ({"run_name": "bad-thresholds", "store": store,
                                 "budget": {"thresholds": [0.8, 0.5]}}, "strictly increasing"),
             # past the schema's plain pattern (a bad character is refused at the form), caught by the whole rule
             "bad name": ({"run_name": "a{x}", "store": store}, "must be 1-63 letters")}
    with ui.client() as client:
        dep = client.read_deployment_by_name("thrifty-train/train")
        started = {case: client.create_flow_run_from_deployment(dep.id, parameters={"config": config})
                   for case, (config, _) in cases.items()}
    for case, flow_run in started.items():
        done = wait_final(ui, str(flow_run.id), ui.worker)
        assert done.state.is_failed() and cases[case][1] in done.state.message, (case, done.state.message)
        logs = run_logs(ui, str(flow_run.id))
        assert "Traceback" not in logs, f"{case}:\n{logs}"
        assert "starting: budget" not in logs or case == "typo", "no projection for parameters the flow refused"
    page.goto(f"/runs/flow-run/{started['typo'].id}")
    page.get_by_text("Known options").first.wait_for()
    assert "Traceback" not in page.locator("body").inner_text()
    snap(page, shots, "11-typo-run", full=False)


def test_sweep_form_says_what_a_base_run_name_does_in_a_search(ui, page, shots):
    page.goto(f"/deployments/deployment/{deployment_id(ui, 'thrifty-sweep/sweep')}/run")
    field(page, "Max Trials (Optional)").wait_for()
    form = page.locator("main, body").first.inner_text()
    assert "Not used by a sweep: each trial trains as its own run, named after the sweep (NAME-t000" in form
    assert "wins over the form's top 'Run Name'" not in form, "a train form's words are wrong in a sweep"
    assert 'Property is type "None"' not in form
    snap(page, shots, "12-sweep-form")
