"""The local launcher's emulated spot market: capacity follows ``compute.spot_trace`` from the run's first job.

A spot job is preempted (a notice, then the grace period) when the trace turns unavailable and waits, unbilled and
RECOVERING as a SkyPilot managed job would, until it is back. An on-demand job (``use_spot: false``, e.g. the
deadline policy's move) never looks at it.
"""

from __future__ import annotations

import threading
import time

from thrifty.config import ConfigError, RunConfig
from thrifty.spot.traces import AvailabilityTrace, load_trace, parse_trace

WAIT_POLL_S = 0.1


def spot_trace(cfg: RunConfig) -> AvailabilityTrace | None:
    """The trace ``compute.spot_trace`` gives (a file or inline), for a job of ``num_nodes``; ConfigError naming the
    setting when it cannot be read."""
    c = cfg.compute
    if c.spot_trace is None:
        return None
    if isinstance(c.spot_trace, str):
        return load_trace(c.spot_trace, c.num_nodes, setting="'compute.spot_trace':")
    try:
        return parse_trace(c.spot_trace.model_dump(mode="json"), c.num_nodes, "compute.spot_trace")
    except ValueError as exc:
        raise ConfigError(f"'compute.spot_trace': {exc}") from None


class SpotMarket:
    """Spot capacity now, by the trace, counted from ``origin_unix`` (the run's first job on this launcher)."""

    def __init__(self, trace: AvailabilityTrace, origin_unix: float):
        self.trace, self.origin_unix = trace, origin_unix

    def available(self, now: float | None = None) -> bool:
        return self.trace.at((time.time() if now is None else now) - self.origin_unix)

    def wait(self, stop: threading.Event) -> bool:
        """Block until spot capacity is back (True) or ``stop`` is set (False)."""
        while not self.available():
            if stop.wait(WAIT_POLL_S):
                return False
        return True
