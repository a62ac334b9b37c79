"""Script mode: the user's own command under the pipeline, through thrifty.session.

Bad input fails before anything is rented; the smoke test runs the command (log, save, resume) and
measures its step time; a script run killed -9 at random points resumes from its last COMMIT and
ends bit-identical to an uninterrupted run; SIGTERM loses no step; `thrifty run` of the example
completes through the real flow with the local launcher, surviving a preemption.
"""

from __future__ import annotations

import os
import random
import signal
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from conftest import REPO, python_env
from scripting import (committed_steps, kill_group, records, start, starts, summary, wait_for_step,
                       write_config)
from thrifty.config import ConfigError, build_config, load_config
from thrifty.usercode.script import check_script, script_total_steps
from training.validate import check_config

EXAMPLE = REPO / "examples" / "script" / "train.py"

# a script of the session API's misuses: MODE picks one
BAD_SCRIPT = '''
import os, sys, torch
from thrifty import session
mode = sys.argv[1]
sess = session.init(total_steps=50)
if mode == "crash":
    raise RuntimeError("the data file is gone")
start = 0 if mode == "no-resume" else (sess.load_latest() or (0, None))[0]
w = torch.zeros(3)
for step in range(start + 1, 51):
    w += 1
    sess.log(step, loss=1.0 / step)
    stop = sess.should_stop()
    if mode != "no-save" and (stop or sess.should_save(step)):
        sess.save({"w": w}, step)
    if stop:
        break
    if mode == "exit-on-notice" and step == 20:  # a framework that ends the fit itself on SIGTERM (Lightning does)
        sess.save({"w": w}, step)
        os.kill(os.getpid(), 15)
        sys.exit(0)
'''


def script_config(tmp_path: Path, command: str, **extra) -> object:
    return build_config({"run_name": "s", "recipe": "script", "store": str(tmp_path / "store"),
                         "recipe_params": {"command": command, **extra}})


@pytest.fixture
def bad_script(tmp_path: Path, monkeypatch) -> Path:
    monkeypatch.setenv("PYTHONPATH", python_env()["PYTHONPATH"])  # the command imports thrifty from this checkout
    path = tmp_path / "bad.py"
    path.write_text(BAD_SCRIPT)
    return path


# ---------------------------------------------------------------- bad input, before anything runs


@pytest.mark.parametrize("params, expected", [
    ({}, "'recipe_params.command' is required"),
    ({"command": "   "}, "is empty"),
    ({"command": "python does/not/exist.py"}, "the script 'does/not/exist.py' does not exist"),
    ({"command": "no-such-trainer-binary --fast"}, "'no-such-trainer-binary' is not on PATH"),
    ({"command": "python -m no_such_pkg.train"}, "module 'no_such_pkg.train' cannot be found"),
    ({"command": "python train.py", "epochs": 3}, "'recipe_params.epochs' is not an option of script mode"),
    ({"command": "python 'unclosed"}, "cannot be split like a shell command"),
])
def test_bad_input_is_a_config_error_naming_the_fix(tmp_path, params, expected):
    cfg = build_config({"recipe": "script", "recipe_params": params, "store": str(tmp_path)})
    with pytest.raises(ConfigError) as err:
        check_config(cfg)
    assert expected in str(err.value)


def test_thrifty_run_refuses_a_missing_script_with_exit_2(tmp_path, capsys):
    from thrifty.cli import main

    path = tmp_path / "run.json"
    path.write_text('{"recipe": "script", "recipe_params": {"command": "python nowhere/train.py"}, '
                    f'"store": "{tmp_path / "store"}"}}')
    assert main(["run", "--config", str(path)]) == 2
    assert "nowhere/train.py' does not exist" in capsys.readouterr().err
    assert not (tmp_path / "store").exists(), "nothing is written for a config the node would reject"


