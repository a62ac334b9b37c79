"""Where a run's things live in the store, and readers for them (metrics, summary, the cost ledger).

``runs/<run_id>/``: ``ckpt/`` (training), ``metrics/<attempt>.jsonl`` (training),
``summary.json`` (training, when finished), ``lease.json`` (who watches the run: ``thrifty.runs.lease``);
the cost ledger is ``thrifty.money.ledger``'s.
"""

from __future__ import annotations

import json
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from thrifty.runs.reuse import HalfExport, WarmStart
from thrifty.storage import NotFound, Store, StoreError, join_key


class BestMetric(BaseModel):
    model_config = ConfigDict(frozen=True)

    name: str
    value: float | None
    step: int | None
    checkpoint_step: int | None


class RunSummary(BaseModel):
    """``runs/<run_id>/summary.json``: written by the training program when a run finishes.

    Recipes add fields of their own (``Recipe.summary_fields``), kept as extras.
    """

    model_config = ConfigDict(frozen=True, extra="allow")

    run_id: str
    recipe: str
    status: str  # completed | stopped_early
    steps: int
    total_steps: int
    epochs: float
    stopped_early: bool
    best_metric: BestMetric
    final_metrics: dict[str, float] = Field(default_factory=dict)
    wall_time_s: float
    data_wait_fraction: float
    checkpoint_time_fraction: float
    checkpoints_written: int
    resumes: int
    precision: str
    device: str
    world_size: int
    cache_key: str
    training_fingerprint: str | None = None  # absent in summaries written before it existed
    weights_sha256: str
    init_from: WarmStart | None = None  # where its weights started (train.init_from), and the savings reference
    half_export: HalfExport | None = None  # its gold weights in half precision (train.export_half)
    tags: dict[str, str] = Field(default_factory=dict)  # its cost allocation tags (RunConfig.tags)
    # the last attempt's utilisation (training.telemetry): GPU busy %, memory, power, CPU %, the data-wait and
    # checkpoint shares of step time, achieved TFLOPS and MFU; a field the machine could not measure is absent
    utilisation: dict[str, float | str] | None = None
    # the in-loop levers used (training.speedups): compile on/off and its seconds, TF32 and why, a fused optimizer,
    # and where train.precision and train.compile came from (config, a fleet variable, the default)
    speedups: dict[str, Any] | None = None


def run_key(run_id: str, *parts: str) -> str:
    return join_key("runs", run_id, *parts)


def read_summary(store: Store, run_id: str) -> RunSummary | None:
    try:
        return RunSummary.model_validate_json(store.get_bytes(run_key(run_id, "summary.json")))
    except NotFound:
        return None


def summary_best_step(store: Store, run_id: str) -> int | None:
    """The best checkpoint's step as the summary names it, read leniently (summaries of any age, or damaged: None).
    The archiver keeps it hot whatever else the summary holds."""
    try:
        best = json.loads(store.get_bytes(run_key(run_id, "summary.json"))).get("best_metric") or {}
        return int(best["checkpoint_step"]) if best.get("checkpoint_step") is not None else None
    except (NotFound, StoreError, ValueError, TypeError, AttributeError, KeyError):
        return None


def write_summary(store: Store, summary: RunSummary) -> None:
    store.put_bytes(run_key(summary.run_id, "summary.json"), summary.model_dump_json(indent=2).encode())


def finished_since(store: Store, run_id: str, since_unix: float) -> bool:
    """Whether the run's summary was written at or after ``since_unix`` (a job of this watch finished it)."""
    return any(o.last_modified.timestamp() >= since_unix - 1.0 for o in store.list(run_key(run_id, "summary.json")))


def finished_summary(store: Store, run_id: str, training_fingerprint: str) -> RunSummary | None:
    """The run's summary if it already finished training with this fingerprint (nothing left to train), else None."""
    summary = read_summary(store, run_id)
    if summary is not None and summary.training_fingerprint == training_fingerprint:
        return summary
    return None


def read_jsonl(store: Store, key: str) -> list[dict[str, Any]]:
    """The records of one JSON-lines object (a metrics file): [] when it is gone, a line still being written skipped."""
    try:
        text = store.get_bytes(key).decode()
    except NotFound:
        return []
    records = []
    for line in text.splitlines():
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError:
            continue  # a line still being written
    return records


def read_metrics(store: Store, run_id: str, since_unix: float = 0.0) -> list[dict[str, Any]]:
    """All metric records of the run, oldest attempt first (records after ``since_unix`` only)."""
    records: list[dict[str, Any]] = []
    for obj in store.list(run_key(run_id, "metrics") + "/"):
        if not obj.key.endswith(".jsonl") or obj.last_modified.timestamp() < since_unix:
            continue
        records += [rec for rec in read_jsonl(store, obj.key) if rec.get("time_unix", 0.0) >= since_unix]
    return records


def latest_progress(records: list[dict[str, Any]]) -> dict[str, Any]:
    """The newest step/loss/total and eval metrics out of metric records."""
    out: dict[str, Any] = {}
    for rec in records:
        event = rec.get("event")
        if event is None and "loss" in rec:
            out.update(step=rec["step"], loss=rec["loss"], samples_per_s=rec.get("samples_per_s"))
        elif event == "start":  # a job that ends at a rung (train.stop_at_epoch) is watched and projected to there
            out.update(total_steps=rec.get("stop_step") or rec["total_steps"], step=rec["step"])
        elif event == "eval":
            out["eval"] = {k: v for k, v in rec.items() if k.startswith("val_")}
        elif event == "total_steps":  # script mode: the script told its length after it started
            out["total_steps"] = rec["total_steps"]
        elif event in ("checkpoint", "interrupted", "end"):
            out["step"] = max(out.get("step", 0), rec.get("step", rec.get("steps", 0)))
    return out


def reached_end(records: list[dict[str, Any]], stop_at_epoch: int | None) -> bool:
    """Whether a job's records (since it started) say its work is done and saved: the run's end, or the rung it was
    told to stop at (``train.stop_at_epoch``). Such a job is never stopped, reported or alerted as over budget."""
    return any(r.get("event") == "end" or (r.get("event") == "rung" and stop_at_epoch is not None
                                           and r.get("epoch") == stop_at_epoch) for r in records)
