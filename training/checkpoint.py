"""Atomic checkpoints in the store, autoresume from the latest complete one, retention.

Layout: ``runs/<run_id>/ckpt/step-000000120/state.pt`` then ``.../COMMIT`` (JSON with the
state's size and sha256). The COMMIT object is written last and removed first, so a reader
that finds it finds a whole checkpoint; anything without one is a torn write and ignored.
A checkpoint whose COMMIT is in a cold tier (``thrifty archive``) is archived: listed, never read.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import re
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from thrifty.config import ConfigError
from thrifty.runs import run_key
from thrifty.storage import Archived, NotFound, Store, is_cold, join_key
from training.runtime import fault_point

log = logging.getLogger("thrifty.checkpoint")

_STEP_DIR = re.compile(r"step-(\d{9})$")


@dataclass(frozen=True)
class CheckpointInfo:
    step: int
    prefix: str  # store key of the checkpoint's directory
    commit: dict[str, Any]
    archived: bool = False  # in a cold tier: restore before loading (its commit record is not read)

    @property
    def metric(self) -> float | None:
        return self.commit.get("metric")


class CheckpointArchived(ConfigError):
    """The newest checkpoint of a run is in cold storage: the run cannot resume until it is restored."""


class CheckpointManager:
    def __init__(self, store: Store, run_id: str, keep_last: int, mode: str = "min"):
        self.store = store
        self.run_id = run_id
        self.prefix = run_key(run_id, "ckpt")
        self.keep_last = keep_last
        self.mode = mode  # how "best" is judged: min or max of the commit's metric

    # ------------------------------------------------------------------ listing
    def committed(self) -> list[CheckpointInfo]:
        """Complete checkpoints, oldest first."""
        out = []
        for obj in self.store.list(self.prefix + "/"):
            parent, _, name = obj.key.rpartition("/")
            m = _STEP_DIR.search(parent)
            if name != "COMMIT" or not m:
                continue
            try:  # an archived commit record is not read (a restore first, or a retrieval fee)
                commit = None if is_cold(obj.storage_class) else json.loads(self.store.get_bytes(obj.key))
            except Archived:  # archived since the listing
                commit = None
            except (NotFound, json.JSONDecodeError):
                continue
            out.append(CheckpointInfo(int(m.group(1)), parent, commit or {}, archived=commit is None))
        return sorted(out, key=lambda c: c.step)

    def best(self, infos: list[CheckpointInfo]) -> CheckpointInfo | None:
        scored = [c for c in infos if c.metric is not None and not math.isnan(c.metric)]
        if not scored:
            return None
        pick = min if self.mode == "min" else max
        return pick(scored, key=lambda c: c.metric)

    # ------------------------------------------------------------------ saving
    def save(self, state: dict[str, Any], step: int, metric: float | None) -> float:
        """Write a checkpoint for ``step`` atomically; returns seconds taken."""
        t0 = time.perf_counter()
        ckpt = join_key(self.prefix, f"step-{step:09d}")
        with tempfile.TemporaryDirectory(prefix="thrifty-ckpt-") as tmp:
            local = Path(tmp) / "state.pt"
            torch.save(state, local)
            digest, size = _sha256_file(local)
            self.store.put_file(join_key(ckpt, "state.pt"), local)
        fault_point("after_data")
        commit = {"step": step, "bytes": size, "sha256": digest, "metric": metric, "metric_mode": self.mode,
                  "time_unix": time.time()}
        self.store.put_bytes(join_key(ckpt, "COMMIT"), json.dumps(commit).encode())
        fault_point("after_commit")
        self.prune()
        return time.perf_counter() - t0

    def prune(self) -> None:
        """Keep the last ``keep_last`` complete checkpoints and the best one; drop torn leftovers below them."""
        infos = self.committed()
        keep = {c.step for c in infos[-self.keep_last :]}
        best = self.best(infos)
        if best is not None:
            keep.add(best.step)
        for c in infos:
            if c.step not in keep:
                self._delete(c.prefix)
        newest = infos[-1].step if infos else None
        if newest is not None:  # torn writes older than the newest complete checkpoint are garbage
            committed_steps = {c.step for c in infos}
            for obj in self.store.list(self.prefix + "/"):
                m = _STEP_DIR.search(obj.key.rpartition("/")[0])
                if m and int(m.group(1)) < newest and int(m.group(1)) not in committed_steps:
                    self.store.delete(obj.key)

    def _delete(self, ckpt_prefix: str) -> None:
        self.store.delete(join_key(ckpt_prefix, "COMMIT"))  # first: it stops being "complete"
        for obj in self.store.list(ckpt_prefix + "/"):
            self.store.delete(obj.key)

    def _archived(self, info: CheckpointInfo) -> CheckpointArchived:
        uri, run = self.store.uri, self.run_id
        return CheckpointArchived(
            f"run {run!r}: its newest checkpoint (step {info.step}) is archived in cold storage in {uri}. Restore it "
            f"with `thrifty archive restore {run} --store {uri}` (run it again until it says done), then start the "
            "run again; or give this run a new run_name to train from scratch.")

    # ------------------------------------------------------------------ loading
    def load_latest(self) -> tuple[CheckpointInfo, dict[str, Any]] | None:
        """The newest checkpoint whose data matches its commit record; older ones if it is damaged.

        An archived newest checkpoint is an error, not a reason to fall back: an older one would redo
        paid work and a fresh start would drop it, so the run waits for ``thrifty archive restore``.
        """
        for info in reversed(self.committed()):
            if info.archived:
                raise self._archived(info)
            with tempfile.TemporaryDirectory(prefix="thrifty-ckpt-") as tmp:
                local = Path(tmp) / "state.pt"
                try:
                    self.store.get_file(join_key(info.prefix, "state.pt"), local)
                except Archived:
                    raise self._archived(info) from None
                except NotFound:
                    log.warning("checkpoint at step %d has a commit record but no data; trying an older one", info.step)
                    continue
                digest, size = _sha256_file(local)
                if (digest, size) != (info.commit.get("sha256"), info.commit.get("bytes")):
                    log.warning("checkpoint at step %d is damaged (hash mismatch); trying an older one", info.step)
                    continue
                state = torch.load(local, map_location="cpu", weights_only=True)
            return info, state
        return None


def _sha256_file(path: Path) -> tuple[str, int]:
    h = hashlib.sha256()
    size = 0
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
            size += len(chunk)
    return h.hexdigest(), size


def daly_interval_s(save_s: float, mtbf_s: float) -> float:
    """Daly (2006) optimum compute time between checkpoints for save cost ``save_s`` and MTBF ``mtbf_s``."""
    if save_s >= 2 * mtbf_s:
        return mtbf_s
    r = save_s / (2 * mtbf_s)
    return math.sqrt(2 * save_s * mtbf_s) * (1 + math.sqrt(r) / 3 + r / 9) - save_s