def test_the_example_validates_and_the_gate_needs_a_length(monkeypatch):
    monkeypatch.chdir(REPO)
    cfg = load_config(REPO / "examples" / "script.yaml")
    params = check_script(cfg)
    assert params.argv()[0] == sys.executable, "'python' is the interpreter that runs thrifty"
    assert script_total_steps(cfg, reported=440) == 440
    capped = cfg.updated({"train": {**cfg.train.model_dump(), "max_steps": 100}})
    assert script_total_steps(capped, reported=None) == 100 and script_total_steps(capped, 440) == 100
    with pytest.raises(ConfigError, match="cannot price the run"):
        script_total_steps(cfg, reported=None)


def test_the_session_api_loads_no_torch_until_init():
    import subprocess

    probe = "import sys, thrifty.session, thrifty.usercode.script\nprint(sorted(m for m in ('torch', 'prefect') if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", probe], env=python_env(), cwd=REPO, capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


# ---------------------------------------------------------------- the smoke test


@pytest.mark.slow
def test_smoke_test_of_a_good_script_measures_its_step_time(tmp_path, monkeypatch):
    from training.script_smoke import smoke_script

    monkeypatch.setenv("PYTHONPATH", python_env()["PYTHONPATH"])
    cfg = script_config(tmp_path, f"python {EXAMPLE} --epochs 2", smoke_steps=3)
    result = smoke_script(cfg)
    assert result.steps == 4, "3 steps, then one more after resuming from the checkpoint at step 3"
    assert 0 < result.cpu_step_time_s < 5
    assert result.total_steps == 88, "2 epochs x 44 steps, as the script reported it"
    assert len(result.losses) == 4 and all(0 < x < 5 for x in result.losses)
    assert result.examples_per_step is None and result.parameters is None, "what the script did not say is left out"
    assert not (tmp_path / "store").exists(), "the smoke test trains in a throwaway store"


@pytest.mark.slow
@pytest.mark.parametrize("mode, expected", [
    ("no-save", "without a single sess.save(state, step)"),
    ("crash", "RuntimeError: the data file is gone"),
    ("no-resume", "did not resume from its checkpoint at step 3"),
])
def test_smoke_test_refuses_a_script_that_would_lose_money(tmp_path, bad_script, mode, expected):
    from training.validate import SmokeTestFailed
    from training.script_smoke import smoke_script

    with pytest.raises(SmokeTestFailed) as err:
        smoke_script(script_config(tmp_path, f"python {bad_script} {mode}"))
    assert expected in str(err.value)


@pytest.mark.slow
def test_a_script_that_never_saves_fails_the_job_with_exit_2(tmp_path, bad_script):
    config = write_config(tmp_path, "nosave", f"python {bad_script} no-save")
    proc = start(config, tmp_path)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 2, err
    assert "without a single sess.save(state, step)" in err


@pytest.mark.slow
def test_a_script_that_exits_on_a_notice_without_asking_is_interrupted_not_complete(tmp_path, bad_script):
    config = write_config(tmp_path, "notice", f"python {bad_script} exit-on-notice")
    proc = start(config, tmp_path)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err
    ends = [r for r in records(tmp_path / "store", "notice") if r.get("event") in ("interrupted", "end")]
    assert [(r["event"], r["step"], r.get("reason")) for r in ends] == [("interrupted", 20, "signal")]
    assert not (tmp_path / "store" / "runs" / "notice" / "summary.json").exists(), "not a finished run"


# ---------------------------------------------------------------- crash safety


