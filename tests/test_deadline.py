"""Deadline-aware spot (issue 25; Wu et al., "Can't Be Late", NSDI '24): the policies, the simulator over generated
availability traces, traces in the public format, ``thrifty simulate --deadline-h``, the watch loop's moves on
SkyPilot (the real ``sky.Task``, only the SDK faked), the gate and the report's rows.

Every trace here is generated (from the shipped statistics, or written by the test): the public traces carry no
licence and are not in the project.
"""

from __future__ import annotations

import json
import time

import numpy as np
import pytest

from thrifty.config import ConfigError, build_config
from thrifty.money.ledger import Attempt
from thrifty.spot.deadline import POLICIES, DeadlineState, Margins, decide, wants_on_demand
from thrifty.spot.deadline_sim import DeadlineJob, replay, run_study, start_points
from thrifty.spot.traces import AvailabilityTrace, parse_trace, synthetic_trace, zone_rows

H = 3600.0
P3_SPOT, P3_OD = 0.918, 3.06  # aws p3.2xlarge in the offline price table


def state(market="spot", available=False, elapsed_h=5.0, done_h=4.0, work_h=48.0, deadline_h=53.3, change_h=0.2,
          gap_s=600.0, misses=0) -> DeadlineState:
    return DeadlineState(elapsed_h * H, deadline_h * H, work_h * H, done_h * H, market, available, change_h * H, gap_s,
                         misses)


M = Margins.default(0.2 * H)  # safety one changeover (12 min), hysteresis two (24 min)


# ---------------------------------------------------------------- the policy


def test_the_safety_net_moves_to_on_demand_at_a_changeover_plus_the_margin_and_keeps_it_there():
    # the net: slack < changeover 12 min + gap 10 min + margin 12 min = 34 min; 30 h to the deadline
    roomy = state(elapsed_h=10.0, deadline_h=40.0, work_h=40.0, done_h=40.0 - (30.0 - 0.59))  # slack 35.4 min
    tight = state(elapsed_h=10.0, deadline_h=40.0, work_h=40.0, done_h=40.0 - (30.0 - 0.55))  # slack 33 min
    assert roomy.slack_s > 34 * 60 > tight.slack_s
    for policy in ("uniform_progress", "greedy"):
        assert decide(policy, roomy, M).market == "spot"
        d = decide(policy, tight, M)
        assert d.market == "on_demand" and d.safety_net and "safety net" in d.reason
        assert decide(policy, state(market="on_demand", available=None, elapsed_h=10.0, deadline_h=40.0,
                                    work_h=40.0, done_h=10.55), M).market == "on_demand"
    late = state(elapsed_h=50.0, done_h=40.0)  # 8 h of work, 3.3 h left: on-demand, and it says how late
    d = decide("uniform_progress", late, M)
    assert d.market == "on_demand" and "even on-demand finishes" in d.reason and "late" in d.reason


def test_uniform_progress_waits_while_ahead_goes_on_demand_when_behind_and_uses_spot_whenever_it_is_there():
    line_at_5h = 48.0 * 5.0 / 53.3  # 4.50 h
    ahead, behind = state(done_h=line_at_5h + 0.1), state(done_h=line_at_5h - 0.1)
    assert decide("uniform_progress", ahead, M).market == "spot"  # no spot, ahead: wait for it
    d = decide("uniform_progress", behind, M)
    assert d.market == "on_demand" and "behind the uniform line" in d.reason and not d.safety_net
    assert decide("uniform_progress", state(done_h=line_at_5h - 0.1, available=True), M).market == "spot"
    assert decide("greedy", behind, M).market == "spot"  # greedy waits through the outage while the slack lasts
    assert all(decide("on_demand", s, M).market == "on_demand" for s in (ahead, behind, state(available=True)))


