"""Hardware by total cost (issue 16, part 2): candidates ranked by rate x estimated runtime (start-up included),
speeds measured from the store's ledgers and metrics before the shipped table, and ``compute.deadline_h``.

Pure where the rule is pure; the measured-speed test reads the metrics a real digits run wrote, as a cloud
node writes them, beside a ledger row on a cloud instance.
"""

from __future__ import annotations

import json
import statistics

import pytest
import yaml

from thrifty.config import ConfigError, build_config
from thrifty.launchers.skypilot import candidates, plan_text, rank, task_config
from thrifty.money.ledger import Attempt, write_job_attempts
from thrifty.numbers import money
from thrifty.results import PrepResult, SmokeResult
from thrifty.runs import run_key
from thrifty.storage import open_store
from thrifty.money.throughput import RELATIVE_SPEED, Measured, measured_speeds, speed_key, speeds_for

A10G_SPOT, H100_SPOT = 0.302, 2.790  # aws g5.xlarge and azure Standard_NC40ads_H100_v5 spot in the offline table


def cloud_cfg(store: str = "s3://b/p", **compute):
    return build_config({"run_name": "hw", "recipe": "digits", "store": store,
                         "compute": {"launcher": "skypilot", "on_demand_fallback": False, "clouds": ["aws", "azure"],
                                     "accelerators": ["A10G:1", "H100:1"], **compute}})


def with_compute(cfg, **changes):
    return cfg.updated({"compute": {**cfg.compute.model_dump(mode="json"), **changes}}, "a test")


def measured(a10g: float = 1000.0, h100: float = 12000.0) -> dict[str, Measured]:
    return {"A10G": Measured(accelerator="A10G", examples_per_s_per_gpu=a10g, windows=5, runs=["old"]),
            "H100": Measured(accelerator="H100", examples_per_s_per_gpu=h100, windows=5, runs=["old"])}


def ranking_for(cfg, hours_on_a10g: float):
    cands, _ = candidates(cfg, "offline")
    return rank(cfg, cands, speeds_for([k.accelerator for k in cands], measured()), 1000.0 * 3600 * hours_on_a10g)


def test_a_faster_gpu_at_a_higher_rate_wins_a_long_run_and_loses_a_short_one():
    cfg = cloud_cfg()
    long = ranking_for(cfg, 10.0)  # 10 h on an A10G = $3.05; 50 min on an H100 (12x faster) + start-up = $2.56
    assert [x.candidate.accelerator for x in long.ranked] == ["H100:1", "A10G:1"]
    win, lose = long.ranked
    assert win.candidate.usd_per_hour == H100_SPOT and lose.candidate.usd_per_hour == A10G_SPOT
    assert win.usd == pytest.approx((10 / 12 + 300 / 3600) * H100_SPOT)
    assert lose.usd == pytest.approx((10 + 300 / 3600) * A10G_SPOT) and win.usd < lose.usd
    why = long.why()
    assert why.startswith(f"H100:1 spot on azure: {money(win.usd)} for ~0.92 h beats A10G:1 spot on aws: {money(lose.usd)}")
    assert "A10G is cheaper per hour ($0.302/h vs $2.79/h)" in why and "~12.0x faster" in why
    # the SkyPilot task tries the cheapest run first: ordered, not any_of (which picks the cheapest per hour)
    resources = task_config(cfg, "offline", long)["resources"]
    assert "any_of" not in resources and [e["accelerators"] for e in resources["ordered"]] == ["H100:1", "A10G:1"]

    short = ranking_for(cfg, 0.1)  # 6 min of training: the 5 min of start-up at the H100's rate decides
    assert [x.candidate.accelerator for x in short.ranked] == ["A10G:1", "H100:1"]
    assert "A10G:1 spot on aws wins" in short.why() and "cheapest per hour and per run" in short.why()


def test_without_a_runtime_candidates_rank_per_unit_of_work_by_the_table():
    cfg = cloud_cfg(accelerators=["T4:1", "A10G:1", "H100:1"])
    ranking = rank(cfg, candidates(cfg, "offline")[0], speeds_for(["T4", "A10G", "H100"], {}), None)
    assert ranking.examples is None and not ranking.speeds.absolute
    per_work = [x.candidate.usd_per_hour / RELATIVE_SPEED[x.candidate.accelerator.split(":")[0]] for x in ranking.ranked]
    assert per_work == sorted(per_work) and all(x.usd is None for x in ranking.ranked)
    assert "per unit of work" in ranking.why()
    with pytest.raises(ConfigError, match="no speed is known for X9.*covers T4"):
        speeds_for(["X9:1"], {})


