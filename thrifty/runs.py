"""Where a run's things live in the store, and readers for them (metrics, summary, ledger).

``runs/<run_id>/``: ``ckpt/`` (training), ``metrics/<attempt>.jsonl`` (training),
``summary.json`` (training, when finished), ``ledger.jsonl`` (the launch task: one row per attempt).
"""

from __future__ import annotations

import json
from typing import Any

from thrifty.storage import NotFound, Store, join_key


def run_key(run_id: str, *parts: str) -> str:
    return join_key("runs", run_id, *parts)


def read_summary(store: Store, run_id: str) -> dict[str, Any] | None:
    try:
        return json.loads(store.get_bytes(run_key(run_id, "summary.json")))
    except NotFound:
        return None


def finished_summary(store: Store, run_id: str, training_fingerprint: str) -> dict[str, Any] | None:
    """The run's summary if it already finished training with this fingerprint (nothing left to train), else None."""
    summary = read_summary(store, run_id)
    if summary is not None and summary.get("training_fingerprint") == training_fingerprint:
        return summary
    return None


def read_metrics(store: Store, run_id: str, since_unix: float = 0.0) -> list[dict[str, Any]]:
    """All metric records of the run, oldest attempt first (records after ``since_unix`` only)."""
    records: list[dict[str, Any]] = []
    for obj in store.list(run_key(run_id, "metrics") + "/"):
        if not obj.key.endswith(".jsonl") or obj.last_modified.timestamp() < since_unix:
            continue
        try:
            text = store.get_bytes(obj.key).decode()
        except NotFound:
            continue
        for line in text.splitlines():
            try:
                rec = json.loads(line)
            except json.JSONDecodeError:
                continue  # a line still being written
            if rec.get("time_unix", 0.0) >= since_unix:
                records.append(rec)
    return records


def latest_progress(records: list[dict[str, Any]]) -> dict[str, Any]:
    """The newest step/loss/total and eval metrics out of metric records."""
    out: dict[str, Any] = {}
    for rec in records:
        event = rec.get("event")
        if event is None and "loss" in rec:
            out.update(step=rec["step"], loss=rec["loss"], samples_per_s=rec.get("samples_per_s"))
        elif event == "start":
            out.update(total_steps=rec["total_steps"], step=rec["step"])
        elif event == "eval":
            out["eval"] = {k: v for k, v in rec.items() if k.startswith("val_")}
        elif event in ("checkpoint", "interrupted", "end"):
            out["step"] = max(out.get("step", 0), rec.get("step", rec.get("steps", 0)))
    return out


def read_ledger(store: Store, run_id: str) -> list[dict[str, Any]]:
    try:
        text = store.get_bytes(run_key(run_id, "ledger.jsonl")).decode()
    except NotFound:
        return []
    return [json.loads(line) for line in text.splitlines() if line.strip()]


def write_ledger(store: Store, run_id: str, rows: list[dict[str, Any]]) -> None:
    """Replace the ledger atomically (object stores have no append): all rows, one JSON object a line."""
    store.put_bytes(run_key(run_id, "ledger.jsonl"), "".join(json.dumps(r) + "\n" for r in rows).encode())
