"""Checkpoints: atomic save/load, torn writes never loaded, retention, the Daly interval, and resume guards."""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import subprocess
import textwrap
from pathlib import Path

import pytest
import torch

from conftest import PYTHON, python_env
from thrifty.config import ConfigError, build_config
from thrifty.storage import FileStore
from training.checkpoint import CheckpointManager, daly_interval_s
from training.recipes import Recipe

RUN = "ckpt-test"


def fake_state(step: int) -> dict:
    g = torch.Generator().manual_seed(step)
    return {
        "model": {"w": torch.randn(4, 3, generator=g), "b": torch.zeros(3) + step},
        "loop": {"step": step, "epoch": 0},
        "config": json.dumps({"run_name": RUN}),
    }


def same_state(a: dict, b: dict) -> bool:
    return (a["loop"] == b["loop"] and a["config"] == b["config"]
            and all(torch.equal(a["model"][k], b["model"][k]) for k in a["model"]))


@pytest.fixture
def store(tmp_path) -> FileStore:
    return FileStore(tmp_path / "store")


def ckpt_dir(store: FileStore, step: int) -> Path:
    return store.root / "runs" / RUN / "ckpt" / f"step-{step:09d}"


# ---------------------------------------------------------------- save / load


def test_save_then_load_latest_round_trip(store):
    mgr = CheckpointManager(store, RUN, keep_last=3)
    assert mgr.committed() == [] and mgr.load_latest() is None
    seconds = mgr.save(fake_state(10), 10, 0.5)
    assert seconds >= 0
    infos = mgr.committed()
    assert [c.step for c in infos] == [10]
    assert infos[0].metric == 0.5
    assert infos[0].commit["bytes"] == (ckpt_dir(store, 10) / "state.pt").stat().st_size
    mgr.save(fake_state(20), 20, 0.4)
    info, state = mgr.load_latest()
    assert info.step == 20
    assert same_state(state, fake_state(20))
    # a fresh manager (a restarted process) sees the same thing
    info2, state2 = CheckpointManager(store, RUN, keep_last=3).load_latest()
    assert info2.step == 20 and same_state(state2, state)


def test_runs_do_not_see_each_others_checkpoints(store):
    CheckpointManager(store, RUN, keep_last=3).save(fake_state(5), 5, None)
    other = CheckpointManager(store, RUN + "-2", keep_last=3)
    assert other.committed() == [] and other.load_latest() is None
    # a run whose name is a prefix of another's must not pick up the other's checkpoints either
    CheckpointManager(store, "ab-long", keep_last=3).save(fake_state(7), 7, None)
    assert CheckpointManager(store, "ab", keep_last=3).load_latest() is None


def test_state_without_commit_is_never_loaded(store, caplog):
    mgr = CheckpointManager(store, RUN, keep_last=3)
    mgr.save(fake_state(10), 10, None)
    mgr.save(fake_state(20), 20, None)
    (ckpt_dir(store, 20) / "COMMIT").unlink()  # torn: data written, commit not
    assert [c.step for c in mgr.committed()] == [10]
    info, state = mgr.load_latest()
    assert info.step == 10 and same_state(state, fake_state(10))