def test_leaving_on_demand_takes_the_hysteresis_which_doubles_after_each_move_that_found_no_spot():
    line = 48.0 * 20.0 / 53.3
    on_od = dict(market="on_demand", available=None, elapsed_h=20.0)
    assert decide("uniform_progress", state(done_h=line + 0.39, **on_od), M).market == "on_demand"  # < 24 min
    d = decide("uniform_progress", state(done_h=line + 0.41, **on_od), M)
    assert d.market == "spot" and "back to spot" in d.reason
    assert decide("uniform_progress", state(done_h=line + 0.41, misses=1, **on_od), M).market == "on_demand"
    assert decide("uniform_progress", state(done_h=line + 0.81, misses=1, **on_od), M).market == "spot"
    assert decide("uniform_progress", state(done_h=line + 0.41, **{**on_od, "available": False}), M).market == "on_demand"
    assert decide("greedy", state(done_h=line + 5.0, **on_od), M).market == "on_demand"  # greedy never goes back
    # far ahead, but the slack cannot hold a changeover to spot and one back (12 + 12 + 10 + 10 + 12 min): stay
    cramped = state(done_h=46.0, elapsed_h=50.0, work_h=48.0, deadline_h=52.9, **{k: v for k, v in on_od.items()
                                                                                 if k != "elapsed_h"})
    assert cramped.ahead_s > M.hysteresis_s and cramped.slack_s < 56 * 60
    assert decide("uniform_progress", cramped, M).market == "on_demand"


def test_the_array_form_the_simulator_uses_decides_as_the_scalar_form_the_watch_loop_uses():
    rng = np.random.default_rng(3)
    n = 2000
    on_od = rng.random(n) < 0.5
    elapsed, deadline, work = rng.uniform(0, 60, n) * H, np.full(n, 60 * H), np.full(n, 45 * H)
    done = np.minimum(work, elapsed * rng.uniform(0.3, 1.0, n))
    avail = rng.random(n) < 0.5
    misses = rng.integers(0, 3, n)
    for policy in POLICIES:
        arr = wants_on_demand(policy, on_od, elapsed, deadline, work, done, on_od | avail, 0.2 * H, 600.0, M, misses)
        for i in range(0, n, 7):
            s = DeadlineState(elapsed[i], deadline[i], work[i], done[i], "on_demand" if on_od[i] else "spot",
                              None if on_od[i] else bool(avail[i]), 0.2 * H, 600.0, int(misses[i]))
            assert (decide(policy, s, M).market == "on_demand") == bool(arr[i]), (policy, i)


# ---------------------------------------------------------------- the simulator on generated traces

ZONES = ("us-east-1a", "us-east-1f", "us-east-2a", "us-west-2b")  # spot there 19 % to 90 % of the time


@pytest.fixture(scope="module")
def traces() -> list[AvailabilityTrace]:
    rows = [r for r in zone_rows("aws", "p3.2xlarge") if r.dataset == "aws-02-15-2023" and r.zone in ZONES]
    assert len(rows) == len(ZONES)
    return [synthetic_trace(r, 1200.0, seed=i) for i, r in enumerate(rows)]


@pytest.mark.parametrize("deadline_h", [53.3, 64.0, 49.5])  # job fractions 0.9, 0.75 and a tight 0.97
def test_uniform_progress_meets_every_deadline_on_demand_can_for_less_than_on_demand_and_greedy(traces, deadline_h):
    job = DeadlineJob(48 * H, deadline_h * H, 0.2 * H, P3_SPOT, P3_OD, M)
    assert job.on_demand_meets
    study = run_study(job, traces, list(POLICIES), starts=300)
    for i, trace in enumerate(traces):
        up, greedy, od = (study.replays[p][i] for p in ("uniform_progress", "greedy", "on_demand"))
        assert len(up.starts) == 300
        assert up.met.all(), f"{trace.name}: missed {np.count_nonzero(~up.met)} of 300"
        assert greedy.met.all() and od.met.all()
        assert np.allclose(od.cost_usd, job.on_demand_usd)
        assert up.cost_usd.mean() <= job.on_demand_usd, trace.name
    assert study.pooled("uniform_progress")["usd"] <= study.pooled("greedy")["usd"]


def test_a_deadline_on_demand_cannot_make_is_missed_by_every_policy_and_the_simulation_says_so(traces):
    job = DeadlineJob(48 * H, 48.1 * H, 0.2 * H, P3_SPOT, P3_OD, M)
    assert not job.on_demand_meets
    r = replay("uniform_progress", job, traces[0], start_points(traces[0], job.deadline_s, 20))
    assert not r.met.any() and np.all(np.isfinite(r.finish_s))  # late, but it finishes (on on-demand)


