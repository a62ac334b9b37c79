"""Chaos: a run killed again and again at random points (kill -9 inside and between checkpoint writes, kill -9 from
outside, SIGTERM) on a file store and on S3 finishes bit-identical to a run never killed, redoes at most one
checkpoint interval per kill plus the steps trained while the newest snapshot was being written in the background
(never two writes in flight: the checkpoint before it is always committed), loses nothing on SIGTERM, and leaves
nothing behind: no temp files, no torn checkpoint directories below the newest, nothing in the temp directory or
the spool."""

from __future__ import annotations

import json
import math
import os
import random
import re
import signal
import subprocess
import time
import uuid
from pathlib import Path

import pytest

from conftest import PYTHON, python_env
from stores import child_env

pytestmark = pytest.mark.slow

INTERVAL = 7
KILLS = int(os.environ.get("THRIFTY_CHAOS_KILLS", "5"))  # per store (each kind once), plus two SIGTERMs; bench/bench_chaos.py: more
CONFIG = {
    "recipe": "digits",
    "recipe_params": {"hidden": 128, "dropout": 0.2},  # dropout: the RNG state must survive the resume too
    "train": {"max_epochs": math.ceil((KILLS + 2) * 18 / 44) + 2, "micro_batch": 16, "grad_accum_steps": 2,
              "precision": "fp32", "checkpoint_every": INTERVAL, "keep_last": 2, "log_every": 1, "warmup_steps": 5,
              "early_stopping": {"patience": 50}},
}  # 44 steps an epoch; each stop advances the run ~16 steps: room for every stop before the end


