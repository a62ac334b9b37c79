"""Fault points for crash tests: ``THRIFTY_FAULT=<point>:<n>`` SIGKILLs this process the n-th time it passes ``point``
(``<point>:<n>:stop`` SIGSTOPs it instead: a test then looks at a live process frozen at that point);
``THRIFTY_MIN_STEP_S=<s>`` makes every optimizer step take at least that long (a fixed emulated speed).

Points: ``step`` (after an optimizer step), ``during_data`` (a write call inside a checkpoint's data),
``after_data`` (checkpoint data written, commit not yet), ``after_commit``, ``archive_move`` (an
object moved to the cold tier). The checkpoint points fire on the background writer thread
(``training.ckpt_writer``): SIGKILL ends the whole process from any thread. Unset in normal runs,
where a fault point is one dictionary lookup.
"""

from __future__ import annotations

import os
import signal
import time


def fault_point(point: str) -> None:
    spec = os.environ.get("THRIFTY_FAULT")
    if not spec or not spec.startswith(point + ":"):
        return
    counter = f"_THRIFTY_FAULT_HITS_{point}"
    hits = int(os.environ.get(counter, "0")) + 1
    os.environ[counter] = str(hits)
    n, _, action = spec.split(":", 1)[1].partition(":")
    if hits == int(n):
        os.kill(os.getpid(), signal.SIGSTOP if action == "stop" else signal.SIGKILL)


def armed(point: str) -> bool:
    """Whether ``THRIFTY_FAULT`` names ``point``: a hot loop asks once per run and passes the point only then."""
    return os.environ.get("THRIFTY_FAULT", "").startswith(point + ":")


def min_step_s() -> float | None:
    """``THRIFTY_MIN_STEP_S`` (None when unset): a hot loop reads it once per run and paces only then."""
    spec = os.environ.get("THRIFTY_MIN_STEP_S")
    return float(spec) if spec else None


def pace(step_started: float, min_s: float | None = None) -> None:
    """Hold an optimizer step that began at ``step_started`` (``time.perf_counter()``) until ``min_s`` (by default
    ``THRIFTY_MIN_STEP_S``) has passed: tests that place events in wall time (a spot trace, a deadline) train at a
    known speed whatever the machine. Unset in normal runs (one dictionary lookup)."""
    min_s = min_step_s() if min_s is None else min_s
    if min_s:
        left = min_s - (time.perf_counter() - step_started)
        if left > 0:
            time.sleep(left)
