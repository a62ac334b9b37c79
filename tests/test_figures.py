"""What a run saved, said the same way everywhere: the headline compares the same work done the naive way, early
stopping is a line of its own, an unmeasured lever says "assumed" with its factor, a sweep's "trained to the end"
counts every trial it drew, and one run's figures agree with its ledger on every surface that shows them."""

from __future__ import annotations

import asyncio
import base64
import json
import re

import pytest

from thrifty.money import savings
from thrifty.money.ledger import Attempt
from thrifty.numbers import amount, money
from thrifty.report import figures
from thrifty.runs import BestMetric, RunSummary
from conftest import agrees

T0 = 1_800_000_000.0


def summary(steps: int, total_steps: int, epochs: float, stopped_early: bool, precision: str = "fp32",
            device: str = "cpu") -> RunSummary:
    return RunSummary(run_id="r", recipe="digits", status="stopped_early" if stopped_early else "completed",
                      steps=steps, total_steps=total_steps, epochs=epochs, stopped_early=stopped_early,
                      best_metric=BestMetric(name="val_loss", value=0.1, step=steps, checkpoint_step=steps),
                      wall_time_s=100.0, data_wait_fraction=0.0, checkpoint_time_fraction=0.0, checkpoints_written=1,
                      resumes=0, precision=precision, device=device, world_size=1, cache_key="k",
                      weights_sha256="0" * 64)


def one_hour_of_g5() -> list[Attempt]:  # g5.xlarge spot: $0.302/h, on-demand $1.006/h
    return [Attempt("j", 1, "aws", "us-east-1", "g5.xlarge", True, 0.302, 1, T0, T0 + 3600, "succeeded", 0)]


def test_early_stopping_is_its_own_line_and_never_inflates_the_headline():
    """A user typed 2000 epochs and early stopping ended the run after 10: the headline compares the 10 epochs it
    trained, the same either way; the 1990 it skipped are a line of their own, at this run's rate."""
    stopped = savings.breakdown("r", one_hour_of_g5(), summary(100, 20_000, 10.0, True), False, 0.0, [])
    planned_ten = savings.breakdown("r", one_hour_of_g5(), summary(100, 100, 10.0, False), False, 0.0, [])
    assert stopped.naive_usd == planned_ten.naive_usd == pytest.approx(1.006, abs=1e-6)
    assert stopped.saved_fraction == planned_ten.saved_fraction == pytest.approx(1 - 0.302 / 1.006, abs=1e-4)
    assert "early_stopping" not in stopped.levers_usd
    line = figures.early_stop_line(stopped)
    assert line == "stopped 1990 epochs before max_epochs; at this run's rate that is $60.10 not spent"
    assert stopped.early_stop.usd == pytest.approx(0.302 / 100 * 19_900)
    assert figures.early_stop_line(planned_ten) is None
    assert "saved $0.704 (70%)" in figures.headline(stopped)


def test_an_unmeasured_lever_says_assumed_with_its_factor_wherever_it_is_shown(tmp_path, capsys):
    """bf16 on a GPU: the precision saving comes from an assumed fp32 slowdown, not a measurement."""
    from tasks.report import render_summary, savings_rows
    from thrifty.cli import main
    from thrifty.money.ledger import write_job_attempts
    from thrifty.storage import open_store

    figs = savings.breakdown("r", one_hour_of_g5(), summary(100, 100, 10.0, False, "bf16", "cuda"), False, 0.0, [])
    assert figs.lever_basis["precision"].startswith("assumed: fp32 2x slower than bf16")
    assert figs.levers_usd["precision"] == pytest.approx(1.006)
    for shown in (figures.headline(figs), render_summary("r", None, None, None, None, figs, one_hour_of_g5()),
                  savings_rows([figs])[0]["assumed"]):
        assert "precision assumed: fp32 2x slower" in shown or ("| precision | 1.006 | assumed |" in shown
                                                               and "- precision: assumed: fp32 2x slower" in shown)
    store = open_store(str(tmp_path / "store"))
    write_job_attempts(store, "r", "j", one_hour_of_g5())
    savings.write(store, figs)
    assert main(["report", "--set", f"store={tmp_path / 'store'}"]) == 0
    printed = capsys.readouterr().out
    assert "precision assumed: fp32 2x slower than bf16 on a GPU (not measured: no run of this model in fp32 on " \
        "this accelerator in the store) (runs r)" in printed
    measured = savings.breakdown("r", one_hour_of_g5(), summary(100, 100, 10.0, False), False, 0.0, [])
    assert figures.assumed(measured) == {} and "assumed" not in figures.headline(measured)