def test_deadline_leaves_out_slow_candidates_and_refuses_when_none_fits():
    for bad in (0, -1):
        with pytest.raises(ConfigError, match="deadline_h"):
            cloud_cfg(deadline_h=bad)
    # 2 h of work on an A10G: the A10G (2.08 h with start-up) misses a 1 h deadline, the H100 (0.25 h) makes it
    ranking = ranking_for(cloud_cfg(deadline_h=1.0), 2.0)
    assert [x.candidate.accelerator for x in ranking.ranked] == ["H100:1"]
    assert [x.candidate.accelerator for x in ranking.excluded] == ["A10G:1"]
    resources = task_config(cloud_cfg(deadline_h=1.0), "offline", ranking)["resources"]
    assert [e["accelerators"] for e in resources["ordered"]] == ["H100:1"]  # the task lists the feasible ones only
    with pytest.raises(ConfigError) as err:
        ranking_for(cloud_cfg(deadline_h=0.2), 2.0)
    msg = str(err.value)
    assert "'compute.deadline_h'" in msg and "within 0.2 h" in msg and "the fastest, H100:1 spot on azure, needs ~0.25 h" in msg
    assert "Raise compute.deadline_h" in msg and "nothing was launched" in msg


def _digits_run(tmp_path, run_name: str, micro_batch: int = 32):
    from training.loop import train

    data = {"run_name": run_name, "store": str(tmp_path / "store"), "recipe_params": {"hidden": 16, "limit": 400},
            "train": {"max_steps": 14, "micro_batch": micro_batch, "precision": "fp32", "checkpoint_every": 7,
                      "log_every": 2, "early_stopping": {"enabled": False}}}
    cfg = build_config(data)
    train(cfg)
    return cfg


def _as_on_a_gpu_node(store, run_id: str) -> tuple[str, list[float]]:
    """The run's metrics file as a GPU node writes it (device cuda:0), and its logged speeds."""
    [obj] = [o for o in store.list(run_key(run_id, "metrics") + "/")]
    records = [json.loads(line) for line in store.get_bytes(obj.key).decode().splitlines()]
    for r in records:
        if r.get("event") == "start":
            r["device"] = "cuda:0"
    store.put_bytes(obj.key, "".join(json.dumps(r) + "\n" for r in records).encode())
    return records[0]["time_unix"], [r["samples_per_s"] for r in records if r.get("event") is None and "samples_per_s" in r]


def test_measured_speeds_from_the_stores_ledger_and_metrics_override_the_table(tmp_path, capsys):
    cfg = _digits_run(tmp_path, "measured")
    store = open_store(cfg.store)
    key = speed_key(cfg)
    [start] = [r for o in store.list(run_key("measured", "metrics") + "/")
               for r in map(json.loads, store.get_bytes(o.key).decode().splitlines()) if r.get("event") == "start"]
    assert start["speed_key"] == key and start["train_examples"] > 0  # what the node's start record carries
    assert measured_speeds(store, key) == {}  # metrics with no ledger row: where it ran is unknown
    # the same run as a GPU node records it...
    t0, logged = _as_on_a_gpu_node(store, "measured")
    # ...under the local launcher, which meters an emulated g5.xlarge whatever this machine has: not an A10G speed
    write_job_attempts(store, "measured", "local-1", [Attempt("local-1", 1, "aws", "local", "g5.xlarge", True, 0.302, 1,
                                                              t0 - 5, t0 + 60, "succeeded")])
    assert measured_speeds(store, key) == {}
    # ...and on a cloud g5.xlarge (A10G) whose ledger attempt was billing when it started
    write_job_attempts(store, "measured", "sky-7", [Attempt("sky-7", 1, "aws", "us-east-1", "g5.xlarge", True, 0.302, 1,
                                                            t0 - 30, t0 + 60, "succeeded")])
    got = measured_speeds(store, key)
    assert list(got) == ["A10G"]
    assert got["A10G"].examples_per_s_per_gpu == pytest.approx(statistics.median(logged[1:]))  # first window: warm-up
    assert got["A10G"].windows == len(logged) - 1 and got["A10G"].runs == ["measured"]
    assert got["A10G"].train_examples == start["train_examples"]
    assert measured_speeds(store, "another-model") == {}  # another model's speed is not this one's

    # measured beats the smoke test's CPU bridge; an unmeasured GPU is scaled from the measured one by the table
    speeds = speeds_for(["A10G:1", "H100:1"], got, cpu_examples_per_s=1.0)
    assert speeds.of("A10G") == got["A10G"].examples_per_s_per_gpu and speeds.measured == ["A10G"]
    assert speeds.of("H100") == pytest.approx(got["A10G"].examples_per_s_per_gpu * RELATIVE_SPEED["H100"])
    assert "measured" in speeds.explain("A10G") and "the measured A10G" in speeds.explain("H100")

    # `thrifty plan` with the store's measurement prices the whole run and names the winner
    cloud = with_compute(cfg, launcher="skypilot", clouds=["aws", "azure"], accelerators=["A10G:1", "H100:1"],
                         on_demand_fallback=False)
    assert speed_key(cloud) == key  # where it trains does not change what it trains
    plan = plan_text(cloud, source="offline", measured=got)
    examples = cloud.train.total_steps(start["train_examples"], 1) * cloud.train.examples_per_step(1)
    assert f"# Estimated cost of the whole run, cheapest first ({examples:,} examples to train" in plan
    assert "# Winner: " in plan and "A10G: measured" in plan and "H100: the measured A10G" in plan
    yaml.safe_load(plan)  # the cost table is YAML comments under a task
    # the CLI reads the store itself (`--speeds table` does not)
    from thrifty.cli import main

    path = tmp_path / "cloud.yaml"
    path.write_text(yaml.safe_dump(cloud.model_dump(mode="json")))
    assert main(["plan", "--config", str(path), "--source", "offline"]) == 0
    assert "A10G: measured" in capsys.readouterr().out
    assert main(["plan", "--config", str(path), "--source", "offline", "--speeds", "table"]) == 0
    assert "A10G: measured" not in capsys.readouterr().out


