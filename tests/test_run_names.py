"""Flow run names: one pure function names a run when it starts and its upcoming (Scheduled) flow run beforehand;
the upcoming runs are renamed only where they differ; the tag's link lists the run's flow runs."""

from __future__ import annotations

import datetime as dt
import logging
from types import SimpleNamespace
from urllib.parse import parse_qs, urlsplit
from uuid import uuid4

import pytest

from deployments.upcoming import name_upcoming_runs
from tasks.links import RUNS_FROM, RUNS_TO, runs_page_path
from thrifty.config import RunConfig
from thrifty.runs.names import (
    ARCHIVE_FLOW,
    TRAIN_FLOW,
    archive_name,
    flow_run_name,
    train_name,
)

UTC = dt.timezone.utc
NY = dt.timezone(dt.timedelta(hours=-5))  # New York in winter
NIGHTLY = {"poll_s": 10.0, "config": {"run_name": "nightly-{date}", "recipe": "digits"}}


def test_a_nightly_name_is_the_utc_date_of_its_scheduled_start():
    assert train_name(NIGHTLY, dt.datetime(2026, 11, 29, 3, tzinfo=NY)) == "nightly-20261129"
    # 22:00 in New York is the next day in UTC: '{date}' is always the UTC date (scheduled_date)
    assert train_name(NIGHTLY, dt.datetime(2026, 11, 29, 22, tzinfo=NY)) == "nightly-20261130"
    config = RunConfig.model_validate(NIGHTLY["config"])  # the flow's context holds the model, the server the dict
    assert train_name({"config": config}, dt.datetime(2026, 11, 29, 8, tzinfo=UTC)) == "nightly-20261129"
    # parameters the flow will refuse still give a name (the run fails and says why)
    assert train_name({"config": {"run_name": "bad name {date}"}}, dt.datetime(2026, 1, 2, tzinfo=UTC)) == \
        "bad name 20260102"


def test_an_archive_name_says_preview_or_apply():
    when = dt.datetime(2026, 11, 29, 10, tzinfo=UTC)
    assert archive_name({"dry_run": False}, when) == "apply-archive-tier-20261129"
    assert archive_name({}, when) == "preview-archive-tier-20261129", "dry_run defaults to true, as the flow's"
    assert archive_name({"dry_run": True, "tier": "cold"}, when) == "preview-cold-tier-20261129"
    assert flow_run_name(ARCHIVE_FLOW, {"dry_run": False}, when) == "apply-archive-tier-20261129"
    assert flow_run_name("thrifty-sweep", {}, when) is None, "a flow Thrifty does not name this way"


@pytest.mark.parametrize("flow_name, parameters, expected", [
    (TRAIN_FLOW, NIGHTLY, "nightly-20261129"),
    (ARCHIVE_FLOW, {"store": ".thrifty/store", "dry_run": False}, "apply-archive-tier-20261129"),
])
def test_the_runtime_callables_give_the_pure_name(monkeypatch, flow_name, parameters, expected):
    """What a flow run is named when it starts (prefect.runtime) is what its upcoming run was named beforehand."""
    from prefect.runtime import flow_run

    from flows.run_names import archive_run_name, train_run_name

    when = dt.datetime(2026, 11, 29, 8, tzinfo=UTC)
    monkeypatch.setitem(flow_run.FIELDS, "parameters", lambda: parameters)
    monkeypatch.setitem(flow_run.FIELDS, "scheduled_start_time", lambda: when)
    runtime = train_run_name if flow_name == TRAIN_FLOW else archive_run_name
    assert runtime() == flow_run_name(flow_name, parameters, when) == expected


class FakeClient:
    """The few client calls name_upcoming_runs makes, over a deployment and its Scheduled runs."""

    def __init__(self, flow_name: str, schedules: list, runs: list):
        self.deployment = SimpleNamespace(id=uuid4(), flow_id=uuid4(), schedules=schedules)
        self.flow_name, self.runs, self.renamed = flow_name, runs, []

    def read_deployment(self, deployment_id):
        return self.deployment

    def read_flow(self, flow_id):
        return SimpleNamespace(name=self.flow_name)

    def read_flow_runs(self, **_):
        return self.runs

    def update_flow_run(self, flow_run_id, name=None):
        self.renamed.append((flow_run_id, name))


def scheduled(name: str, when: dt.datetime, parameters: dict) -> SimpleNamespace:
    return SimpleNamespace(id=uuid4(), name=name, expected_start_time=when, parameters=parameters)


def test_upcoming_runs_are_renamed_where_their_names_differ():
    day = dt.datetime(2026, 11, 29, 8, tzinfo=UTC)
    runs = [scheduled("precise-quail", day, NIGHTLY), scheduled("nightly-20261130", day + dt.timedelta(days=1), NIGHTLY),
            scheduled("straight-bat", day + dt.timedelta(days=2), NIGHTLY)]
    client = FakeClient(TRAIN_FLOW, ["the nightly schedule"], runs)
    renamed = name_upcoming_runs(client, client.deployment.id)
    assert [name for _, name in renamed] == ["nightly-20261129", "nightly-20261201"]
    assert client.renamed == [(runs[0].id, "nightly-20261129"), (runs[2].id, "nightly-20261201")]


def test_a_deployment_without_schedules_is_left_alone():
    client = FakeClient(TRAIN_FLOW, [], [scheduled("a-manual-run", dt.datetime(2026, 11, 29, tzinfo=UTC), NIGHTLY)])
    assert name_upcoming_runs(client, client.deployment.id) == [] and client.renamed == []


def test_naming_the_upcoming_runs_never_fails_a_run(monkeypatch, caplog):
    import prefect.client.orchestration
    from prefect.runtime import deployment

    from flows.run_names import upcoming_named

    def refused(*_, **__):
        raise RuntimeError("server down")

    monkeypatch.setitem(deployment.FIELDS, "id", lambda: str(uuid4()))
    monkeypatch.setattr(prefect.client.orchestration, "get_client", refused)
    logger = logging.getLogger("test-run-names")
    with caplog.at_level(logging.WARNING, logger="test-run-names"), upcoming_named(logger):
        pass
    assert caplog.text.count("could not name this deployment's upcoming flow runs (server down)") == 2


def test_a_run_without_a_deployment_names_nothing(monkeypatch, caplog):
    import prefect.client.orchestration

    from flows.run_names import name_upcoming

    def unexpected(*_, **__):
        raise AssertionError("no deployment: no client")

    monkeypatch.setattr(prefect.client.orchestration, "get_client", unexpected)
    with caplog.at_level(logging.INFO, logger="test-run-names"):
        name_upcoming(logging.getLogger("test-run-names"))  # outside any run: prefect.runtime.deployment.id is None
    assert not caplog.records, caplog.text


def test_deploy_says_when_it_could_not_name_the_upcoming_runs(monkeypatch):
    import prefect.client.orchestration

    from deployments.deploy import name_upcoming_runs as deploy_names

    def refused(*_, **__):
        raise RuntimeError("server down")

    monkeypatch.setattr(prefect.client.orchestration, "get_client", refused)
    [line] = deploy_names(["nightly-retrain"], "thrifty-process")
    assert "could not name the upcoming runs (server down)" in line


def test_the_tag_link_is_the_runs_page_filtered_by_the_tag_for_all_time():
    url = urlsplit(runs_page_path("nightly-20261129"))
    assert url.path == "runs"
    assert parse_qs(url.query) == {"tag": ["thrifty-run:nightly-20261129"], "type": ["range"],
                                   "startDate": [RUNS_FROM], "endDate": [RUNS_TO]}