def test_spot_visible_to_on_demand_the_papers_assumption_costs_less_than_learning_it_by_going_there(traces):
    job = DeadlineJob(48 * H, 64 * H, 0.2 * H, P3_SPOT, P3_OD, M)
    blind = run_study(job, traces, ["uniform_progress"], 300).pooled("uniform_progress")
    seen = run_study(job, traces, ["uniform_progress"], 300, spot_visible=True).pooled("uniform_progress")
    assert seen["usd"] < blind["usd"] and seen["met"] == blind["met"] == 1.0


# ---------------------------------------------------------------- traces


def test_a_trace_in_the_public_format_counts_nodes_and_carries_its_prices():
    data = {"metadata": {"gap_seconds": 300}, "data": [4, 4, 3, 0, 4], "prices": [1.0, 1.1, 1.2, 1.3, 1.4]}
    t = parse_trace(data, nodes=4)
    assert t.available.tolist() == [True, True, False, False, True] and t.gap_s == 300.0
    assert parse_trace(data, nodes=1).available.tolist() == [True, True, True, False, True]
    assert t.at(0) and not t.at(650) and t.at(10 ** 6)  # the last tick holds after the end
    for bad, why in (({"data": [1]}, "metadata"), ({"metadata": {"gap_seconds": 0}, "data": [1]}, "gap_seconds"),
                     ({"metadata": {"gap_seconds": 60}, "data": []}, "non-empty"),
                     ({"metadata": {"gap_seconds": 60}, "data": [1, -1]}, "count"),
                     ({"metadata": {"gap_seconds": 60}, "data": [1, 0.5]}, "count"),
                     ({"metadata": {"gap_seconds": 60}, "data": [1, 0], "prices": [1.0]}, "prices")):
        with pytest.raises(ValueError, match=why):
            parse_trace(bad)


def test_a_traces_own_prices_are_what_spot_costs():
    t = parse_trace({"metadata": {"gap_seconds": 3600}, "data": [1] * 100, "prices": [0.5] * 100})
    job = DeadlineJob(10 * H, 20 * H, 0.0, 9.0, 10.0, Margins(0.0, 0.0))
    r = replay("greedy", job, t, np.array([0]))
    assert r.met.all() and r.cost_usd[0] == pytest.approx(10 * 0.5) and r.spot_share == 1.0


def test_synthetic_traces_follow_the_zones_statistics_and_are_seeded():
    for row in zone_rows("aws", "p3.2xlarge")[:4]:
        t = synthetic_trace(row, 5000.0, seed=1)
        assert np.array_equal(t.available, synthetic_trace(row, 5000.0, seed=1).available)
        share = row.alive_hours / row.hours
        assert abs(t.available_fraction - share) < 0.12, (row.zone, t.available_fraction, share)
        up_runs = t.available.sum() * t.gap_s / 3600 / max(1, int(np.count_nonzero(t.available[1:] & ~t.available[:-1])))
        assert 0.5 < up_runs / row.M_hours < 2.0, (row.zone, up_runs, row.M_hours)


# ---------------------------------------------------------------- thrifty simulate --deadline-h


def cli(*argv: str) -> int:
    from thrifty.cli import main

    return main(list(argv))


def test_simulate_deadline_prints_each_policy_and_draws_the_chart(tmp_path, capsys):
    chart = tmp_path / "deadline.svg"
    code = cli("simulate", "--deadline-h", "53.3", "--work-h", "48", "--changeover-s", "720", "--instance",
               "aws:p3.2xlarge", "--zone", "us-west-2b", "--starts", "40", "--trace-hours", "400", "--chart", str(chart))
    out = capsys.readouterr().out
    assert code == 0
    assert "all traces (2, 80 starts in all)" in out  # us-west-2b has two data sets: a trace each
    for policy in POLICIES:
        assert out.count(f"\n{policy} ") == 3, policy  # each trace's table and the pooled one
    assert "job fraction 0.90" in out and "uniform_progress: $" in out and "less than on-demand ($147.49)" in out
    svg = chart.read_text()
    assert svg.startswith("<svg") and svg.count("<rect") == 4 and "on-demand alone" in svg  # ground + 3 bars


