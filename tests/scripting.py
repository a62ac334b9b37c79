"""Helpers for script-mode tests: configs, `python -m training` as its own process group, the run's records."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

from conftest import PYTHON, python_env


def write_config(tmp: Path, run_name: str, command: str, **train: Any) -> Path:
    cfg = {"run_name": run_name, "recipe": "script", "store": str(tmp / "store"),
           "recipe_params": {"command": command},
           "train": {"checkpoint_every": 10, "log_every": 1, "keep_last": 2, **train}}
    path = tmp / f"{run_name}.json"
    path.write_text(json.dumps(cfg))
    return path


def start(config: Path, cwd: Path, **env: str) -> subprocess.Popen:
    """The node program for ``config``, in a process group of its own (a kill takes the script with it)."""
    return subprocess.Popen([PYTHON, "-m", "training", "--config", str(config)], env={**python_env(), **env}, cwd=cwd,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)


def records(store: Path, run: str) -> list[dict]:
    out = []
    for f in (store / "runs" / run / "metrics").glob("*.jsonl"):
        for line in f.read_text().splitlines():
            try:
                out.append(json.loads(line))
            except json.JSONDecodeError:
                pass  # a line being written
    return sorted(out, key=lambda r: r["time_unix"])


def logged_step(store: Path, run: str, since: float = 0.0) -> int:
    return max((r["step"] for r in records(store, run) if "loss" in r and r["time_unix"] >= since), default=0)


def wait_for_step(proc: subprocess.Popen, store: Path, run: str, target: int, since: float, timeout_s: float = 120):
    deadline = time.monotonic() + timeout_s
    while logged_step(store, run, since) < target:
        assert proc.poll() is None, f"exited {proc.returncode} before step {target}: {proc.communicate()}"
        assert time.monotonic() < deadline, f"no step {target} within {timeout_s} s"
        time.sleep(0.01)


def kill_group(proc: subprocess.Popen, sig: int = signal.SIGKILL) -> None:
    os.killpg(proc.pid, sig)
    proc.communicate(timeout=60)


def committed_steps(store: Path, run: str) -> list[int]:
    ckpt = store / "runs" / run / "ckpt"
    return sorted(int(d.name.split("-")[1]) for d in ckpt.glob("step-*") if (d / "COMMIT").exists())


def starts(store: Path, run: str) -> list[int]:
    """The step each attempt started from, in order."""
    return [r["step"] for r in records(store, run) if r.get("event") == "start"]


def summary(store: Path, run: str) -> dict:
    return json.loads((store / "runs" / run / "summary.json").read_text())