@pytest.mark.parametrize("damage", ["truncated", "bit_flip", "missing", "empty"])
def test_commit_with_damaged_state_falls_back_with_a_warning(store, caplog, damage):
    mgr = CheckpointManager(store, RUN, keep_last=3)
    mgr.save(fake_state(10), 10, None)
    mgr.save(fake_state(20), 20, None)
    data = ckpt_dir(store, 20) / "state.pt"
    raw = data.read_bytes()
    if damage == "truncated":
        data.write_bytes(raw[: len(raw) // 2])
    elif damage == "bit_flip":  # same size, different bytes
        i = len(raw) // 2
        data.write_bytes(raw[:i] + bytes([raw[i] ^ 0xFF]) + raw[i + 1:])
    elif damage == "missing":
        data.unlink()
    else:
        data.write_bytes(b"")
    with caplog.at_level(logging.WARNING, logger="thrifty.checkpoint"):
        info, state = mgr.load_latest()
    assert info.step == 10 and same_state(state, fake_state(10))
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING and r.name == "thrifty.checkpoint"]
    assert len(warnings) == 1, caplog.text
    assert "step 20" in warnings[0].getMessage()


def test_unreadable_commit_record_is_ignored(store):
    mgr = CheckpointManager(store, RUN, keep_last=3)
    mgr.save(fake_state(10), 10, None)
    mgr.save(fake_state(20), 20, None)
    (ckpt_dir(store, 20) / "COMMIT").write_text('{"step": 20, "byt')  # torn commit (non-atomic store)
    info, _ = mgr.load_latest()
    assert info.step == 10


def test_all_checkpoints_damaged_means_start_fresh(store, caplog):
    mgr = CheckpointManager(store, RUN, keep_last=3)
    mgr.save(fake_state(10), 10, None)
    (ckpt_dir(store, 10) / "state.pt").write_bytes(b"garbage")
    with caplog.at_level(logging.WARNING, logger="thrifty.checkpoint"):
        assert mgr.load_latest() is None
    assert "damaged" in caplog.text


def test_killed_between_data_and_commit_leaves_previous_checkpoint(tmp_path, store):
    """THRIFTY_FAULT=after_data:2 SIGKILLs the process after the 2nd checkpoint's data, before its COMMIT."""
    script = textwrap.dedent(f"""
        import sys, torch
        sys.path.insert(0, {str(Path(__file__).parent)!r})
        from test_checkpoint import fake_state
        from thrifty.storage import FileStore
        from training.checkpoint import CheckpointManager
        mgr = CheckpointManager(FileStore({str(store.root)!r}), {RUN!r}, keep_last=3)
        mgr.save(fake_state(10), 10, 0.5)
        mgr.save(fake_state(20), 20, 0.4)
        print("not reached")
    """)
    proc = subprocess.run([PYTHON, "-c", script], env={**python_env(), "THRIFTY_FAULT": "after_data:2"},
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == -9, proc.stderr
    assert "not reached" not in proc.stdout
    assert (ckpt_dir(store, 20) / "state.pt").is_file()  # the data got there ...
    assert not (ckpt_dir(store, 20) / "COMMIT").exists()  # ... the commit did not
    mgr = CheckpointManager(store, RUN, keep_last=3)
    info, state = mgr.load_latest()
    assert info.step == 10 and same_state(state, fake_state(10))
    # the next save at the same step (the resumed run reaching it again) completes it
    mgr.save(fake_state(20), 20, 0.4)
    assert mgr.load_latest()[0].step == 20


# ---------------------------------------------------------------- retention


@pytest.mark.parametrize("mode, metrics, kept", [
    # keep_last=2: the last two plus the best by metric
    ("min", [0.9, 0.2, 0.5, 0.6, 0.7, 0.8], [2, 5, 6]),
    ("max", [0.9, 0.2, 0.5, 0.6, 0.7, 0.8], [1, 5, 6]),
    ("min", [0.9, 0.8, 0.7, 0.6, 0.5, 0.4], [5, 6]),  # the best is among the last ones
    ("min", [None, None, None, None], [3, 4]),  # no metric: only the last ones
    ("min", [0.3, float("nan"), None, 0.9, 0.8], [1, 4, 5]),  # NaN/None never best
    ("max", [float("nan"), 0.1, 0.2, 0.05, 0.04], [3, 4, 5]),
])
def test_retention_keeps_last_k_plus_best(store, mode, metrics, kept):
    mgr = CheckpointManager(store, RUN, keep_last=2, mode=mode)
    for step, metric in enumerate(metrics, start=1):
        mgr.save(fake_state(step), step, metric)
    assert [c.step for c in mgr.committed()] == kept
    on_disk = sorted(p.name for p in (store.root / "runs" / RUN / "ckpt").iterdir())
    assert on_disk == [f"step-{s:09d}" for s in kept]  # pruned ones leave no files behind
    for step in kept:  # every kept one is whole and loadable
        assert (ckpt_dir(store, step) / "state.pt").is_file()
    best = mgr.best(mgr.committed())
    scored = [(m, s) for s, m in enumerate(metrics, start=1) if m is not None and not math.isnan(m)]
    if scored:
        want = (min if mode == "min" else max)(scored)[1]
        assert best is not None and best.step == want
    else:
        assert best is None


def test_retention_drops_torn_leftovers_older_than_the_newest(store):
    mgr = CheckpointManager(store, RUN, keep_last=5)
    mgr.save(fake_state(10), 10, None)
    mgr.save(fake_state(20), 20, None)
    (ckpt_dir(store, 20) / "COMMIT").unlink()  # a torn write at 20: its process died before the commit ...
    mgr = CheckpointManager(store, RUN, keep_last=5)  # ... and the next one resumed
    mgr.save(fake_state(30), 30, None)  # ... is garbage once 30 is complete
    assert not ckpt_dir(store, 20).exists()
    assert [c.step for c in mgr.committed()] == [10, 30]


def test_retention_keeps_a_torn_write_newer_than_the_newest(store):
    mgr = CheckpointManager(store, RUN, keep_last=5)
    mgr.save(fake_state(10), 10, None)
    mgr.save(fake_state(30), 30, None)
    (ckpt_dir(store, 30) / "COMMIT").unlink()
    mgr.prune()
    assert (ckpt_dir(store, 30) / "state.pt").is_file()  # might be a write in flight: not touched
    assert mgr.load_latest()[0].step == 10


# ---------------------------------------------------------------- Young/Daly interval


def test_daly_interval_is_monotonic_in_save_time():
    mtbf = 7200.0
    saves = [0.001 * 1.2 ** i for i in range(80)] + [2 * mtbf - 1, 2 * mtbf, 3 * mtbf]
    taus = [daly_interval_s(s, mtbf) for s in sorted(saves)]
    assert all(t > 0 for t in taus)
    assert all(b >= a for a, b in zip(taus, taus[1:])), "interval must not shrink when saving gets slower"


@pytest.mark.parametrize("save_s, mtbf_s", [(1.0, 7200.0), (0.05, 3600.0), (5.0, 86400.0)])
def test_daly_interval_approaches_young_for_small_save_time(save_s, mtbf_s):
    young = math.sqrt(2 * save_s * mtbf_s)
    tau = daly_interval_s(save_s, mtbf_s)
    assert tau == pytest.approx(young, rel=0.01)
    assert tau == pytest.approx(young * (1 + math.sqrt(save_s / (2 * mtbf_s)) / 3 + save_s / (18 * mtbf_s)) - save_s)


def test_daly_interval_is_mtbf_when_saving_costs_more_than_twice_mtbf():
    assert daly_interval_s(500.0, 200.0) == 200.0
    assert daly_interval_s(400.0, 200.0) == 200.0


def test_daly_interval_grows_with_mtbf():
    taus = [daly_interval_s(2.0, m) for m in (60.0, 600.0, 3600.0, 36000.0)]
    assert taus == sorted(taus)


# ---------------------------------------------------------------- resume guards (small digits runs)


def digits_cfg(tmp_path: Path, run_name: str = "digits-resume", **params) -> dict:
    return {
        "run_name": run_name,
        "store": str(tmp_path / "store"),
        "recipe_params": {"hidden": 16, "limit": 400, **params},
        "train": {"max_epochs": 2, "micro_batch": 32, "precision": "fp32", "checkpoint_every": 5,
                  "early_stopping": {"enabled": False}},
    }


def test_restart_with_changed_model_raises_incompatible_checkpoint(tmp_path):
    from training.loop import train
    from training.resume import IncompatibleCheckpoint

    data = digits_cfg(tmp_path)
    first = train(build_config(data))
    assert first.status == "completed"
    changed = {**data, "recipe_params": {**data["recipe_params"], "hidden": 24}}
    with pytest.raises(IncompatibleCheckpoint) as exc:
        train(build_config(changed))
    assert isinstance(exc.value, ConfigError)
    msg = str(exc.value)
    assert "'digits-resume'" in msg and "recipe_params" in msg
    assert "'hidden': 16" in msg and "'hidden': 24" in msg
    assert "new run_name" in msg
    assert "\n" not in msg

    # through the CLI: exit code 2 and a one-line error, and the old checkpoints are untouched
    before = sorted(p.relative_to(tmp_path) for p in (tmp_path / "store" / "runs").rglob("*") if p.is_file())
    config = tmp_path / "run.json"
    config.write_text(json.dumps(data))
    proc = subprocess.run([PYTHON, "-m", "training", "--config", str(config), "--set", "recipe_params.hidden=24"],
                          cwd=tmp_path, env=python_env(), capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2, proc.stderr
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1 and "recipe_params" in errors[0] and "'digits-resume'" in errors[0], proc.stderr
    assert "Traceback" not in proc.stderr
    after = sorted(p.relative_to(tmp_path) for p in (tmp_path / "store" / "runs").rglob("*") if p.is_file())
    assert after == before


def other_digits() -> Recipe:
    """A recipe plug-in for the next test: digits under another name."""
    from training.recipes.digits import recipe

    return dataclasses.replace(recipe(), name="digits-copy")


def test_restart_with_another_recipe_raises_incompatible_checkpoint(tmp_path):
    from training.loop import train
    from training.resume import IncompatibleCheckpoint

    data = digits_cfg(tmp_path, "recipe-swap")
    data["train"]["max_steps"] = 3
    train(build_config(data))
    with pytest.raises(IncompatibleCheckpoint, match="recipe") as exc:
        train(build_config({**data, "recipe": f"{__name__}:other_digits"}))
    assert "'recipe-swap'" in str(exc.value)


def test_resuming_a_completed_run_does_not_train_further(tmp_path):
    from training.loop import train

    cfg = build_config(digits_cfg(tmp_path, "done"))
    first = train(cfg).summary
    ckpts = sorted((tmp_path / "store" / "runs" / "done" / "ckpt").iterdir())
    second = train(cfg).summary
    assert second.steps == first.steps == first.total_steps
    assert second.weights_sha256 == first.weights_sha256
    assert second.final_metrics == first.final_metrics
    assert second.checkpoints_written == first.checkpoints_written
    assert second.status == "completed" and second.resumes == first.resumes + 1
    assert sorted((tmp_path / "store" / "runs" / "done" / "ckpt").iterdir()) == ckpts


def test_resuming_a_run_stopped_early_does_not_train_further(tmp_path):
    from training.loop import train

    data = digits_cfg(tmp_path, "early")
    # an improvement would have to beat the best accuracy by more than 1.0: impossible, so it stops
    data["train"].update(eval_every=2, early_stopping={"metric": "val_accuracy", "mode": "max", "patience": 2,
                                                       "min_delta": 1.0})
    cfg = build_config(data)
    first = train(cfg).summary
    assert first.stopped_early and first.steps == 6
    second = train(cfg).summary
    assert (second.steps, second.weights_sha256, second.status) == (6, first.weights_sha256,
                                                                            "stopped_early")


def test_resume_after_precision_change_to_fp16(tmp_path):
    """A run checkpointed without a GradScaler (fp32/bf16) resumed where precision resolves to fp16.

    This happens with precision=auto when a preempted job comes back on an older GPU (no bf16: fp16 + GradScaler).
    The resume must either continue (a fresh scaler) or stop with a clear ConfigError, never crash.
    """
    from training.loop import train

    data = digits_cfg(tmp_path, "prec-switch")
    data["train"]["max_steps"] = 5
    train(build_config(data))
    data["train"].update(max_steps=10, precision="fp16")
    try:
        result = train(build_config(data))
    except ConfigError:
        return  # a clear, user-fixable refusal is acceptable
    assert result.summary.steps == 10 and result.summary.precision == "fp16"


def test_checkpoint_metric_belongs_to_the_checkpointed_weights(tmp_path):
    """The metric in a COMMIT (what "best" retention ranks by) must be the evaluation of *those* weights, and only a
    new best's: an evaluation that is a new best is saved at once, off the cadence.

    Evaluations at steps 3, 6, 9, ...; checkpoints every 5. A checkpoint taken between evaluations has not been
    evaluated, so it carries no metric; one of a new best carries that value; the cadence is not moved by them.
    """
    from training.loop import train

    data = digits_cfg(tmp_path, "metric-tag")  # 320 train examples / 32 = 10 steps per epoch, 20 steps
    data["train"].update(eval_every=3, keep_last=10)
    train(build_config(data))
    evals, bests = {}, set()
    for f in (tmp_path / "store" / "runs" / "metric-tag" / "metrics").glob("*.jsonl"):
        for line in f.read_text().splitlines():
            rec = json.loads(line)
            if rec.get("event") == "eval":
                evals[rec["step"]] = rec["val_loss"]
                if rec["best"]:
                    bests.add(rec["step"])
    assert sorted(evals) == [3, 6, 9, 12, 15, 18, 20] and bests
    infos = CheckpointManager(FileStore(tmp_path / "store"), "metric-tag", keep_last=10).committed()
    assert [c.step for c in infos] == sorted({5, 10, 15, 20} | bests), "the cadence, and every new best at once"
    tagged = {c.step: c.metric for c in infos}
    assert all(tagged[s] == evals[s] for s in bests), f"checkpoint metrics {tagged}, evaluations {evals}"
    assert all(tagged[s] is None for s in tagged if s not in bests), f"checkpoint metrics {tagged}, bests {bests}"
