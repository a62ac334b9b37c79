"""Crash safety on an object store: a run writing to S3 (moto's server) killed with kill -9, once between a
checkpoint's data and its commit marker, resumes from the last complete checkpoint and ends bit-identical.
Checkpoints are written in the background: a kill may find the newest snapshot's write in flight (never two)."""

from __future__ import annotations

import json
import re
import signal
import subprocess
import uuid
from pathlib import Path

import pytest

from conftest import PYTHON, python_env
from stores import child_env

pytestmark = pytest.mark.slow

CONFIG = {
    "recipe": "digits",
    "recipe_params": {"hidden": 128, "dropout": 0.2},  # dropout: the RNG state must survive the resume too
    "train": {
        "max_epochs": 2,
        "micro_batch": 16,
        "grad_accum_steps": 2,
        "precision": "fp32",
        "checkpoint_every": 7,
        "keep_last": 2,
        "log_every": 5,
        "warmup_steps": 5,
        "early_stopping": {"patience": 50},
    },
}  # 2 epochs x 44 steps = 88 optimizer steps


def write_config(tmp_path: Path, run_name: str, store: str) -> Path:
    path = tmp_path / f"{run_name}.json"
    path.write_text(json.dumps({**CONFIG, "run_name": run_name, "store": store}))
    return path


def train(config: Path, env: dict[str, str], **extra_env: str) -> subprocess.CompletedProcess:
    return subprocess.run([PYTHON, "-m", "training", "--config", str(config)], env={**env, **extra_env},
                          capture_output=True, text=True, timeout=120)


def test_kill9_on_s3_resumes_from_last_commit_bit_exact(tmp_path, s3_standin):
    # the same run on a local directory, never killed: what the S3 run must end as, bit for bit
    ref = train(write_config(tmp_path, "ref", str(tmp_path / "local-store")), python_env())
    assert ref.returncode == 0, ref.stderr[-3000:]
    reference = json.loads((tmp_path / "local-store" / "runs" / "ref" / "summary.json").read_text())

    s3 = s3_standin.client()
    bucket = f"thrifty-resume-{uuid.uuid4().hex[:8]}"
    s3.create_bucket(Bucket=bucket)
    env = child_env(python_env(), s3_standin.env())  # endpoint and dummy keys only: no real AWS anywhere
    config = write_config(tmp_path, "spot", f"s3://{bucket}/team")
    ckpt = "team/runs/spot/ckpt/"

    def step_objects() -> dict[str, set[str]]:
        out: dict[str, set[str]] = {}
        for page in s3.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=ckpt):
            for obj in page.get("Contents", []):
                step, _, name = obj["Key"][len(ckpt):].partition("/")
                out.setdefault(step, set()).add(name)
        return out

    # 1: killed at its 17th optimizer step: step 7 is committed; step 14's write may still have been in flight
    killed = train(config, env, THRIFTY_FAULT="step:17")
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-3000:]
    objects = step_objects()
    assert objects.pop("step-000000007") == {"state.pt", "COMMIT"}, "never two writes in flight"
    assert objects in ({"step-000000014": {"state.pt", "COMMIT"}}, {"step-000000014": {"state.pt"}}, {}), objects
    resumed = 14 if objects.get("step-000000014") == {"state.pt", "COMMIT"} else 7

    # 2: resumes there, commits 7 steps later (the next save waits for that write), then dies with the data of the
    # save after it uploaded and its commit marker not
    killed = train(config, env, THRIFTY_FAULT="after_data:2")
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-3000:]
    assert f"from step {resumed}" in killed.stderr
    objects = step_objects()
    assert objects[f"step-{resumed + 7:09d}"] == {"state.pt", "COMMIT"}
    assert objects[f"step-{resumed + 14:09d}"] == {"state.pt"}, "a torn checkpoint: data without its commit marker"

    # 3: the torn checkpoint is never loaded; the run resumes from the one before and finishes
    done = train(config, env)
    assert done.returncode == 0, done.stderr[-3000:]
    assert re.search(rf"resumed run 'spot' from step {resumed + 7}\b", done.stderr), done.stderr[-3000:]
    summary = json.loads(s3.get_object(Bucket=bucket, Key="team/runs/spot/summary.json")["Body"].read())
    assert summary["resumes"] == 2
    assert summary["steps"] == reference["steps"]
    assert summary["weights_sha256"] == reference["weights_sha256"]
    assert summary["final_metrics"] == reference["final_metrics"]

    # what is left is whole: every checkpoint committed, no multipart upload abandoned, metrics uploaded
    assert all(names == {"state.pt", "COMMIT"} for names in step_objects().values()), step_objects()
    assert not s3.list_multipart_uploads(Bucket=bucket).get("Uploads")
    metrics = s3.list_objects_v2(Bucket=bucket, Prefix="team/runs/spot/metrics/").get("Contents", [])
    assert len(metrics) == 3, "one metrics file per attempt"
