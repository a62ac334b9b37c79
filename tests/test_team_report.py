"""A team's view (issue 26: 2-4): cost allocation tags from the config to the flow run, the cloud's labels, every
ledger row, the summary and the reports; `thrifty report --by TAG`, `--month`, `--levers` and the thrifty-team
artifact, each figure the sum of the runs' own."""

from __future__ import annotations

import asyncio
import datetime as dt
import re

import pytest

from thrifty.config import ConfigError, build_config
from thrifty.numbers import amount
from conftest import agrees, latest_artifacts

pytestmark = pytest.mark.slow


def test_tags_are_label_shaped_and_not_part_of_what_is_trained():
    cfg = build_config({"tags": {"team": "ml", "cost_center": "r-and-d", "owner": "ana"}})
    assert cfg.training_fingerprint() == build_config({}).training_fingerprint()
    for bad, says in (({"Team": "ml"}, "tag key 'Team'"), ({"team": "ML Platform"}, "tag team: value 'ML Platform'"),
                      ({"9lives": "x"}, "tag key '9lives'"), ({f"k{i}": "v" for i in range(33)}, "at most 32")):
        with pytest.raises(ConfigError, match=re.escape(says)):
            build_config({"tags": bad})


def test_the_cloud_instance_carries_the_tags_as_labels(monkeypatch, tmp_path):
    pytest.importorskip("sky")
    monkeypatch.setenv("HOME", str(tmp_path))  # `import sky` writes ~/.sky
    from thrifty.launchers import skypilot as sp

    cfg = build_config({"run_name": "Tagged-Run", "recipe": "codelm", "store": "s3://thrifty-test-bucket/runs",
                        "tags": {"team": "ml", "project": "search"},
                        "compute": {"launcher": "skypilot", "on_demand_fallback": False}})
    task = sp.build_task(sp.task_config(cfg, source="offline"))
    assert all(r.labels == {"team": "ml", "project": "search", "thrifty-run": "tagged-run"} for r in task.resources)
    untagged = sp.task_config(build_config({**cfg.model_dump(mode="json"), "tags": {}}), source="offline")
    assert "labels" not in untagged["resources"]


def run(store, name: str, tags: dict[str, str]):
    from flows.train_pipeline import train_pipeline

    cfg = build_config({"run_name": name, "recipe": "digits", "store": str(store), "tags": tags,
                        "recipe_params": {"limit": 300},
                        "train": {"max_epochs": 2, "micro_batch": 32, "precision": "fp32", "checkpoint_every": 5,
                                  "early_stopping": {"enabled": False}},
                        "compute": {"emulate": "aws:g5.xlarge"}})
    return train_pipeline(cfg, poll_s=0.2, return_state=True)


def test_tags_reach_the_flow_run_the_ledger_the_summary_and_a_teams_reports(prefect_harness, tmp_path, capsys):
    from prefect.client.orchestration import get_client

    from thrifty.cli import main
    from thrifty.money import savings
    from thrifty.money.budget import spend_usd
    from thrifty.money.ledger import read_attempts
    from thrifty.runs import read_summary
    from thrifty.storage import open_store

    store_dir = tmp_path / "store"
    states = {name: run(store_dir, name, tags) for name, tags in
              (("ml-1", {"team": "ml"}), ("ml-2", {"team": "ml", "owner": "ana"}), ("search-1", {"team": "search"}))}
    assert all(s.is_completed() for s in states.values())
    store = open_store(str(store_dir))

    async def flow_run_tags(state):
        async with get_client() as client:
            return (await client.read_flow_run(state.state_details.flow_run_id)).tags

    assert {"team:ml", "owner:ana", "thrifty-run:ml-2"} <= set(asyncio.run(flow_run_tags(states["ml-2"])))
    assert all(a.tags == {"team": "ml", "owner": "ana"} for a in read_attempts(store, "ml-2"))
    assert read_summary(store, "search-1").tags == {"team": "search"}

    spent = {name: spend_usd(read_attempts(store, name)) for name in states}
    figures = {f.run_id: f for f in savings.read_all(store)}
    assert figures["ml-1"].tags == {"team": "ml"}

    month = dt.datetime.now(dt.timezone.utc).strftime("%Y-%m")
    assert main(["report", "--set", f"store={store_dir}", "--by", "team", "--month", month]) == 0
    printed = capsys.readouterr().out
    ml = next(line for line in printed.splitlines() if re.search(r"\bml\b", line) and "$" not in line)
    assert re.search(r"\bml\b\s*│\s*2\s*│", ml), printed  # two runs
    assert amount(spent["ml-1"] + spent["ml-2"]) in ml or \
        agrees(re.findall(r"\d+\.\d{2,}", ml)[0], spent["ml-1"] + spent["ml-2"], slack=2e-9), printed
    assert f"total of 3 run(s) started in {month}" in printed

    assert main(["report", "--set", f"store={store_dir}", "--month", "2020-01"]) == 0
    assert "no runs with spend started in 2020-01" in capsys.readouterr().err
    assert main(["report", "--set", f"store={store_dir}", "--month", "2026-13"]) == 2

    assert main(["report", "--set", f"store={store_dir}", "--levers"]) == 0
    printed = capsys.readouterr().out
    spot = next(line for line in printed.splitlines() if line.strip("│ ").startswith("spot"))
    spot_sum = sum(f.levers_usd["spot"] for f in figures.values())
    assert agrees(re.findall(r"\d+\.\d{2,}", spot)[0], spot_sum, slack=2e-9), printed

    page = latest_artifacts("thrifty-team")["thrifty-team"]
    assert f"## {month}: 3 run(s)" in page.data and "### By team" in page.data and "### By owner" in page.data
    assert "### By lever" in page.data and "| ml | 2 |" in page.data and "| (untagged) | 2 |" in page.data
