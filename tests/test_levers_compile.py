"""Faster is cheaper: train.compile, train.tf32, the fused AdamW, and the fleet's THRIFTY_PRECISION / THRIFTY_COMPILE.

The compiled runs train in child processes (torch.compile imports torch._dynamo and inductor: the test process stays
as eager training leaves it) on a tiny digits model; a kill is a fault point at a fixed step, not a timer.
"""

from __future__ import annotations

import datetime as dt
import json
import subprocess
from pathlib import Path

import pytest
import torch

from conftest import PYTHON, python_env
from thrifty.config import ConfigError, build_config, config_from_env
from thrifty.config.fleet import ENV_SOURCES
from thrifty.launchers.base import node_env
from thrifty.money.estimate import COMPILE_ASSUMED_S, estimate_run
from thrifty.money.throughput import speed_key
from training.speedups import fused_optimizer_ok, tf32_decision, uncompiled_keys

TODAY = dt.date(2026, 1, 2)


# ---------------------------------------------------------------- TF32 and the fused optimizer: pure decisions


@pytest.mark.parametrize("device, capability, precision, setting, used, why", [
    ("cuda", (8, 0), "fp32", True, True, "on: fp32 on compute capability 8.0"),
    ("cuda", (9, 0), "fp32", True, True, "9.0"),
    ("cuda", (8, 6), "fp32", False, False, "train.tf32 is false"),
    ("cuda", (7, 5), "fp32", True, False, "7.5 < 8.0"),
    ("cuda", (8, 0), "bf16", True, False, "bf16 autocast"),
    ("cuda", (8, 9), "fp16", True, False, "fp16 autocast"),
    ("cpu", None, "fp32", True, False, "not applicable on cpu"),
])
def test_tf32_is_used_only_for_fp32_on_ampere_or_newer(device, capability, precision, setting, used, why):
    got, reason = tf32_decision(device, capability, precision, setting)
    assert got is used and why in reason


def test_the_default_adamw_is_not_fused_on_cpu():
    from training.recipes.digits import recipe

    model = torch.nn.Linear(3, 2)
    assert not fused_optimizer_ok(list(model.parameters())) and not fused_optimizer_ok([])
    opt = recipe().make_optimizer(model, build_config({}).train)
    assert not opt.defaults.get("fused")


def test_compiled_prefixes_are_stripped_from_older_state_dicts():
    t = torch.zeros(1)
    assert uncompiled_keys({"_orig_mod.a.weight": t, "_orig_mod.b": t}) == {"a.weight": t, "b": t}
    plain = {"a.weight": t}
    assert uncompiled_keys(plain) is plain


# ---------------------------------------------------------------- fields, fingerprint, speed key, estimate


def test_new_fields_at_their_defaults_keep_older_fingerprints():
    cfg = build_config({})
    assert (cfg.train.compile, cfg.train.tf32) == ("off", True)
    assert "compile" not in cfg.train_settings() and "tf32" not in cfg.train_settings()
    compiled = build_config({"train": {"compile": "on"}})
    no_tf32 = build_config({"train": {"tf32": False}})
    fingerprints = {c.training_fingerprint() for c in (cfg, compiled, no_tf32)}
    assert len(fingerprints) == 3, "compile and TF32 change the numerics on a GPU: a different training"
    assert speed_key(cfg) == speed_key(no_tf32) != speed_key(compiled)  # compiled runs measure each other's speed


def test_bad_compile_value_names_the_choices():
    with pytest.raises(ConfigError, match="train.compile"):
        build_config({"train": {"compile": "yes"}})


def test_the_estimate_counts_compilation_when_compile_is_on():
    kw = dict(steps=100, cpu_seconds_per_example=0.001, examples_per_step=32, usd_per_hour=1.0, nodes=1,
              accelerator=None, launcher="local")
    eager, compiled = estimate_run(**kw), estimate_run(**kw, compiled=True)
    assert compiled.startup_s == pytest.approx(eager.startup_s + COMPILE_ASSUMED_S)
    assert compiled.usd > eager.usd and "torch.compile" in compiled.assumption


# ---------------------------------------------------------------- fleet defaults from the environment