def test_simulate_deadline_replays_a_trace_file_in_the_public_format(tmp_path, capsys):
    path = tmp_path / "zone.json"
    rng = np.random.default_rng(0)
    path.write_text(json.dumps({"metadata": {"gap_seconds": 600},
                                "data": [int(x) for x in (rng.random(2000) < 0.8)]}))
    assert cli("simulate", "--deadline-h", "20", "--work-h", "15", "--instance", "aws:p3.2xlarge", "--trace",
               str(path), "--starts", "30", "--policy", "uniform_progress") == 0
    out = capsys.readouterr().out
    assert "zone.json: 333 h at 600 s ticks" in out and "greedy" not in out and "met" in out


@pytest.mark.parametrize("argv, says", [
    (["--deadline-h", "10", "--work-h", "10"], "even on-demand cannot make the deadline"),
    (["--deadline-h", "10", "--work-h", "5", "--trace", "nope.json"], "--trace nope.json: cannot read it"),
    (["--deadline-h", "10", "--work-h", "5", "--instance", "aws:g5.xlarge"], "no shipped availability statistics"),
    (["--deadline-h", "-1", "--work-h", "5"], "--deadline-h must be"),
    (["--deadline-h", "10"], "--work-h"),
])
def test_simulate_deadline_refuses_bad_input_with_exit_2(tmp_path, monkeypatch, capsys, argv, says):
    monkeypatch.chdir(tmp_path)
    assert cli("simulate", "--instance", "aws:p3.2xlarge", *argv) == 2
    assert says in capsys.readouterr().err


def test_the_clis_policy_choices_are_the_policies():
    from thrifty.spot.deadline_options import DEFAULT_CHANGEOVER_S, POLICY_CHOICES, SYNTHETIC_TICK_S
    from thrifty.spot.simulate_inputs import DEFAULT_RESTART_S
    from thrifty.spot.traces import SYNTHETIC_TICK_S as TICK

    assert POLICY_CHOICES == POLICIES and DEFAULT_CHANGEOVER_S == DEFAULT_RESTART_S and SYNTHETIC_TICK_S == TICK


# ---------------------------------------------------------------- config, node pace


def test_the_deadline_settings_and_the_spot_trace_are_checked():
    cfg = build_config({"compute": {"deadline_h": 2, "spot_trace": {"metadata": {"gap_seconds": 5}, "data": [1, 0]}}})
    assert cfg.compute.deadline_policy == "uniform_progress" and cfg.compute.spot_trace.data == [1, 0]
    for bad, says in (({"launcher": "skypilot", "spot_trace": "t.json"}, "local launcher"),
                      ({"spot_trace": {"metadata": {"gap_seconds": 5}, "data": [1, -1]}}, "counts"),
                      ({"deadline_policy": "fastest"}, "deadline_policy"),
                      ({"deadline_changeover_s": 0}, "deadline_changeover_s")):
        with pytest.raises(ConfigError, match=says):
            build_config({"compute": bad})


def test_preflight_reads_the_spot_trace_before_anything_is_spent(tmp_path):
    from thrifty.launchers.preflight import check_before_spending

    cfg = build_config({"store": str(tmp_path / "store"), "compute": {"spot_trace": str(tmp_path / "missing.json")}})
    with pytest.raises(ConfigError, match="'compute.spot_trace': .*missing.json: cannot read it"):
        check_before_spending(cfg)


def test_the_node_pace_hook_holds_a_step_to_the_pace(monkeypatch):
    from thrifty.faults import pace

    monkeypatch.setenv("THRIFTY_MIN_STEP_S", "0.05")
    t0 = time.perf_counter()
    pace(t0)
    assert time.perf_counter() - t0 >= 0.05
    monkeypatch.delenv("THRIFTY_MIN_STEP_S")
    t0 = time.perf_counter()
    pace(t0)
    assert time.perf_counter() - t0 < 0.05


# ---------------------------------------------------------------- the report


