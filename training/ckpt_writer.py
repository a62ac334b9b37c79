"""Asynchronous checkpoints: snapshot on the training thread, write, COMMIT and prune on one background thread.

``snapshot`` copies the state at one instant (tensors to CPU: pinned buffers reused from the last
snapshot when CUDA is in use, clones on CPU so the next optimizer step cannot change what is being
written; containers copied). ``CheckpointWriter.save`` waits for the write in flight (never two),
then hands the snapshot to a worker thread that runs ``CheckpointManager.save`` (one stream, hashed
while written, COMMIT last, pruned from its index) and then ``after_commit`` (the metrics upload).
An error of the worker is raised on the training thread at the next ``save``/``poll``/``wait``. While the store
fails and its write retries (``thrifty.storage.retry``), ``waiting_on_store`` says so: the loop trains on
instead of waiting for it at the next due save.
A kill -9 during a write leaves a step directory without COMMIT: the run resumes from the one before.
"""

from __future__ import annotations

import atexit
import copy
import logging
import queue
import threading
import time
from dataclasses import dataclass, replace
from typing import Any, Callable

import torch

from thrifty.storage.retry import on_retry
from training.checkpoint import CheckpointManager

log = logging.getLogger("thrifty.train")


@dataclass(frozen=True)
class Written:
    """One committed checkpoint, as the ``checkpoint`` metric event reports it."""

    step: int  # the step the state is of
    block_s: float  # seconds the training thread was held: waiting for the previous write, the snapshot (and the
    #                 write itself when not in the background)
    write_s: float  # seconds the write took: torch.save -> store -> COMMIT -> prune -> after_commit
    committed_at_step: int  # optimizer steps done when its COMMIT landed (== step when written in the foreground)
    background: bool

    def event(self) -> dict[str, Any]:
        # save_s: the cost on the step path, what the planner and `thrifty simulate` read
        return {"event": "checkpoint", "step": self.step, "save_s": round(self.block_s, 4),
                "block_s": round(self.block_s, 4), "write_s": round(self.write_s, 4),
                "committed_at_step": self.committed_at_step, "async": self.background}


_ATOMS = (bool, int, float, str, bytes, type(None))  # immutable leaves: shared, not copied


def snapshot(state: Any, pinned: dict[tuple, torch.Tensor] | None = None, _path: tuple = ()) -> Any:
    """A copy of ``state`` that later in-place updates of its tensors cannot reach: CPU tensors cloned, device
    tensors copied into (reused) pinned CPU buffers, dicts/lists/tuples copied, other mutable leaves deep-copied.
    Call ``torch.cuda.synchronize()`` (``CheckpointWriter`` does) before reading device copies."""
    if isinstance(state, torch.Tensor):
        t = state.detach()
        if t.device.type == "cpu":
            return t.clone()
        buf = pinned.get(_path) if pinned is not None else None
        if buf is None or buf.shape != t.shape or buf.dtype != t.dtype:
            buf = torch.empty(t.shape, dtype=t.dtype, device="cpu", pin_memory=torch.cuda.is_available())
            if pinned is not None:
                pinned[_path] = buf
        return buf.copy_(t, non_blocking=True)
    if isinstance(state, dict):
        return {k: snapshot(v, pinned, (*_path, k)) for k, v in state.items()}
    if isinstance(state, list):
        if all(type(v) in _ATOMS for v in state):  # e.g. python's RNG state: 625 ints, one copy
            return list(state)
        return [snapshot(v, pinned, (*_path, i)) for i, v in enumerate(state)]
    if isinstance(state, tuple):
        return type(state)(*(snapshot(v, pinned, (*_path, i)) for i, v in enumerate(state))) \
            if hasattr(state, "_fields") else tuple(snapshot(v, pinned, (*_path, i)) for i, v in enumerate(state))
    if state is None or type(state) in _ATOMS:
        return state
    return copy.deepcopy(state)