@pytest.mark.slow
def test_killed_at_random_points_resumes_from_its_last_commit_bit_exact(tmp_path, request):
    command = f"python {EXAMPLE} --epochs 10"  # 440 steps; dropout: the RNG streams must survive too
    # the run never killed trains beside the killed ones (another run of the store, one thread each): it only has to
    # be done by the end, and its start-up overlaps theirs
    ref = start(write_config(tmp_path, "ref", command), tmp_path)
    ref_done = ThreadPoolExecutor(1).submit(ref.communicate, timeout=300)
    request.addfinalizer(lambda: ref.poll() is None and os.killpg(ref.pid, signal.SIGKILL))  # a failure below

    store, config, rng = tmp_path / "store", write_config(tmp_path, "chaos", command), random.Random()
    seed = rng.randrange(10**6)
    rng.seed(seed)
    # kill -9 of the script (thrifty.faults) after a random step, inside a checkpoint's data, between its data and
    # its COMMIT, or after the COMMIT: each attempt must resume from the newest complete checkpoint
    kills = [("step", rng.randint(5, 60)), (rng.choice(["during_data", "after_data", "after_commit"]), rng.randint(1, 3)),
             ("step", rng.randint(5, 60))]
    expected_starts = [0]
    for point, n in kills:
        proc = start(config, tmp_path, THRIFTY_FAULT=f"{point}:{n}")
        out, err = proc.communicate(timeout=120)
        assert proc.returncode == 1, f"killed -9 at {point}:{n}: a failure the launcher restarts (seed {seed}) {err}"
        expected_starts.append((committed_steps(store, "chaos") or [0])[-1])  # none yet: from scratch
    # a spot notice: the script saves at the step it reached and exits 0, nothing lost
    t0 = time.time()
    proc = start(config, tmp_path)
    wait_for_step(proc, store, "chaos", expected_starts[-1] + 3, since=t0)
    proc.send_signal(signal.SIGTERM)  # the wrapper forwards it to the script
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    stopped = [r for r in records(store, "chaos") if r.get("event") == "interrupted"][-1]
    reached = max(r["step"] for r in records(store, "chaos") if "loss" in r and r["time_unix"] >= t0)
    assert stopped["reason"] == "signal" and committed_steps(store, "chaos")[-1] == reached == stopped["step"]
    expected_starts.append(reached)
    # and a kill -9 of the whole node program from outside, mid-run
    t0 = time.time()
    proc = start(config, tmp_path)
    wait_for_step(proc, store, "chaos", reached + 25, since=t0)
    kill_group(proc)
    expected_starts.append(committed_steps(store, "chaos")[-1])

    proc = start(config, tmp_path)
    out, err = proc.communicate(timeout=180)
    assert proc.returncode == 0, err
    assert starts(store, "chaos") == expected_starts, f"seed {seed}"
    resumed = summary(store, "chaos")
    # resumes follow the checkpoints' lineage: an attempt killed before its first save passes on the count it loaded
    assert 1 <= resumed["resumes"] <= sum(1 for s in expected_starts[1:] if s)
    assert resumed["steps"] == 440
    _, err = ref_done.result()
    assert ref.returncode == 0, err
    reference = summary(tmp_path / "store", "ref")
    assert reference["steps"] == 440 and reference["status"] == "completed"
    assert resumed["weights_sha256"] == reference["weights_sha256"], f"seed {seed}"


# ---------------------------------------------------------------- the pipeline


@pytest.mark.slow
def test_thrifty_run_of_the_example_completes_through_the_flow(prefect_harness, tmp_path, monkeypatch):
    from flows.train_pipeline import train_pipeline

    monkeypatch.chdir(REPO)  # the example's command is relative to the project, as `thrifty run` is started
    monkeypatch.setenv("PYTHONPATH", python_env()["PYTHONPATH"])
    cfg = load_config(REPO / "examples" / "script.yaml", [
        f"store={tmp_path / 'store'}", "run_name=script-flow",
        # the preemption lands at exactly step 30 (training.boundary), however fast the 88 steps go
        "recipe_params.command=python examples/script/train.py --epochs 2", "compute.preempt_after_steps=30",
        "compute.preempt_grace_s=20", "train.early_stopping.enabled=false"])
    out = train_pipeline(cfg, poll_s=0.2)
    assert out.summary is not None and out.summary.status == "completed" and out.summary.steps == 88
    assert [a.end_reason for a in out.job.attempts] == ["preempted", "succeeded"]
    assert out.summary.resumes == 1
    assert out.smoke.total_steps == 88 and out.estimate.total_steps == 88
    assert out.cache_hit is False and 0 < out.cost_usd < out.on_demand_usd