def test_the_budget_gate_prices_the_cheapest_run_and_holds_the_deadline(tmp_path):
    from tasks.budget import estimate_for

    store = str(tmp_path / "store")
    n_train, eps = 36_000_000, 64
    prep = PrepResult(key="k", hit=True, seconds=0.0, cold_seconds=0.0, examples={"train": n_train, "val": 10}, bytes=0)
    # CPU: 64 examples in 0.4 s = 160 examples/s, so an A10G is assumed at 16x = 2560/s, an H100 at 8.88x that
    smoke = SmokeResult(recipe="digits", steps=3, losses=[1.0], cpu_step_time_s=0.4, examples_per_step=eps,
                        parameters=1, precision_checked="fp32", cache_key="k")
    cfg = cloud_cfg(store, deadline_h=2.0).updated({"train": {"max_epochs": 1, "micro_batch": eps}}, "test")
    estimate = estimate_for(cfg, prep, smoke)
    a10g_h, h100_h = n_train / 2560 / 3600, n_train / (2560 * RELATIVE_SPEED["H100"]) / 3600
    assert a10g_h > 2.0 > h100_h  # the A10G would be cheaper per run here, but misses the deadline
    assert estimate.accelerator == "H100:1" and estimate.usd_per_hour == H100_SPOT
    assert estimate.hours == pytest.approx(h100_h + 300 / 3600) and "H100:1 spot on azure wins" in estimate.choice
    assert estimate.speeds is not None and "16x for an A10G" in estimate.speeds.explain("A10G")
    with pytest.raises(ConfigError, match="the fastest, H100:1 spot on azure, needs"):
        estimate_for(with_compute(cfg, deadline_h=0.5), prep, smoke)
    local = build_config({"run_name": "hw", "store": store, "compute": {"deadline_h": 0.001}})
    with pytest.raises(ConfigError, match="on this machine .* over compute.deadline_h 0.001 h"):
        estimate_for(local, prep, smoke)


def test_on_demand_stays_the_fallback_and_the_plan_says_what_it_would_save():
    cfg = cloud_cfg(on_demand_fallback=True, use_spot=True)
    cands = [k for k in candidates(cfg, "offline")[0] if not (k.spot and k.accelerator == "H100:1")]  # no H100 spot
    work = 1000.0 * 3600 * 40  # 40 h on an A10G: $12.10 spot; ~1.1 h on an on-demand H100 40x as fast: $7.56
    ranking = rank(cfg, cands, speeds_for(["A10G", "H100"], measured(a10g=1000.0, h100=40000.0)), work)
    assert [(x.candidate.accelerator, x.candidate.spot) for x in ranking.ranked] == [
        ("A10G:1", True), ("H100:1", False), ("A10G:1", False)]  # spot first: the user asked for on-demand as fallback
    assert ranking.winner.usd == pytest.approx((40 + 300 / 3600) * A10G_SPOT)
    assert ("(on-demand H100:1 on-demand on azure would cost $7.562 for ~1.1 h, but on-demand is only the fallback; "
            "set compute.use_spot=false to rank it first)") in ranking.why()
