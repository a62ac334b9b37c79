"""Checkpoints of a run: atomic save, autoresume from the latest complete one, retention. Needs torch.

The layout and the commit records (names, listing, the best checkpoint, archived ones) are
``thrifty.runs.checkpoints``'; this module writes ``state.pt`` then ``COMMIT``, loads the newest
checkpoint whose data matches its record, and prunes.
"""

from __future__ import annotations

import hashlib
import json
import logging
import contextlib
import time
from pathlib import Path
from typing import Any, BinaryIO, Callable, Iterator

import torch

from thrifty.runs import checkpoints as layout
from thrifty.runs.checkpoints import CheckpointArchived, CheckpointInfo
from thrifty.spot.daly import daly_interval_s  # re-exported: its home is the library, shared with `thrifty simulate`
from thrifty.faults import fault_point
from thrifty.storage import Archived, NotFound, Store, join_key
from thrifty.storage.atomic import temp_beside
from thrifty.storage.spool import spool_dir

log = logging.getLogger("thrifty.checkpoint")

__all__ = ["CheckpointArchived", "CheckpointInfo", "CheckpointManager", "daly_interval_s"]


class CheckpointManager:
    def __init__(self, store: Store, run_id: str, keep_last: int, mode: str = "min"):
        self.store = store
        self.run_id = run_id
        self.prefix = layout.ckpt_prefix(run_id)
        self.keep_last = keep_last
        self.mode = mode  # how "best" is judged: min or max of the commit's metric
        self.best_step: int | None = None  # the run's best evaluation, kept too (a script may have saved those weights
        #                                    before it logged their evaluation: that COMMIT names no metric)
        self._index: list[CheckpointInfo] | None = None  # complete checkpoints, once listed
        self._swept = False  # torn leftovers below the newest checkpoint removed (once: this process tears none)

    # ------------------------------------------------------------------ listing
    def committed(self) -> list[CheckpointInfo]:
        """Complete checkpoints, oldest first, as the store holds them now (a listing and a read of each COMMIT)."""
        self._index = layout.committed(self.store, self.run_id)
        return list(self._index)

    def _known(self) -> list[CheckpointInfo]:
        """Complete checkpoints as this manager keeps them: read once, then updated by its own saves and prunes
        (one process writes a run's checkpoints: the run's lease says so)."""
        return list(self._index) if self._index is not None else self.committed()

    def best(self, infos: list[CheckpointInfo]) -> CheckpointInfo | None:
        return layout.best(infos, self.mode)

    # ------------------------------------------------------------------ saving
    def save(self, state: dict[str, Any], step: int, metric: float | None,
             on_commit: Callable[[], None] | None = None) -> float:
        """Write a checkpoint for ``step`` atomically; returns seconds taken.

        The state is streamed into the store once (beside its target on a file store, spooled then
        uploaded on an object store) while its sha256 is computed; the COMMIT record, written last,
        carries it. Nothing is read back. ``on_commit`` runs the moment the COMMIT is written.
        """
        t0 = time.perf_counter()
        ckpt = layout.step_prefix(self.run_id, step)
        try:
            with self.store.writer(join_key(ckpt, layout.STATE)) as f:
                sink = _Hashing(f)
                torch.save(state, sink)
                sink.flush()
        except BaseException:
            self._swept = False  # what this failed write left is swept at the next prune
            raise
        fault_point("after_data")
        commit = {"step": step, "bytes": sink.size, "sha256": sink.hexdigest(), "metric": metric,
                  "metric_mode": self.mode, "time_unix": time.time()}
        self.store.put_bytes(join_key(ckpt, layout.COMMIT), json.dumps(commit).encode())
        if on_commit is not None:
            on_commit()
        fault_point("after_commit")
        index = [c for c in self._known() if c.step != step]
        self._index = sorted(index + [CheckpointInfo(step, ckpt, commit)], key=lambda c: c.step)
        self.prune()
        return time.perf_counter() - t0

    def prune(self) -> None:
        """Keep the last ``keep_last`` complete checkpoints and the best one, from the index; the first prune of a
        process (and one after a failed write) also drops torn leftovers below them: one listing."""
        infos = self._known()
        keep = {c.step for c in infos[-self.keep_last :]}
        best = self.best(infos)
        if best is not None:
            keep.add(best.step)
        if self.best_step is not None:
            keep.add(self.best_step)
        for c in infos:
            if c.step not in keep:
                self._delete(c.prefix)
        self._index = [c for c in infos if c.step in keep]
        newest = infos[-1].step if infos else None
        if newest is not None and not self._swept:  # torn writes older than the newest complete checkpoint
            committed_steps = {c.step for c in infos}
            for obj in self.store.list(self.prefix + "/"):
                step = layout.step_of_dir(obj.key.rpartition("/")[0])
                if step is not None and step < newest and step not in committed_steps:
                    self.store.delete(obj.key)
            self.store.sweep(self.prefix)  # and what killed writers left beside them (temp files, empty dirs)
            self._swept = True

    def _delete(self, ckpt_prefix: str) -> None:
        """A checkpoint this manager knows whole: its two objects by name, no listing (COMMIT first: it stops being
        complete)."""
        for name in (layout.COMMIT, layout.STATE):
            try:
                self.store.delete(join_key(ckpt_prefix, name))
            except NotFound:
                pass

    # ------------------------------------------------------------------ loading
    def load_latest(self) -> tuple[CheckpointInfo, dict[str, Any]] | None:
        """The newest checkpoint whose data matches its commit record; older ones if it is damaged.

        An archived newest checkpoint is an error, not a reason to fall back: an older one would redo
        paid work and a fresh start would drop it, so the run waits for ``thrifty archive restore``.
        """
        for info in reversed(self.committed()):
            if info.archived:
                raise layout.archived_error(self.store, self.run_id, info)
            key = join_key(info.prefix, layout.STATE)
            try:
                with _local_copy(self.store, key) as local:
                    digest, size = _sha256_file(local)
                    if (digest, size) != (info.commit.get("sha256"), info.commit.get("bytes")):
                        log.warning("checkpoint at step %d is damaged (hash mismatch); trying an older one", info.step)
                        continue
                    state = torch.load(local, map_location="cpu", weights_only=True)
            except Archived:
                raise layout.archived_error(self.store, self.run_id, info) from None
            except NotFound:
                log.warning("checkpoint at step %d has a commit record but no data; trying an older one", info.step)
                continue
            return info, state
        return None


