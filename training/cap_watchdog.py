"""The node's last line for the budget cap: a timer thread that ends this process at the cap, whatever it is doing.

The loop checks the cap at every step and stops with a checkpoint while the money left still covers one
(``NodeMeter.over_cap``). A step that never ends cannot check it: a checkpoint save or a store call blocked on a
store that accepts connections and never answers, a data read stuck on a dead mount, a hung collective. This
watchdog needs nothing but the clock and what the meter already knows (no store call, no lock the loop holds):
when what was spent plus what the exit still bills reaches ``budget.max_usd``, it writes the meter's final record
(on this machine at once, to the store if it answers within half a second), and ends the process with ``EXIT_BUDGET``
(which no launcher restarts). The checkpoint kept is the last one committed.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
import threading
from typing import Callable, Iterator

from thrifty.money.budget import TEARDOWN_S
from thrifty.money.meter import NodeMeter
from thrifty.protocol import EXIT_BUDGET

log = logging.getLogger("thrifty.train")

TICK_S = 0.25  # how often the watchdog looks at the clock, at most
FLUSH_S = 0.5  # at the cap, the most the final record may wait for the store before the process ends
SLACK_S = 0.5  # a thread of a starved machine wakes late: the stop is decided this much earlier


class CapWatchdog:
    """Ends the process when the run's spend plus what its exit bills reaches the cap; ``stop()`` when done."""

    def __init__(self, meter: NodeMeter, end: Callable[[int], None] = os._exit, tick_s: float = TICK_S):
        self.meter, self._end, self.tick_s = meter, end, tick_s
        # billed after the decision: the wait for the record, the exit, the nodes' teardown, a tick and a late wake-up
        self.exit_s = FLUSH_S + TEARDOWN_S[meter.cfg.compute.launcher] + tick_s + SLACK_S
        self._stop = threading.Event()
        self.fired = threading.Event()
        self._thread = threading.Thread(target=self._run, name="thrifty-cap-watchdog", daemon=True)

    def start(self) -> "CapWatchdog":
        _ARMED.append(self)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self in _ARMED:
            _ARMED.remove(self)

    def due(self, now: float | None = None) -> bool:
        m = self.meter
        now = m.clock() if now is None else now
        return m.spend_usd(now) + m.burn_usd_per_hour() * self.exit_s / 3600.0 >= m.cfg.budget.max_usd

    def _run(self) -> None:
        while not self._stop.wait(self._sleep_s()):
            if self.due():
                self._fire()
                return

    def _sleep_s(self) -> float:
        """Until the stop is due at the present burn, a tick at most (the burn may change: other jobs of the run)."""
        m = self.meter
        burn = m.burn_usd_per_hour()
        if burn <= 0:
            return self.tick_s
        left_s = (m.cfg.budget.max_usd - m.spend_usd()) / burn * 3600.0 - self.exit_s
        return min(self.tick_s, max(0.0, left_s))

    def _fire(self) -> None:
        self.fired.set()
        m = self.meter
        log.error("budget: run %r reached its $%g cap (spent $%.4f) while the training loop could not stop it (a "
                  "call that does not return: the store?); ending this job now. The last committed checkpoint is "
                  "kept. Run it again with a larger budget.max_usd to continue", m.cfg.run_name, m.cfg.budget.max_usd,
                  m.spend_usd())
        try:
            m.close("budget", wait_s=FLUSH_S)
        finally:
            for stream in (sys.stdout, sys.stderr):
                try:
                    stream.flush()
                except Exception:  # noqa: BLE001 -- the exit must happen whatever the streams do
                    pass
            self._end(EXIT_BUDGET)


_ARMED: list[CapWatchdog] = []


@contextlib.contextmanager
def armed() -> Iterator[None]:
    """Watchdogs started in the block stop when it ends normally (training returned: the process is about to end by
    itself). An exception leaves them armed until the process exits: on its way out it may still wait on the store
    (a checkpoint write's COMMIT at exit), and the cap must hold through that too."""
    yield
    for watchdog in list(_ARMED):
        watchdog.stop()