def test_fleet_variables_fill_what_the_config_does_not_write():
    env = {"THRIFTY_PRECISION": "bf16", "THRIFTY_COMPILE": "on"}
    cfg = build_config({"run_name": "fleet-{date}"}).resolved(TODAY, env)
    assert (cfg.run_name, cfg.train.precision, cfg.train.compile) == ("fleet-20260102", "bf16", "on")
    assert cfg.setting_sources() == {"precision": "environment THRIFTY_PRECISION",
                                     "compile": "environment THRIFTY_COMPILE"}


def test_a_value_written_in_the_config_wins_over_the_environment():
    env = {"THRIFTY_PRECISION": "bf16", "THRIFTY_COMPILE": " ON "}  # (case and blanks are forgiven)
    cfg = build_config({"train": {"precision": "fp32"}}).resolved(TODAY, env)
    assert (cfg.train.precision, cfg.train.compile) == ("fp32", "on")
    assert cfg.setting_sources() == {"precision": "config", "compile": "environment THRIFTY_COMPILE"}
    plain = build_config({}).resolved(TODAY, {"THRIFTY_PRECISION": ""})  # an empty variable is unset
    assert plain.train.precision == "auto" and plain.setting_sources() == {"precision": "default",
                                                                           "compile": "default"}


@pytest.mark.parametrize("var, value, choices", [("THRIFTY_PRECISION", "fp64", "auto, bf16, fp16, fp32"),
                                                 ("THRIFTY_COMPILE", "true", "off, on")])
def test_a_bad_fleet_variable_is_a_clear_error(var, value, choices):
    with pytest.raises(ConfigError) as exc:
        build_config({"train": {"precision": "fp32", "compile": "off"}}).resolved(TODAY, {var: value})
    msg = str(exc.value)
    assert f"${var}='{value}'" in msg and choices in msg and "Nothing was launched" in msg


def test_the_node_trains_what_the_flow_resolved_whatever_its_own_environment(monkeypatch):
    flow_side = build_config({"run_name": "fleet-node"}).resolved(TODAY, {"THRIFTY_COMPILE": "on"})
    env = node_env(flow_side, [])
    assert json.loads(env[ENV_SOURCES]) == {"precision": "default", "compile": "environment THRIFTY_COMPILE"}
    node_side = config_from_env(env)
    assert node_side == flow_side and node_side.train.compile == "on"
    # the node's own variables differ: the config it was handed has every setting written
    again = node_side.resolved(TODAY, {"THRIFTY_COMPILE": "off", "THRIFTY_PRECISION": "fp16"})
    assert (again.train.compile, again.train.precision) == ("on", "auto")
    assert node_side.setting_sources(env)["compile"] == "environment THRIFTY_COMPILE"
    assert flow_side.updated({"store": "/elsewhere"}).setting_sources() == flow_side.setting_sources()


# ---------------------------------------------------------------- compiled training (child processes)


def write_config(tmp_path: Path, run_name: str, compile: str, **train) -> Path:
    data = {"run_name": run_name, "store": str(tmp_path / "store"), "recipe_params": {"hidden": 16, "limit": 400},
            "train": {"max_epochs": 2, "micro_batch": 32, "precision": "fp32", "checkpoint_every": 5,
                      "compile": compile, "early_stopping": {"enabled": False}, **train}}  # 20 steps, dropout on
    path = tmp_path / f"{run_name}-{compile}.json"
    path.write_text(json.dumps(data))
    return path