class _Hashing:
    """A write-only file that hashes and counts what passes through it (what torch.save writes), in chunks: torch's
    many small writes are gathered, so the store sees a few large ones (and a background writer few GIL handoffs)."""

    CHUNK = 1 << 16

    def __init__(self, f: BinaryIO):
        self.f, self.size, self._h = f, 0, hashlib.sha256()
        self._buf = bytearray()

    def write(self, data: bytes) -> int:
        self._buf += data
        if len(self._buf) >= self.CHUNK:
            self._drain()
        return len(data)

    def _drain(self) -> None:
        if self._buf:
            chunk = bytes(self._buf)
            self._buf.clear()
            self._h.update(chunk)
            self.size += len(chunk)
            self.f.write(chunk)
            fault_point("during_data")  # crash tests: a kill in the middle of a checkpoint's data

    def flush(self) -> None:
        self._drain()
        self.f.flush()

    def hexdigest(self) -> str:
        return self._h.hexdigest()


@contextlib.contextmanager
def _local_copy(store: Store, key: str) -> Iterator[Path]:
    """The object as a local file: in place on a file store, else fetched into the spool and removed after."""
    path = store.local_path(key)
    if path is not None:
        if not path.is_file():
            store.get_bytes(key)  # NotFound or Archived, as the object stores say it
        yield path
        return
    tmp = Path(temp_beside(spool_dir() / "state.pt"))
    try:
        store.get_file(key, tmp)
        yield tmp
    finally:
        tmp.unlink(missing_ok=True)


def _sha256_file(path: Path) -> tuple[str, int]:
    h = hashlib.sha256()
    size = 0
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
            size += len(chunk)
    return h.hexdigest(), size