def test_the_report_shows_time_and_dollars_per_market_and_the_deadline(tmp_path):
    from tasks.report import deadline_rows
    from thrifty.spot.deadline_run import DeadlineRecord, Move, write_record
    from thrifty.storage import open_store

    cfg = build_config({"run_name": "r", "store": str(tmp_path / "store"), "compute": {"deadline_h": 1.0}})
    t0 = 1_800_000_000.0
    attempts = [Attempt("j1", 1, "aws", "local", "p3.2xlarge", True, P3_SPOT, 1, t0, t0 + 600, "preempted"),
                Attempt("j2", 1, "aws", "local", "p3.2xlarge", False, P3_OD, 1, t0 + 900, t0 + 1500, "cancelled"),
                Attempt("j3", 1, "aws", "local", "p3.2xlarge", True, P3_SPOT, 1, t0 + 1600, t0 + 3000, "succeeded")]
    write_record(open_store(cfg.store), "r", DeadlineRecord(
        policy="uniform_progress", started_unix=t0, deadline_unix=t0 + 3600, moves=(
            Move(at_unix=t0 + 880, from_market="spot", to_market="on_demand", from_job="j1", to_job="j2"),
            Move(at_unix=t0 + 1500, from_market="on_demand", to_market="spot", from_job="j2", to_job="j3"))))
    rows = dict(deadline_rows(cfg, attempts))
    assert rows["markets"] == "spot 33.3 min $0.51; on-demand 10.0 min $0.51"
    assert rows["deadline"] == ("60.0 min (uniform_progress): finished in 50.0 min, 10.0 min before it; moves: "
                                "spot -> on-demand, on-demand -> spot")


# ---------------------------------------------------------------- the watch loop's moves on SkyPilot, the gate


