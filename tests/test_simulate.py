"""`thrifty simulate` and the preemption data behind `checkpoint_every: auto`.

The Monte Carlo core against Daly's closed form; the trace model against its own quantiles; the
store's ledgers as observations; the source `auto` picks (ledgers, shipped statistics, config),
on the node too; the command's table, chart and exit 2 on bad input.
"""

from __future__ import annotations

import json
import math
import time
import xml.etree.ElementTree as ET
from pathlib import Path

import numpy as np
import pytest

from thrifty.cli import main
from thrifty.config import build_config
from thrifty.spot.daly import daly_expected_wall_s, daly_interval_s
from thrifty.money.ledger import Attempt, write_job_attempts
from thrifty.money.meter import Price
from thrifty.spot.preemption import (
    TraceRow,
    TraceStats,
    choose_mtbp,
    ledger_observations,
    node_mtbp,
    shipped_source,
    trace_stats,
)
from thrifty.protocol import ENV_BILLING_START, ENV_JOB_ID, ENV_PRICES
from thrifty.spot.simulate import Exponential, RunLengths, RunPlan, one_run, simulate, simulate_interval
from thrifty.storage import open_store

NOW = 1_800_000_000.0


# ---------------------------------------------------------------- the core against the closed form


@pytest.mark.parametrize("steps, step_s, save_s, restart_s, mtbp_s", [
    (36_000, 1.0, 30.0, 300.0, 7200.0),  # a 10-hour run, mean life 2 h
    (5_000, 0.4, 5.0, 0.0, 900.0),  # preemptions every 15 minutes, free restarts
    (12_345, 2.0, 60.0, 120.0, 3 * 3600.0),  # a last segment shorter than the interval
])
def test_exponential_preemptions_match_dalys_closed_form(steps, step_s, save_s, restart_s, mtbp_s):
    plan = RunPlan(steps, step_s, save_s, restart_s, 1.0, 3.0)
    daly_steps = max(1, round(daly_interval_s(save_s, mtbp_s) / step_s))
    for interval in (max(1, daly_steps // 4), daly_steps, daly_steps * 4):
        r = simulate_interval(plan, Exponential(mtbp_s), interval, trials=3000, seed=1)
        closed = daly_expected_wall_s(plan.work_s, interval * step_s, save_s, restart_s, mtbp_s)
        assert r.daly_wall_s == pytest.approx(closed)
        assert abs(r.wall_s / closed - 1) < 0.03, (interval, r.wall_s, closed)
        assert abs(r.wall_s - closed) < 4 * r.wall_stderr_s + 1e-3 * closed  # within the Monte Carlo's own error
        assert r.restarts == pytest.approx(r.wall_s / mtbp_s, rel=0.1)  # a Poisson process over the wall time


def test_the_chosen_interval_is_dalys_and_beats_the_extremes():
    plan = RunPlan(50_000, 0.5, 20.0, 300.0, 0.918, 3.06)
    sim = simulate(plan, Exponential(7684.0), trials=1000, seed=0, extra=(10, 40_000))
    by_steps = {r.interval_steps: r for r in sim.results}
    assert 10 in by_steps and 40_000 in by_steps
    assert sim.daly_steps / 1.5 <= sim.chosen.interval_steps <= sim.daly_steps * 1.5
    assert sim.chosen.usd < 0.9 * by_steps[10].usd and sim.chosen.usd < 0.9 * by_steps[40_000].usd
    assert sim.chosen.usd < sim.on_demand_usd  # spot at 30 % of the price wins even with preemptions
    assert sim.on_demand_wall_s == pytest.approx(plan.work_s + math.ceil(50_000 / sim.chosen.interval_steps) * 20.0)


def test_simulation_is_reproducible_and_the_seed_matters():
    plan = RunPlan(2_000, 1.0, 10.0, 60.0, 1.0, 3.0)
    a, b = (simulate_interval(plan, Exponential(1800.0), 200, trials=200, seed=7) for _ in range(2))
    c = simulate_interval(plan, Exponential(1800.0), 200, trials=200, seed=8)
    assert a == b and a.wall_s != c.wall_s


def test_a_run_that_cannot_finish_is_reported_not_looped_forever():
    draws = iter([5.0] * 10_000)
    wall, _, restarts = one_run(100.0, 100.0, 10.0, 1.0, lambda: next(draws), max_wall_s=1000.0)
    assert wall == math.inf and restarts > 0


# ---------------------------------------------------------------- the trace model


def _row(**kw) -> TraceRow:
    base = dict(cloud="aws", zone="us-west-2b", instances=("p3.2xlarge",), nodes=1, kind="preemption", dataset="t",
                hours=200.0, alive_hours=150.0, preemptions=50, M_hours=3.0, up_p50_h=1.0, up_p90_h=6.0,
                mean_outage_hours=0.5)
    return TraceRow(**{**base, **kw})


def test_run_lengths_reproduce_the_traces_quantiles_and_mean():
    model = RunLengths.from_stats(TraceStats("aws", "p3.2xlarge", (_row(),)))
    rng = np.random.default_rng(0)
    lives = np.array([model.draw(rng) for _ in range(40_000)]) / 3600
    assert np.quantile(lives, 0.5) == pytest.approx(1.0, rel=0.03)
    assert np.quantile(lives, 0.9) == pytest.approx(6.0, rel=0.03)
    assert lives.mean() == pytest.approx(3.0, rel=0.05) and model.mean_s == pytest.approx(3 * 3600)
    # the same mean as an exponential, but more short lives: the clustering the traces show
    assert (lives < 0.5).mean() > 1.4 * (1 - math.exp(-0.5 / 3.0))


def test_shipped_statistics_are_in_the_package_and_prefer_real_preemptions():
    assert shipped_source()["commit"] == "221da1ab9bdfe7966da296265d7694d52dc0c5a6"
    p3 = trace_stats("aws", "p3.2xlarge")
    assert p3 is not None and {r.kind for r in p3.rows} == {"preemption"} and len(p3.rows) == 4
    assert p3.mtbp_s / 3600 == pytest.approx(2.13, abs=0.01)  # SUMMARY.md: pooled p3.2xlarge preemption traces
    assert trace_stats("aws", "p3.2xlarge", zone="us-west-2b").mtbp_s / 3600 == pytest.approx(3.20, abs=0.01)
    assert {r.kind for r in trace_stats("aws", "p2.xlarge").rows} == {"availability"}  # no real-preemption trace
    assert trace_stats("aws", "p3.2xlarge", nodes=4).rows[0].nodes == 4
    assert trace_stats("aws", "g5.xlarge") is None


# ---------------------------------------------------------------- the store's ledgers, and the choice


def _attempt(job: str, n: int, hours: float, end: str, instance: str = "p3.2xlarge", spot: bool = True,
             region: str = "us-east-1", start: float = NOW - 100 * 3600) -> Attempt:
    started = start + n * 10 * 3600
    return Attempt(job, n, "aws", region, instance, spot, 0.918, 1, started, started + hours * 3600, end)


def _ledgers(store_dir: Path, preempted: int) -> None:
    store = open_store(str(store_dir))
    write_job_attempts(store, "run-a", "sky-1", [_attempt("sky-1", i + 1, 2.0, "preempted") for i in range(preempted)]
                       + [_attempt("sky-1", preempted + 1, 3.0, "succeeded")])
    write_job_attempts(store, "run-b", "sky-2", [
        _attempt("sky-2", 1, 1.0, "preempted", instance="g5.xlarge"),  # another instance
        _attempt("sky-2", 2, 4.0, "succeeded", spot=False),  # on-demand
    ])
    write_job_attempts(store, "run-c", "local-run-c-1", [  # emulated by the local launcher: injected, not observed
        _attempt("local-run-c-1", 1, 0.01, "preempted", region="local")])


def test_ledger_attempts_are_preemption_observations(store_dir):
    _ledgers(store_dir, preempted=3)
    obs = ledger_observations(open_store(str(store_dir)), "aws", "p3.2xlarge", now=NOW)
    assert (obs.preemptions, obs.attempts, obs.runs) == (3, 4, 1)
    assert obs.alive_s == pytest.approx((3 * 2.0 + 3.0) * 3600)  # the finished attempt survived: censored time
    assert obs.mtbp_s == pytest.approx(3 * 3600)


def test_auto_takes_ledgers_with_enough_preemptions_else_shipped_else_config(store_dir):
    store = open_store(str(store_dir))
    _ledgers(store_dir, preempted=3)
    few = choose_mtbp(store, "aws", "p3.2xlarge", True, 7200.0, now=NOW)
    assert few.source == "shipped" and few.mtbp_s / 3600 == pytest.approx(2.13, abs=0.01)
    assert "3 preemption(s)" in few.detail
    _ledgers(store_dir, preempted=6)
    many = choose_mtbp(store, "aws", "p3.2xlarge", True, 7200.0, now=NOW)
    assert many.source == "ledger" and many.mtbp_s == pytest.approx((6 * 2 + 3) / 6 * 3600)
    unknown = choose_mtbp(store, "aws", "g5.xlarge", True, 7200.0, now=NOW)
    assert (unknown.source, unknown.mtbp_s) == ("config", 7200.0) and "no shipped statistics" in unknown.detail
    assert choose_mtbp(store, "aws", "p3.2xlarge", False, 7200.0).source == "config"  # on-demand
    cfg = build_config({"store": str(store_dir)})
    assert node_mtbp(store, cfg, None).source == "config"
    assert node_mtbp(store, cfg, Price("aws", "p3.2xlarge", True, 0.918)).source == "ledger"


def test_the_node_plans_auto_checkpoints_from_the_instance_it_landed_on(tmp_path, monkeypatch):
    """A real digits run metered as aws p3.2xlarge spot: its plan records say the shipped statistics chose."""
    from training.loop import train

    monkeypatch.setenv(ENV_PRICES, json.dumps([Price("aws", "p3.2xlarge", True, 0.918).__dict__]))
    monkeypatch.setenv(ENV_BILLING_START, repr(time.time()))
    monkeypatch.setenv(ENV_JOB_ID, "sky-7")
    cfg = build_config({"run_name": "auto-mtbp", "store": str(tmp_path / "store"),
                        "recipe_params": {"hidden": 16, "limit": 400},
                        "train": {"max_epochs": 2, "micro_batch": 32, "precision": "fp32", "checkpoint_every": "auto",
                                  "early_stopping": {"enabled": False}}})
    assert train(cfg).status == "completed"
    records = [json.loads(line) for p in (tmp_path / "store" / "runs" / "auto-mtbp" / "metrics").glob("*.jsonl")
               for line in p.read_text().splitlines()]
    start = next(r for r in records if r.get("event") == "start")
    assert start["mtbp_source"] == "shipped" and start["mtbp_s"] == pytest.approx(7684.3, abs=1)
    assert "p3.2xlarge" in start["mtbp_detail"]
    plans = [r for r in records if r.get("event") == "checkpoint_interval"]
    assert plans and all(p["mtbp_source"] == "shipped" for p in plans)


# ---------------------------------------------------------------- the command


def _sim(store_dir: Path, *extra: str) -> int:
    return main(["simulate", "--set", f"store={store_dir}", "--set", "run_name=sim", "--trials", "200", *extra])


def test_cli_prints_the_table_and_draws_the_chart(store_dir, tmp_path, capsys):
    chart = tmp_path / "sim.svg"
    rc = _sim(store_dir, "--step-s", "0.5", "--save-s", "20", "--steps", "20000", "--instance", "aws:p3.2xlarge",
              "--every", "100", "--chart", str(chart))
    out = capsys.readouterr().out
    assert rc == 0, out
    assert "shipped spot-trace statistics: aws p3.2xlarge" in out and "on-demand" in out
    assert "<- chosen" in out and "chosen: checkpoint_every:" in out and "Daly's closed form" in out
    rows = [line.split() for line in out.splitlines() if line.strip() and line.split()[0].isdigit()]
    assert "100" in {r[0] for r in rows} and len(rows) >= 9
    svg = ET.parse(chart).getroot()
    texts = " ".join(t.text or "" for t in svg.iter("{http://www.w3.org/2000/svg}text"))
    assert "chosen: every" in texts and "on-demand" in texts
    assert len(list(svg.iter("{http://www.w3.org/2000/svg}circle"))) >= 10


def test_cli_takes_step_and_save_times_from_an_earlier_run(store_dir, capsys):
    metrics = store_dir / "runs" / "sim" / "metrics"
    metrics.mkdir(parents=True)
    lines = [{"event": "start", "step": 0, "total_steps": 8000}] + \
        [{"step": 10 * i, "loss": 1.0, "step_time_s": 0.25} for i in range(1, 20)] + \
        [{"event": "checkpoint", "step": 50, "save_s": 4.0}, {"event": "checkpoint", "step": 100, "save_s": 6.0}]
    (metrics / "a.jsonl").write_text("".join(json.dumps(r) + "\n" for r in lines))
    rc = _sim(store_dir, "--instance", "aws:p3.2xlarge", "--distribution", "quantiles", "--zone", "us-west-2b")
    out = capsys.readouterr().out
    assert rc == 0, out
    assert "8000 steps x 0.25 s" in out and "save 5 s" in out and "measured by run 'sim'" in out
    assert "run lengths resampled from 1 trace(s)' quantiles" in out and "Daly h" not in out


@pytest.mark.parametrize("flags, fix", [
    (["--step-s", "-1", "--save-s", "1", "--steps", "10"], "--step-s must be a finite number > 0"),
    (["--step-s", "nan", "--save-s", "1", "--steps", "10"], "--step-s must be a finite number"),
    (["--save-s", "1", "--steps", "10"], "Pass --step-s SECONDS"),
    (["--step-s", "1", "--save-s", "1", "--steps", "10", "--instance", "aws:p9.huge"], "Known aws instances"),
    (["--step-s", "1", "--save-s", "1", "--steps", "10", "--instance", "aws"], "must look like CLOUD:INSTANCE"),
    (["--step-s", "1", "--save-s", "1", "--steps", "10", "--distribution", "quantiles"],
     "no shipped preemption statistics for aws:g5.xlarge"),
    (["--step-s", "1", "--save-s", "1", "--steps", "10", "--preemptions", "ledger"], "hold no preemption"),
    (["--step-s", "1", "--save-s", "1", "--steps", "10", "--trials", "1"], "--trials must be between"),
    (["--step-s", "1", "--save-s", "1", "--steps", "10", "--chart", "{tmp}/missing/x.svg"], "pick a writable path"),
])
def test_cli_bad_input_exits_2_with_the_fix(store_dir, tmp_path, capsys, flags, fix):
    assert _sim(store_dir, *(f.format(tmp=tmp_path) for f in flags)) == 2
    err = capsys.readouterr().err
    assert fix in " ".join(err.split()) and "Traceback" not in err
