"""What earlier jobs of the same model cost per step, all in: the store's history the estimate trusts first.

A job is billed from the moment its instance starts, not from its first step, and between steps it evaluates,
checkpoints and logs. Each attempt of an earlier run of the same model (``speed_key``) on the same hardware (the
local launcher's CPU, or one accelerator) says, from its ledger row and its metric lines:

- start-up: billing start -> the training program's ``start`` record (boot, install, imports, data, model,
  compilation);
- all-in seconds per step: the billed time after start-up over the steps it trained (evaluations, checkpoints,
  logging and the final save included);
- the training step alone: the median logged ``step_time_s``.

The estimate prices a run's steps at the all-in rate and adds the start-up: measured, not assumed.
"""

from __future__ import annotations

import statistics
import time
from collections import defaultdict

from pydantic import BaseModel, ConfigDict

from thrifty.money.ledger import Attempt, read_attempts
from thrifty.money.pricing import accelerator_of
from thrifty.runs import read_jsonl
from thrifty.storage import Store

LOCAL = "local"  # the local launcher's hardware: this machine's CPU


class JobHistory(BaseModel):
    """The store's measurements of one model on one kind of hardware."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    where: str  # LOCAL, or an accelerator NAME
    runs: list[str]
    attempts: int
    startup_s: float  # median billed seconds before training began
    all_in_step_s: float  # billed seconds after start-up per step trained
    step_s: float  # median logged training step time (no evaluation, checkpoint or logging)
    steps: int  # steps the attempts trained

    @property
    def overhead(self) -> float:
        """All-in time per step over the training step alone (>= 1): what evaluation and checkpoints add."""
        return max(1.0, self.all_in_step_s / self.step_s) if self.step_s > 0 else 1.0

    def describe(self) -> str:
        hardware = "this machine's CPU (local launcher)" if self.where == LOCAL else self.where
        return (f"measured on {hardware} by {self.attempts} attempt(s) of run(s) {', '.join(self.runs)}: "
                f"{self.all_in_step_s:.4g} s a step all in (evaluation and checkpoints: x{self.overhead:.2f} the "
                f"step alone), {self.startup_s:.0f} s of start-up")


def where_of(attempt: Attempt) -> str | None:
    """The hardware an attempt trained on: LOCAL, the accelerator NAME of its cloud instance, or None."""
    if attempt.region == LOCAL:
        return LOCAL
    accelerator = accelerator_of(attempt.cloud, attempt.instance)
    return accelerator.partition(":")[0] if accelerator else None


def _measure(attempt: Attempt, records: list[dict]) -> tuple[float, float, int, list[float]] | None:
    """(start-up s, billed s after start-up, steps trained, logged step times) of one attempt, or None when its
    metric lines cannot say (it trained nothing, or is still running)."""
    start = next((r for r in records if r.get("event") == "start"), None)
    if start is None or attempt.ended_unix is None:
        return None
    stepped = [r for r in records if r.get("event") is None and "step" in r and "loss" in r]
    ends = [r for r in records if r.get("event") in ("checkpoint", "end", "rung", "interrupted")]
    last = max([int(r["step"]) for r in stepped] + [int(r.get("step", r.get("steps", 0)) or 0) for r in ends],
               default=0)
    steps = last - int(start.get("step") or 0)
    began = float(start["time_unix"])
    if steps <= 0 or not attempt.started_unix - 60.0 <= began <= attempt.ended_unix:
        return None
    times = [float(r["step_time_s"]) for r in stepped if r.get("step_time_s")]
    return max(0.0, began - attempt.started_unix), max(0.0, attempt.ended_unix - began), steps, times


def job_history(store: Store, key: str, now: float | None = None) -> dict[str, JobHistory]:
    """Per hardware (LOCAL or accelerator NAME), the history of the model ``key`` (``throughput.speed_key``) over
    every run in the store whose attempts ended. An attempt is matched to its metric file by when training began."""
    now = time.time() if now is None else now
    files: dict[str, list[str]] = defaultdict(list)
    for obj in store.list("runs/"):
        parts = obj.key.split("/")
        if len(parts) == 4 and parts[2] == "metrics" and parts[3].endswith(".jsonl"):
            files[parts[1]].append(obj.key)
    found: dict[str, list[tuple[str, tuple[float, float, int, list[float]]]]] = defaultdict(list)
    for run_id, keys in sorted(files.items()):
        attempts = [a for a in read_attempts(store, run_id, now) if a.ended_unix is not None]
        if not attempts:
            continue
        for k in sorted(keys):
            records = read_jsonl(store, k)
            start = next((r for r in records if r.get("event") == "start"), None)
            if start is None or start.get("speed_key") != key:
                continue
            began = float(start.get("time_unix", 0.0))
            attempt = next((a for a in reversed(attempts) if a.started_unix - 60.0 <= began <= (a.ended_unix or now)),
                           None)
            where = where_of(attempt) if attempt is not None else None
            measured = _measure(attempt, records) if attempt is not None else None
            if where is not None and measured is not None:
                found[where].append((run_id, measured))
    out = {}
    for where, rows in found.items():
        steps = sum(m[2] for _, m in rows)
        times = [t for _, m in rows for t in m[3][1:]] or [t for _, m in rows for t in m[3]]  # first window: warm-up
        all_in = sum(m[1] for _, m in rows) / steps
        out[where] = JobHistory(where=where, runs=sorted({r for r, _ in rows}), attempts=len(rows),
                                startup_s=statistics.median(m[0] for _, m in rows), all_in_step_s=all_in,
                                step_s=statistics.median(times) if times else all_in, steps=steps)
    return out