def test_the_watch_moves_a_skypilot_spot_job_to_an_on_demand_managed_job_and_back(tmp_path, monkeypatch):
    """The real sky.Task of each market (only sky.jobs.launch / queue / cancel faked): spot with no on-demand in it,
    then use_spot false; the stop asks the node for its checkpoint first; each move evented and recorded."""
    pytest.importorskip("sky")
    import logging

    import tasks.alerts
    from conftest import REPO
    from tasks.deadline import DeadlineWatch
    from test_skypilot import FakeSky, on_cluster
    from thrifty.launchers import JobState
    from thrifty.launchers import skypilot as sp
    from thrifty.money.estimate import Estimate
    from thrifty.protocol import STOPPED_KEY
    from thrifty.runs import run_key
    from thrifty.spot.deadline_run import read_record
    from thrifty.storage import open_store

    fake = FakeSky(monkeypatch)
    events = []
    monkeypatch.setattr(tasks.alerts, "emit_event", lambda **kw: events.append(kw))
    cfg = build_config({"run_name": "cloud-run", "recipe": "codelm", "store": str(tmp_path / "store"),
                        "compute": {"launcher": "skypilot", "workdir": str(REPO), "clouds": ["aws"],
                                    "accelerators": ["A10G:1"], "deadline_h": 2.0, "deadline_changeover_s": 60}})
    store = open_store(cfg.store)

    def node_saves(_seconds):  # what the node's watcher does on a stop request: checkpoint, then acknowledge
        store.put_bytes(run_key("cloud-run", STOPPED_KEY.format(job=fake.next_id)), b"{}")

    launcher = sp.SkyPilotLauncher(cfg, sleep=node_saves)
    estimate = Estimate(usd=1.0, hours=1.0, steps=1000, usd_per_hour=1.0, assumption="a test", step_s=3.0,
                        startup_s=300.0, total_steps=1000)
    watch = DeadlineWatch.begin(cfg, store, estimate, logging.getLogger("test"), None, lambda c: launcher.submit(c))
    job = watch.launch()
    spot_task, _ = fake.launched[-1]
    assert {r.use_spot for r in spot_task.resources} == {True}  # the policy owns the fallback: none in the task

    now = time.time()  # an hour into a 2 h deadline, 300 of 1000 steps at 3 s a step: behind the even line (500)
    watch.record = watch.record.model_copy(update={
        "started_unix": now - 3600, "deadline_unix": now + 3600,
        "jobs": tuple(j.model_copy(update={"submitted_unix": now - 600}) for j in watch.record.jobs)})
    records = [{"event": "start", "step": 0, "total_steps": 1000, "time_unix": now - 3000},
               {"step": 200, "loss": 1.0, "time_unix": now - 1500}, {"step": 300, "loss": 1.0, "time_unix": now - 1200}]
    fake.set(7, status="RECOVERING")  # no spot capacity for 10 min, longer than a changeover
    status = launcher.status(job)
    move = watch.poll(job, status, records, [], 1.0)
    assert move.to_market == "on_demand" and "behind the uniform line" in move.reason
    assert events[-1]["event"] == "thrifty.deadline.switch" and events[-1]["payload"]["to_market"] == "on_demand"

    assert watch.poll(job, status, records, [], 1.0) is move, "announced once; the same move until its job ends"
    launcher.cancel(job)  # what the watch loop does before the move (nothing running: no checkpoint to wait for)
    assert watch.stopped_for_move(job, launcher.status(job)) is None  # CANCELLING: not ended yet
    fake.set(7, status="CANCELLED")
    fake.next_id = 8
    stopped = launcher.status(job)
    assert watch.stopped_for_move(job, stopped) is move and len(events) == 1
    od_job = watch.moved(move, stopped)
    od_task, _ = fake.launched[-1]
    assert od_job == "sky-8" and {r.use_spot for r in od_task.resources} == {False}

    # on-demand, well ahead of the line (700 of 1000 steps an hour in): back to spot, after the node's checkpoint
    fake.set(8, status="RUNNING", start_at=now - 900, last_recovered_at=now - 900,
             **on_cluster("AWS", "us-east-1", "g5.xlarge", "A10G:1", spot=False))
    records.append({"step": 700, "loss": 1.0, "time_unix": now})
    status = launcher.status(od_job)
    assert status.state is JobState.RUNNING and not status.attempts[-1].spot
    back = watch.poll(od_job, status, records, [], 1.0)
    assert back.to_market == "spot" and "back to spot" in back.reason
    launcher.cancel(od_job)
    assert store.exists(run_key("cloud-run", STOPPED_KEY.format(job=8))), "the node was asked to checkpoint first"
    fake.set(8, status="CANCELLED", end_at=now + 5)
    fake.next_id = 9
    assert watch.moved(back, launcher.status(od_job)) == "sky-9"
    assert {r.use_spot for r in fake.launched[-1][0].resources} == {True}
    record = read_record(store, "cloud-run")
    assert [(j.job_id, j.market) for j in record.jobs] == [("sky-7", "spot"), ("sky-8", "on_demand"),
                                                             ("sky-9", "spot")]
    assert [(m.from_job, m.to_job, m.step) for m in record.moves] == [("sky-7", "sky-8", 300), ("sky-8", "sky-9", 700)]


def test_the_gate_refuses_a_deadline_no_on_demand_candidate_can_make():
    from tasks.budget import on_demand_can_finish
    from test_hwcost import cloud_cfg, measured
    from thrifty.money.throughput import speeds_for

    speeds = speeds_for(["A10G", "H100"], measured())
    examples = 1000.0 * 3600 * 2.0  # 2 h on an A10G, 0.17 h on an H100
    on_demand_can_finish(cloud_cfg(deadline_h=1.0), speeds, examples)
    with pytest.raises(ConfigError, match="on-demand, the deadline policy's fallback: 'compute.deadline_h': no "
                                          "candidate can finish the run within 0.1 h"):
        on_demand_can_finish(cloud_cfg(deadline_h=0.1), speeds, examples)


def test_the_gate_prices_the_whole_run_on_demand_for_its_budget_warning():
    from tasks.budget import on_demand_usd
    from thrifty.money.estimate import Estimate

    cfg = build_config({"compute": {"emulate": "aws:p3.2xlarge", "deadline_h": 5.0}})
    estimate = Estimate(usd=0.918 * 2, hours=2.0, steps=100, usd_per_hour=0.918, assumption="a test")
    assert on_demand_usd(cfg, estimate) == pytest.approx(2.0 * P3_OD)