def run(config: Path, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run([PYTHON, "-m", "training", "--config", str(config)], env={**python_env(), **env},
                          capture_output=True, text=True, timeout=600)


def summary(tmp_path: Path, run_name: str) -> dict:
    return json.loads((tmp_path / "store" / "runs" / run_name / "summary.json").read_text())


def saved_keys(tmp_path: Path, run_name: str) -> set[str]:
    keys: set[str] = set()
    for state in (tmp_path / "store" / "runs" / run_name / "ckpt").glob("*/state.pt"):
        keys |= set(torch.load(state, weights_only=True)["model"])
    return keys


@pytest.mark.slow
def test_compiled_run_killed_and_resumed_ends_bit_identical(tmp_path):
    ref = run(write_config(tmp_path, "ref", "on"))
    assert ref.returncode == 0, ref.stderr
    config = write_config(tmp_path, "spot", "on")
    killed = run(config, THRIFTY_FAULT="step:13")  # SIGKILL after step 13, mid-epoch
    assert killed.returncode == -9, killed.stderr
    resumed = run(config)
    assert resumed.returncode == 0, resumed.stderr
    assert "resumed run 'spot' from step " in resumed.stderr  # 10, or 5 where the kill beat the write of 10
    got, want = summary(tmp_path, "spot"), summary(tmp_path, "ref")
    assert got["weights_sha256"] == want["weights_sha256"] and got["resumes"] == 1
    speed = got["speedups"]
    assert speed["compile"] == "on" and speed["compile_s"] > 0 and not speed["fused_optimizer"]
    assert speed["tf32"] is False and "cpu" in speed["tf32_why"]
    assert speed["settings_from"] == {"precision": "config", "compile": "config"}
    lines = [json.loads(line) for f in (tmp_path / "store" / "runs" / "spot" / "metrics").glob("*.jsonl")
             for line in f.read_text().splitlines()]
    compiles = [r for r in lines if r.get("event") == "compile"]
    assert len(compiles) == 2 and all(r["compile_s"] >= 0 for r in compiles)  # one per attempt
    assert not any(k.startswith("_orig_mod.") or "._orig_mod." in k for k in saved_keys(tmp_path, "spot"))


@pytest.mark.slow
@pytest.mark.parametrize("first, then", [("on", "off"), ("off", "on")])
def test_a_checkpoint_resumes_with_compile_switched(tmp_path, first, then):
    """The first job pauses at epoch 1 (a checkpoint); the next finishes with compile switched, from there."""
    paused = run(write_config(tmp_path, "switch", first, stop_at_epoch=1))
    assert paused.returncode == 0, paused.stderr
    done = run(write_config(tmp_path, "switch", then))
    assert done.returncode == 0, done.stderr
    assert "resumed run 'switch' from step 10" in done.stderr
    got = summary(tmp_path, "switch")
    assert got["steps"] == 20 and got["speedups"]["compile"] == then


@pytest.mark.slow
def test_the_fleet_variable_compiles_a_run_that_does_not_write_compile(tmp_path):
    config = write_config(tmp_path, "fleet", "off")
    data = json.loads(config.read_text())
    del data["train"]["compile"]
    config.write_text(json.dumps(data))
    done = run(config, THRIFTY_COMPILE="on", THRIFTY_PRECISION="bf16")  # precision is written: the config wins
    assert done.returncode == 0, done.stderr
    got = summary(tmp_path, "fleet")
    assert got["precision"] == "fp32" and got["speedups"]["compile"] == "on"
    assert got["speedups"]["settings_from"] == {"precision": "config", "compile": "environment THRIFTY_COMPILE"}
    bad = run(config, THRIFTY_COMPILE="maybe")
    assert bad.returncode == 2 and "$THRIFTY_COMPILE='maybe'" in bad.stderr


def test_an_older_checkpoint_of_a_compiled_model_restores(tmp_path):
    """A state saved from a compiled module (keys under '_orig_mod.') loads into the loop's uncompiled model."""
    from training.early_stopping import EarlyStopping
    from training.resume import restore

    cfg = build_config({"run_name": "old", "recipe_params": {"hidden": 8}})
    torch.manual_seed(0)
    source, target = torch.nn.Linear(4, 3), torch.nn.Linear(4, 3)
    opt = torch.optim.AdamW(target.parameters())
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0)
    scaler = torch.amp.GradScaler("cpu", enabled=False)
    stopper = EarlyStopping("min", 3, 0.0, True)
    saved = {"config": cfg.model_dump_json(), "model": {f"_orig_mod.{k}": v for k, v in source.state_dict().items()},
             "optimizer": opt.state_dict(), "scheduler": sched.state_dict(), "scaler": {},
             "early_stopping": stopper.state_dict()}
    restore(cfg, 1, saved, target, opt, sched, scaler, stopper, None)
    assert all(torch.equal(a, b) for a, b in zip(source.state_dict().values(), target.state_dict().values()))