class CheckpointWriter:
    """Writes checkpoints through ``manager``, in the background (``background=True``) or on the calling thread."""

    def __init__(self, manager: CheckpointManager, background: bool = True,
                 after_commit: Callable[[], None] | None = None):
        self.manager = manager
        self.background = background
        self.after_commit = after_commit or (lambda: None)
        self._worker: threading.Thread | None = None  # started at the first background save, ended by close()
        self._jobs: queue.SimpleQueue = queue.SimpleQueue()  # a hand-off costs microseconds; a thread start more
        self._done = threading.Event()  # the write in flight finished (or failed)
        self._retrying = threading.Event()  # the write in flight met a store error and is retrying it
        self._busy = False
        self._pending: tuple[int, float] = (0, 0.0)  # the write in flight: its step, the time it held the caller
        self._outcome: tuple[float, int] | BaseException | None = None  # the worker's: (write_s, committed_at_step)
        self._pinned: dict[tuple, torch.Tensor] = {}  # reused: never two snapshots alive at once
        self._step = 0  # the training thread's progress, read by the worker when its COMMIT lands
        self.stop_save_s = 0.0  # the most a save has cost in the foreground (a stop's save): the budget holds it back

    @property
    def in_flight(self) -> bool:
        return self._busy

    @property
    def waiting_on_store(self) -> bool:
        """A background write is in flight and retrying a store error: a save due now would only wait for it."""
        return self._busy and self._retrying.is_set()

    def _store_failed(self, op: str, exc: BaseException) -> None:
        if not self._retrying.is_set():
            self._retrying.set()
            log.warning("checkpoint of step %d: the store failed (%s: %s); the write retries in the background and "
                        "training carries on, saving again once it lands", self._pending[0], op, exc)

    def save(self, state: dict[str, Any], step: int, metric: float | None, wait: bool = False,
             prepare: Callable[[dict[str, Any]], None] | None = None) -> list[Written]:
        """Checkpoint ``state`` as ``step``. Returns the writes finished since the last call (the previous
        background one; this one too when it ran in the foreground or ``wait``: a stop, the final save).
        ``prepare(snapshot)`` runs on the writer before the data is written (e.g. a hash of the weights)."""
        t0 = time.perf_counter()
        self._step = step
        done = self.wait()
        snap = snapshot(state, self._pinned if torch.cuda.is_available() else None)
        if torch.cuda.is_available():
            torch.cuda.synchronize()  # the pinned copies are complete before another thread reads them
        if not self.background:
            t_write = time.perf_counter()
            self._write(snap, step, metric, prepare)
            self.stop_save_s = max(self.stop_save_s, time.perf_counter() - t0)
            return [*done, Written(step, time.perf_counter() - t0, time.perf_counter() - t_write, step, False)]
        if self._worker is None:
            self._worker = threading.Thread(target=self._serve, name="thrifty-ckpt-writer", daemon=True)
            self._worker.start()
            atexit.register(self._drain)  # an interpreter exit (an exception, sys.exit) waits for the COMMIT
        self._done.clear()
        self._retrying.clear()
        self._busy = True
        self._pending = (step, time.perf_counter() - t0)
        self._jobs.put((snap, step, metric, prepare))
        if not wait:
            return done
        return [*done, *(replace(w, block_s=time.perf_counter() - t0) for w in self.wait())]  # held for all of it

    def poll(self, step: int) -> list[Written]:
        """Tell the writer the training thread finished ``step``; returns the write that finished, if one did."""
        self._step = step
        return self.wait() if self._busy and self._done.is_set() else []

    def wait(self) -> list[Written]:
        """Wait for the write in flight; returns it once finished, raises its error on this thread."""
        if not self._busy:
            return []
        self._done.wait()
        self._busy = False
        outcome, self._outcome = self._outcome, None
        if isinstance(outcome, BaseException):
            raise outcome
        (step, block_s), (write_s, committed_at_step) = self._pending, outcome
        self.stop_save_s = max(self.stop_save_s, block_s + write_s)
        return [Written(step, block_s, write_s, committed_at_step, True)]

    def close(self) -> list[Written]:
        """Wait for the write in flight (returned as ``wait`` does) and end the worker thread."""
        try:
            return self.wait()
        finally:
            if self._worker is not None:
                self._jobs.put(None)
                self._worker.join()
                self._worker = None
                atexit.unregister(self._drain)

    def _drain(self) -> None:
        if self._busy:
            self._done.wait()

    def _serve(self) -> None:
        while (job := self._jobs.get()) is not None:
            self._work(*job)
            self._done.set()

    def _work(self, snap: dict[str, Any], step: int, metric: float | None,
              prepare: Callable[[dict[str, Any]], None] | None) -> None:
        committed_at: list[int] = []
        try:
            t0 = time.perf_counter()
            with on_retry(self._store_failed):
                self._write(snap, step, metric, prepare, on_commit=lambda: committed_at.append(self._step))
            self._outcome = (time.perf_counter() - t0, committed_at[0])
        except BaseException as exc:  # noqa: BLE001 -- handed to the training thread, never swallowed
            self._outcome = exc

    def _write(self, snap: dict[str, Any], step: int, metric: float | None,
               prepare: Callable[[dict[str, Any]], None] | None, on_commit: Callable[[], None] | None = None) -> None:
        if prepare is not None:
            prepare(snap)
        self.manager.save(snap, step, metric, on_commit=on_commit)
        self.after_commit()
