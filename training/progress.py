"""What the loop writes as it goes: metric lines for the attempt, and when to checkpoint next.

``MetricsWriter``: JSON lines under ``runs/<id>/metrics/`` (one file per attempt). ``CheckpointSchedule``:
every ``train.checkpoint_every`` steps (on its multiples, across resumes), or Young/Daly from the measured
save time and the mean time between preemptions.
"""

from __future__ import annotations

import json
import math
import os
import time
from pathlib import Path
from typing import Any, Callable

from thrifty.runs import run_key
from thrifty.storage import Store
from thrifty.storage.atomic import temp_beside
from thrifty.storage.retry import disk_errors_named
from thrifty.storage.spool import spool_dir
from thrifty.spot.daly import daly_interval_s


class MetricsWriter:
    """JSON lines for this process's attempt under ``runs/<id>/metrics/``; one file per attempt, no appends to objects."""

    FLUSH_S = 0.1  # step lines reach the file at most this late

    def __init__(self, store: Store, run_id: str, clock: Callable[[], float] = time.time):
        self._clock = clock
        stamp = time.strftime("%Y%m%dT%H%M%S", time.gmtime())
        self.store = store
        self.key = run_key(run_id, "metrics", f"{stamp}-{os.getpid()}.jsonl")
        direct = store.local_path(self.key)
        self.upload = direct is None
        if direct is None:  # object store: write in the spool, upload at each checkpoint and at the end
            direct = Path(temp_beside(spool_dir() / "metrics.jsonl"))
        self.path = direct
        self._disk = (store.uri, "write", self.key, "this machine's disk" if self.upload else "the store's disk")
        with disk_errors_named(*self._disk):  # a full or read-only disk named as such, not a raw OSError
            direct.parent.mkdir(parents=True, exist_ok=True)
            self._f = open(direct, "a")
        self._flush_at = 0.0

    def write(self, record: dict[str, Any]) -> None:
        """One line. An event line (start, eval, checkpoint, end...) is on disk at once; step lines within
        ``FLUSH_S`` (a flush per line costs a system call: at a few milliseconds a step, more than the step's own
        bookkeeping). A kill loses at most that much of the step lines, never an event's."""
        now = self._clock()
        line = json.dumps({"time_unix": round(now, 3), **record}) + "\n"
        try:  # (not a context manager: a metric line is on the step path, every log_every steps)
            self._f.write(line)
            if now >= self._flush_at or "event" in record:
                self._f.flush()
                self._flush_at = now + self.FLUSH_S
        except OSError:
            with disk_errors_named(*self._disk):  # a full or read-only disk named as such, not a raw OSError
                raise

    def sync(self) -> None:
        self._f.flush()
        if self.upload:
            self.put()

    def put(self) -> None:
        """Upload the lines flushed so far (safe from another thread: the file holds whole lines but for one the
        training thread may be flushing, which comes out cut, and readers skip it)."""
        self.store.put_file(self.key, self.path)

    def close(self) -> None:
        self.sync()
        self._f.close()
        if self.upload:  # the spooled copy is in the store now
            self.path.unlink(missing_ok=True)


class CheckpointSchedule:
    """Fixed every N steps, or Young/Daly from the measured save time and the mean time between preemptions."""

    PROBE_STEPS = 10  # auto: first save after this many steps, to measure the save cost

    def __init__(self, every: int | str, mtbp_s: float, start_step: int, mtbp_source: str = "config"):
        self.auto = every == "auto"
        self.mtbp_s, self.mtbp_source = mtbp_s, mtbp_source  # source: ledger | shipped | config (thrifty.spot.preemption)
        self.interval = self.PROBE_STEPS if self.auto else int(every)
        self.last_saved = start_step
        self.save_s: float | None = None

    def due(self, step: int) -> bool:
        """A fixed interval saves on its multiples, whatever step a resume or a stop's save started from; auto an
        interval after the last save (its interval moves)."""
        if self.auto:
            return step - self.last_saved >= self.interval
        return step // self.interval > self.last_saved // self.interval

    def follow(self, step: int, interval: int) -> None:
        self.last_saved, self.interval = step, interval

    def saved(self, step: int, save_s: float, step_time_s: float, write_s: float = 0.0) -> dict[str, Any] | None:
        """Record a save (``save_s`` on the step path; ``write_s`` the write, in the background when async); for auto,
        re-plan and return the new plan when it changed by > 20%. An interval is never shorter than a write: a save
        due while one is in flight would wait for it."""
        self.last_saved = max(self.last_saved, step)
        self.save_s = save_s if self.save_s is None else 0.7 * self.save_s + 0.3 * save_s
        if not self.auto:
            return None
        tau_s = max(daly_interval_s(self.save_s, self.mtbp_s), write_s)
        step_s = max(step_time_s, 1e-9)
        steps = max(1, round(tau_s / step_s), math.ceil(write_s / step_s))
        if abs(steps - self.interval) <= 0.2 * self.interval:
            return None
        self.interval = steps
        return {"event": "checkpoint_interval", "steps": steps, "seconds": round(tau_s, 2),
                "save_s": round(self.save_s, 4), "mtbp_s": round(self.mtbp_s, 1),
                "mtbp_source": self.mtbp_source, "step_time_s": round(step_time_s, 5)}
