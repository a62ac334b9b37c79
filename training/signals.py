"""Stop signals from the very first instant: a SIGTERM (a spot notice) during start-up is remembered, not fatal.

``python -m training`` installs this before importing torch (a second or two), so a notice that
lands while the program starts still ends it cleanly at the first safe point with exit 0, and
nothing is lost. ``training.runtime.StopSignal`` takes over once the loop starts.
"""

from __future__ import annotations

import signal
from typing import Any

EARLY: list[int] = []  # signals received before the loop installed its own handler


def _remember(signum: int, _frame: Any) -> None:
    EARLY.append(signum)


def install_early() -> None:
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, _remember)


def ignore_from_now_on() -> None:
    """The work is saved: a SIGTERM during interpreter shutdown changes nothing, so it must not end the process with
    -15 (Python restores default handlers, not ignored ones, when it shuts down)."""
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, signal.SIG_IGN)
