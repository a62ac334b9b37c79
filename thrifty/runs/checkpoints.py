"""Where checkpoints live in a store and what makes one complete: names, commit records, listing, the best one.

Layout: ``runs/<run_id>/ckpt/step-000000120/state.pt`` then ``.../COMMIT`` (JSON: the state's
size and sha256, the validation metric and its mode). The COMMIT object is written last and
removed first, so a reader that finds it finds a whole checkpoint; a step directory without one
is a torn write. A checkpoint whose COMMIT is in a cold tier (``thrifty archive``) is archived:
listed, never read. No torch here: the archiver and reports list checkpoints without it;
``training.checkpoint`` writes, loads and prunes them on top of this module.
"""

from __future__ import annotations

import json
import logging
import math
import re
from dataclasses import dataclass
from typing import Any

from thrifty.config import ConfigError
from thrifty.runs.records import run_key
from thrifty.storage import Archived, NotFound, Store, is_cold, join_key

log = logging.getLogger("thrifty.checkpoint")

COMMIT = "COMMIT"  # the commit record, written last
STATE = "state.pt"  # the checkpoint's data
_STEP_DIR = re.compile(r"step-(\d{9})$")
_KEY = re.compile(r"^runs/([^/]+)/ckpt/step-(\d{9})/")


def ckpt_prefix(run_id: str) -> str:
    """``runs/<run_id>/ckpt``: every checkpoint of the run lives below it."""
    return run_key(run_id, "ckpt")


def step_prefix(run_id: str, step: int) -> str:
    """The directory of one checkpoint: ``runs/<run_id>/ckpt/step-000000120``."""
    return join_key(ckpt_prefix(run_id), f"step-{step:09d}")


def parse_key(key: str) -> tuple[str, int, str] | None:
    """``runs/r/ckpt/step-000000120/COMMIT`` -> ('r', 120, 'runs/r/ckpt/step-000000120/'); None for other keys."""
    m = _KEY.match(key)
    return (m.group(1), int(m.group(2)), m.group(0)) if m else None


def step_of_dir(prefix: str) -> int | None:
    """The step of a checkpoint directory key, or None when ``prefix`` is not one."""
    m = _STEP_DIR.search(prefix)
    return int(m.group(1)) if m else None


@dataclass(frozen=True)
class CheckpointInfo:
    step: int
    prefix: str  # store key of the checkpoint's directory
    commit: dict[str, Any]
    archived: bool = False  # in a cold tier: restore before loading (its commit record is not read)

    @property
    def metric(self) -> float | None:
        value = self.commit.get("metric")
        return float(value) if isinstance(value, (int, float)) else None


class CheckpointArchived(ConfigError):
    """The newest checkpoint of a run is in cold storage: the run cannot resume until it is restored."""


def committed(store: Store, run_id: str) -> list[CheckpointInfo]:
    """Complete checkpoints of the run, oldest first."""
    out = []
    for obj in store.list(ckpt_prefix(run_id) + "/"):
        parent, _, name = obj.key.rpartition("/")
        step = step_of_dir(parent)
        if name != COMMIT or step is None:
            continue
        try:  # an archived commit record is not read (a restore first, or a retrieval fee)
            commit = None if is_cold(obj.storage_class) else json.loads(store.get_bytes(obj.key))
        except Archived:  # archived since the listing
            commit = None
        except NotFound:  # pruned since the listing
            continue
        except (json.JSONDecodeError, UnicodeDecodeError):
            log.warning("checkpoint at step %d has a damaged commit record (%s, not JSON); it is not used", step,
                        obj.key)
            continue
        if commit is not None and not isinstance(commit, dict):
            log.warning("checkpoint at step %d has a commit record that is not a JSON object (%s); it is not used",
                        step, obj.key)
            continue
        out.append(CheckpointInfo(step, parent, commit or {}, archived=commit is None))
    return sorted(out, key=lambda c: c.step)


def best(infos: list[CheckpointInfo], mode: str) -> CheckpointInfo | None:
    """The checkpoint with the best recorded metric (``mode`` min or max), or None when none recorded one."""
    scored = [c for c in infos if c.metric is not None and not math.isnan(c.metric)]
    if not scored:
        return None
    pick = min if mode == "min" else max
    return pick(scored, key=lambda c: c.metric)


def best_checkpoint(store: Store, run_id: str) -> CheckpointInfo | None:
    """The run's best complete checkpoint (its gold weights), as retention and archival judge it: the one place
    ``init_from``'s ``:best`` / ``:gold`` and the half-precision export find it."""
    hot = [c for c in committed(store, run_id) if not c.archived]
    return best(hot, mode_of(hot))


def mode_of(infos: list[CheckpointInfo], default: str = "min") -> str:
    """The metric mode the newest commit records that says one (older commits did not record it)."""
    return next((c.commit["metric_mode"] for c in reversed(infos) if c.commit.get("metric_mode")), default)


def archived_error(store: Store, run_id: str, info: CheckpointInfo) -> CheckpointArchived:
    uri = store.uri
    return CheckpointArchived(
        f"run {run_id!r}: its newest checkpoint (step {info.step}) is archived in cold storage in {uri}. Restore it "
        f"with `thrifty archive restore {run_id} --store {uri}` (run it again until it says done), then start the "
        "run again; or give this run a new run_name to train from scratch.")