def test_a_sweeps_trained_to_the_end_counts_every_trial_it_drew():
    """Paused, refused and never-run trials are trained to the end the naive way too: at their own measured cost
    per epoch, or their trials' typical one when they never measured it."""
    from thrifty.sweep import TrialState
    from thrifty.sweep.report import saving

    def trial(i: int, status: str, reached: int, spent: float, epoch_usd: float) -> TrialState:
        return TrialState(index=i, run_name=f"s-t{i:03d}", values={}, status=status, reached=reached,
                          spent_usd=spent, epoch_usd=epoch_usd)

    trials = [trial(0, "finished", 9, 0.90, 0.10), trial(1, "pruned", 1, 0.12, 0.10),
              trial(2, "paused", 3, 0.35, 0.12), trial(3, "out_of_budget", 0, 0.0, 0.0),
              trial(4, "paused", 0, 0.02, 0.0)]  # stopped by its cap before its first epoch: spent, measured nothing
    money = saving(trials, 9)
    assert money.trials == 5
    typical = 0.10  # the median of the measured 0.10, 0.10, 0.12
    assert money.full_usd == pytest.approx(0.90 + (0.12 + 8 * 0.10) + (0.35 + 6 * 0.12) + 9 * typical
                                           + (0.02 + 9 * typical))
    assert money.spent_usd == pytest.approx(1.39)