def run(config: Path, env: dict[str, str], **extra: str) -> subprocess.Popen:
    return subprocess.Popen([PYTHON, "-m", "training", "--config", str(config)], env={**env, **extra},
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


class Progress:
    """How far the run got, from its metric lines (on S3 as far as its last upload, at a checkpoint: there the
    redone-steps check can only see whole intervals, and the file store is the sharper one)."""

    def __init__(self, read_lines):
        self.read_lines = read_lines

    def records(self) -> list[dict]:
        out = []
        for line in self.read_lines():
            try:
                out.append(json.loads(line))
            except json.JSONDecodeError:
                pass  # a line being written
        return out

    def reached(self) -> int:
        return max((r.get("step", 0) for r in self.records() if "loss" in r), default=0)

    def committed(self) -> list[dict]:
        """The checkpoint events: each says the step it snapshot and the step at which its COMMIT landed."""
        return [r for r in self.records() if r.get("event") == "checkpoint"]


def allowed_redo(start: int, reached: int, committed_steps: set[int]) -> int:
    """What a kill at step ``reached`` of an attempt that resumed at ``start`` may redo: one interval, plus the steps
    trained since the newest snapshot when that snapshot's write was still in flight (no checkpoint event for it)."""
    newest = max(start, reached // INTERVAL * INTERVAL)  # the schedule: on multiples of INTERVAL, across resumes
    if newest == reached and newest - INTERVAL > start and newest - INTERVAL not in committed_steps:
        newest -= INTERVAL  # the save due at `reached` may have been waiting for the write before it: never two
    in_flight = newest > start and newest not in committed_steps
    return INTERVAL + (reached - newest if in_flight else 0)


@pytest.fixture(scope="module")
def reference(tmp_path_factory) -> dict:
    """The run never killed, on a file store: the summary both stores' chaos runs must end at (one run for both)."""
    tmp = tmp_path_factory.mktemp("chaos-ref")
    (private_tmp := tmp / "tmpdir").mkdir()
    ref_config = tmp / "ref.json"
    ref_config.write_text(json.dumps({**CONFIG, "run_name": "ref", "store": str(tmp / "ref-store")}))
    ref = run(ref_config, {**python_env(), "TMPDIR": str(private_tmp), "THRIFTY_SPOOL": str(tmp / "spool")})
    _, err = ref.communicate(timeout=180)
    assert ref.returncode == 0, err[-3000:]
    assert not [p for p in private_tmp.rglob("*") if "thrifty" in p.name], list(private_tmp.rglob("*"))
    return json.loads((tmp / "ref-store" / "runs" / "ref" / "summary.json").read_text())


@pytest.mark.parametrize("where", ["file", "s3"])
def test_random_kills_and_sigterms_end_bit_exact_and_leave_nothing_behind(tmp_path, where, request, reference):
    private_tmp = tmp_path / "tmpdir"
    private_tmp.mkdir()
    # a fixed pace (thrifty.faults.pace): a stop from outside lands a few steps after the one seen, on any machine
    env = {**python_env(), "TMPDIR": str(private_tmp), "THRIFTY_SPOOL": str(tmp_path / "spool"),
           "THRIFTY_MIN_STEP_S": "0.01"}

    if where == "s3":
        s3_standin = request.getfixturevalue("s3_standin")
        s3 = s3_standin.client()
        bucket = f"thrifty-chaos-{uuid.uuid4().hex[:8]}"
        s3.create_bucket(Bucket=bucket)
        env = child_env(env, s3_standin.env())
        store_uri = f"s3://{bucket}/chaos"

        def keys(prefix: str) -> list[str]:
            pages = s3.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=f"chaos/{prefix}")
            return [o["Key"][len("chaos/"):] for p in pages for o in p.get("Contents", [])]

        def metric_lines() -> list[str]:
            return [line for k in keys("runs/chaos/metrics/")
                    for line in s3.get_object(Bucket=bucket, Key=f"chaos/{k}")["Body"].read().decode().splitlines()]
    else:
        store_dir = tmp_path / "store"
        store_uri = str(store_dir)

        def keys(prefix: str) -> list[str]:
            return [str(p.relative_to(store_dir)) for p in store_dir.glob(f"{prefix}**/*") if p.is_file()]

        def metric_lines() -> list[str]:
            return [line for p in (store_dir / "runs" / "chaos" / "metrics").glob("*.jsonl")
                    for line in p.read_text().splitlines()]

    config = tmp_path / "chaos.json"
    config.write_text(json.dumps({**CONFIG, "run_name": "chaos", "store": store_uri}))
    progress = Progress(metric_lines)
    rng = random.Random(f"chaos-{where}")
    kinds = (["step", "during_data", "after_data", "after_commit", "outside"] * KILLS)[:KILLS]
    rng.shuffle(kinds)
    kinds = kinds[:3] + ["sigterm"] + kinds[3:6] + ["sigterm"] + kinds[6:]
    tally = {"kills": 0, "inside_writes": 0, "sigterms": 0}
    worst_redone, worst_allowed = 0, 0
    previous: tuple[str, int, int] | None = None  # the last stop: its kind, the step reached, the redo it allows

    def resumed_at(stderr: str) -> int:
        found = re.search(r"resumed run 'chaos' from step (\d+)", stderr)
        return int(found.group(1)) if found else 0

    def check_resume(stderr: str) -> None:
        """Each attempt says where it resumed: the previous stop may have cost what ``allowed_redo`` says (none on
        SIGTERM)."""
        nonlocal worst_redone
        if previous is None:
            return
        kind, reached, allowed = previous
        redone = reached - resumed_at(stderr)
        worst_redone = max(worst_redone, redone)
        assert redone <= allowed, (f"after a {kind} at step {reached} the run resumed {redone} steps back (allowed "
                                   f"{allowed}: one interval plus the steps of a write in flight)")

    for kind in kinds:
        before = progress.reached()
        if kind in ("outside", "sigterm"):  # from outside, at a random moment of progress
            proc = run(config, env)
            target = before + rng.randint(3, 25)
            deadline = time.monotonic() + 90
            while progress.reached() < target and proc.poll() is None:
                assert time.monotonic() < deadline, "no progress"
                time.sleep(0.01)
            reached = progress.reached()
            if proc.poll() is None:
                proc.send_signal(signal.SIGKILL if kind == "outside" else signal.SIGTERM)
        else:
            # during_data counts 64 KiB chunks: a checkpoint here is two, so 1..4 lands in the attempt's first two
            n = rng.randint(3, 30) if kind == "step" else rng.randint(1, 4) if kind == "during_data" \
                else rng.randint(1, 3)
            proc = run(config, env, THRIFTY_FAULT=f"{kind}:{n}")
            reached = None
        _, err = proc.communicate(timeout=180)
        check_resume(err)
        if proc.returncode == 0 and kind != "sigterm":
            previous = None
            break  # the run finished before the fault point came
        if kind == "sigterm":
            assert proc.returncode == 0 and "interrupted at step" in err, err[-3000:]
            tally["sigterms"] += 1
            reached = int(err.split("interrupted at step ")[1].split(";")[0])
        else:
            assert proc.returncode == -signal.SIGKILL, f"{kind}: {err[-3000:]}"
            tally["kills"] += 1
            tally["inside_writes"] += kind in ("during_data", "after_data")
        reached = progress.reached() if reached is None else max(reached, progress.reached())
        allowed = 0 if kind == "sigterm" else allowed_redo(resumed_at(err), reached,
                                                              {r["step"] for r in progress.committed()})
        worst_allowed = max(worst_allowed, allowed)
        previous = (kind, reached, allowed)

    done = run(config, env)
    _, err = done.communicate(timeout=300)
    assert done.returncode == 0, err[-3000:]
    check_resume(err)
    summary_key = "runs/chaos/summary.json"
    if where == "s3":
        summary = json.loads(s3.get_object(Bucket=bucket, Key=f"chaos/{summary_key}")["Body"].read())
    else:
        summary = json.loads((store_dir / summary_key).read_text())
    assert summary["weights_sha256"] == reference["weights_sha256"], "bit-exact after every kill"
    assert summary["final_metrics"] == reference["final_metrics"]
    assert tally["kills"] >= KILLS - 1 and tally["inside_writes"] >= 2 and tally["sigterms"] == 2, tally

    # nothing left behind
    ckpt = [k for k in keys("runs/chaos/ckpt/")]
    dirs: dict[str, set[str]] = {}
    for k in ckpt:
        step_dir, _, name = k.rpartition("/")
        dirs.setdefault(step_dir, set()).add(name)
    assert all(names == {"state.pt", "COMMIT"} for names in dirs.values()), dirs
    if where == "file":
        leftovers = [p for p in store_dir.rglob(".*") if p.is_file()]
        assert leftovers == [], f"temp files left in the store: {leftovers}"
        assert all(any(d.iterdir()) for d in store_dir.rglob("*") if d.is_dir()), "empty directories left"
    else:
        assert not s3.list_multipart_uploads(Bucket=bucket).get("Uploads")
    assert not [p for p in private_tmp.rglob("*") if "thrifty" in p.name], list(private_tmp.rglob("*"))
    assert not list((tmp_path / "spool").glob("*")), "nothing left in the spool"
    lags = [r["committed_at_step"] - r["step"] for r in progress.committed() if r.get("async")]
    assert lags and min(lags) >= 0, "checkpoint events say when each background write was committed"
    print(f"\nchaos on {where}: {tally}, worst redone {worst_redone} steps (interval {INTERVAL}, worst allowed "
          f"{worst_allowed}); steps trained while a write was in flight: max {max(lags)}, mean "
          f"{sum(lags) / len(lags):.2f} over {len(lags)} writes")
