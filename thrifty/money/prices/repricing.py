"""One instance's price, read again whenever it is older than its max age: what a node's meter and a watcher's open
attempt use, so a price that moves mid-run is metered at the price in force.

A price read now may have changed at any moment since the last read. A rise counts from the last read and a fall
from now (:func:`change_from`): the metered spend errs towards counting more, never less than the bill.
"""

from __future__ import annotations

import logging
from typing import Callable

from thrifty.money.prices.base import PriceKey, PricePoint
from thrifty.money.prices.live import LivePrices

log = logging.getLogger("thrifty.money.prices")


def change_from(old_usd: float, new_usd: float, previous_read_unix: float, now: float) -> float:
    """When a price change seen now is metered from: the last read for a rise, now for a fall."""
    return previous_read_unix if new_usd > old_usd and previous_read_unix > float("-inf") else now


class Repricer:
    """The price of ``key`` now; ``fallback`` (what the launcher priced it at) when no source and no table knows it."""

    def __init__(self, live: LivePrices, key: PriceKey, fallback: PricePoint | None = None,
                 clock: Callable[[], float] | None = None):
        self.live, self.key, self.fallback = live, key, fallback
        self.clock = clock or live.clock
        self.point: PricePoint | None = None
        self.read_unix = float("-inf")  # the latest read
        self.previous_read_unix = float("-inf")  # the one before it: a rise seen now may date from then

    def due(self, now: float | None = None) -> bool:
        now = self.clock() if now is None else now
        return now - self.read_unix >= self.live.max_age_s(self.key.spot)

    def read(self) -> PricePoint | None:
        """Read the price again (never raises: a failure keeps the last price known)."""
        self.previous_read_unix, self.read_unix = self.read_unix, self.clock()
        try:
            self.point = self.live.lookup(self.key, self.point if self.point is not None else self.fallback)
        except Exception as exc:  # noqa: BLE001 - a price source must never stop training or a watch
            log.warning("could not read the price of %s %s (%s); keeping $%s/h", self.key.cloud, self.key.instance, exc,
                        f"{self.point.usd_per_hour:.4f}" if self.point else "?")
        return self.point if self.point is not None else self.fallback