@pytest.mark.slow
def test_one_runs_figures_agree_with_its_ledger_everywhere_they_are_shown(prefect_harness, tmp_path, capsys):
    """The flow's result, savings.json, the end's sentence, the summary artifact (cost, headline, chart text and
    SVG), both progress cards, the cross-run table artifact and `thrifty report`: one spend, the ledger's."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterType, FlowRunFilter, FlowRunFilterId

    from flows.train_pipeline import train_pipeline
    from thrifty.cli import main
    from thrifty.config import build_config
    from thrifty.money.budget import spend_usd
    from thrifty.money.ledger import read_attempts
    from thrifty.storage import open_store

    store = tmp_path / "store"
    cfg = build_config({"run_name": "agree", "recipe": "digits", "store": str(store),
                        "recipe_params": {"limit": 400},
                        "train": {"max_epochs": 3, "micro_batch": 32, "precision": "fp32", "checkpoint_every": 5,
                                  "log_every": 5},
                        "compute": {"emulate": "aws:g5.xlarge"}, "budget": {"max_usd": 1.0}})
    state = train_pipeline(cfg, poll_s=0.2, return_state=True)
    assert state.is_completed()
    out = state.result()
    ledger = spend_usd(read_attempts(open_store(str(store)), "agree"))
    assert out.cost_usd == pytest.approx(ledger, abs=1e-6)
    figs = savings.read(open_store(str(store)), "agree")
    assert figs.actual_usd == pytest.approx(ledger, abs=1e-6)
    assert agrees(re.search(r"spent \$([0-9.]+) of its", figs.end).group(1), ledger)
    # the run page's one line: the flow run's state message is the end's sentence (spent, saved, best at its step)
    assert state.message == figs.end and "saved $" in figs.end and re.search(r"at step \d+", figs.end)

    async def artifacts():
        async with get_client() as client:
            mine = await client.read_artifacts(flow_run_filter=FlowRunFilter(
                id=FlowRunFilterId(any_=[state.state_details.flow_run_id])))
            progress = await client.read_artifacts(artifact_filter=ArtifactFilter(
                type=ArtifactFilterType(any_=["progress"])), flow_run_filter=FlowRunFilter(
                id=FlowRunFilterId(any_=[state.state_details.flow_run_id])))
            return {a.key: a for a in mine if a.key}, progress

    by_key, progress = asyncio.run(artifacts())
    summary = by_key["thrifty-summary-agree"].data
    assert figs.end in summary.split("\n\n", 2)[2][:len(figs.end) + 200], \
        "the summary artifact opens with the headline (after its title and the link to every flow run of the run)"
    assert agrees(re.search(r"\| cost \| \$([0-9.]+) ", summary).group(1), ledger)
    assert agrees(re.search(r"Actual \*\*\$([0-9.]+)\*\*", summary).group(1), ledger)
    assert agrees(re.search(r"; spend \$([0-9.]+) of the \$1 budget", summary).group(1), ledger), "chart text"
    svg = base64.b64decode(re.search(r"data:image/svg\+xml;base64,([A-Za-z0-9+/=]+)", summary).group(1)).decode()
    assert agrees(re.search(r">spend \$([0-9.]+) of", svg).group(1), ledger), "the chart's spend line ends there"
    rows = by_key["thrifty-savings"].data
    rows = json.loads(rows) if isinstance(rows, str) else rows
    [row] = [r for r in rows if r["run"] == "agree"]
    assert agrees(amount(row['spent $']), ledger)
    assert row["state"] == "completed" and row["saved $"] == pytest.approx(row["naive $"] - row["spent $"], abs=2e-5)
    [total] = [r for r in rows if r["run"].startswith("total")]  # the team's totals: the sums of the rows above
    assert total["spent $"] == pytest.approx(sum(r["spent $"] for r in rows if r is not total), abs=1e-5)
    assert total["saved $"] == pytest.approx(total["naive $"] - total["spent $"], abs=2e-5)
    assert len(progress) == 2 and all(agrees(re.search(r"\$([0-9.]+) of \$1 budget", a.description).group(1), ledger)
                                      for a in progress), [a.description for a in progress]
    assert main(["report", "--set", f"store={store}"]) == 0
    printed = capsys.readouterr().out
    line = next(x for x in printed.splitlines() if "agree" in x and re.search(r"\d+\.\d{2,}", x))
    assert agrees(re.findall(r"\d+\.\d{2,}", line)[0], ledger), printed
    assert f"total of 1 run(s): spent {money(total['spent $'])}" in printed  # the CLI prints the artifact's totals


def test_the_precision_lever_is_priced_from_the_stores_fp32_and_bf16_runs_of_the_model_on_that_gpu(tmp_path):
    """Two earlier runs of the same model on a cloud A10G, one in fp32 and one in bf16, measured 100 and 250 examples/s:
    a bf16 run there saves what 2.5x, not the assumed 2x, is worth, and says where that was measured."""
    from thrifty.money.levers import precision_factor
    from thrifty.money.ledger import write_job_attempts
    from thrifty.runs import run_key
    from thrifty.storage import open_store

    store = open_store(str(tmp_path / "store"))
    t0 = 1_800_000_000.0
    for run, precision, speed in (("fp32-run", "fp32", 100.0), ("bf16-run", "bf16", 250.0)):
        records = [{"time_unix": t0, "event": "start", "step": 0, "model_key": "m1", "speed_key": precision,
                    "precision": precision, "device": "cuda:0", "world_size": 1}]
        records += [{"time_unix": t0 + i, "step": 10 * i, "loss": 1.0, "samples_per_s": speed} for i in range(1, 6)]
        store.put_bytes(run_key(run, "metrics", "a.jsonl"), "".join(json.dumps(r) + "\n" for r in records).encode())
        write_job_attempts(store, run, "sky-1", [Attempt("sky-1", 1, "aws", "us-east-1", "g5.xlarge", True, 0.302, 1,
                                                         t0 - 30, t0 + 60, "succeeded")])
    mine = [{"event": "start", "model_key": "m1"}]
    bf16 = summary(100, 100, 10.0, False, "bf16", "cuda")
    measured = precision_factor(store, bf16, mine, one_hour_of_g5())
    assert measured.factor == pytest.approx(2.5)
    assert measured.basis.startswith("measured: bf16 trained 2.50x as fast as fp32 on A10G") and "fp32-run" in measured.basis
    figs = savings.breakdown("r", one_hour_of_g5(), bf16, False, 0.0, [], precision=measured)
    assert figs.levers_usd["precision"] == pytest.approx(1.006 * 1.5)  # the on-demand hour x (2.5 - 1)
    assert figs.lever_basis["precision"] == measured.basis and figures.assumed(figs) == {}
    # another model, or a GPU with no fp32 run of it, keeps the stated assumption
    assert precision_factor(store, bf16, [{"event": "start", "model_key": "m2"}], one_hour_of_g5()) is None
    l4 = [Attempt("j", 1, "aws", "us-east-1", "g6.xlarge", True, 0.5, 1, t0, t0 + 3600, "succeeded")]
    assert precision_factor(store, bf16, mine, l4) is None
    assert precision_factor(store, summary(100, 100, 10.0, False), mine, one_hour_of_g5()) is None  # fp32: no lever
