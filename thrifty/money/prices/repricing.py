"""One instance's price, read again whenever it is older than its max age: what a node's meter and a watcher's open
attempt use, so a price that moves mid-run is metered at the price in force.

A price read now may have changed at any moment since the old price was last seen at its source. A rise counts from
then and a fall from now (:func:`change_from`): the metered spend errs towards counting more, never less than the bill.
"Seen at its source" is the moment the source was asked (:attr:`PricePoint.fetched_unix`), not the moment this process
read it: a read may be answered from the store's price cache, filled a little earlier by another reader.
"""

from __future__ import annotations

import logging
from typing import Callable

from thrifty.money.prices.base import PriceKey, PricePoint
from thrifty.money.prices.live import LivePrices

log = logging.getLogger("thrifty.money.prices")


def change_from(old_usd: float, new_usd: float, old_seen_unix: float, now: float) -> float:
    """When a price change seen now is metered from: when the old price was last seen for a rise, now for a fall."""
    return min(old_seen_unix, now) if new_usd > old_usd and old_seen_unix > float("-inf") else now


def seen_unix(fetched_unix: float, read_unix: float) -> float:
    """When a price read at ``read_unix`` was last known to be in force: when its source was asked (``fetched_unix``:
    a cached live price may be older than the read), else (0: a table's or a catalog's price, which holds until a read
    says otherwise) when it was read."""
    return min(fetched_unix, read_unix) if fetched_unix > 0 else read_unix


def point_seen_unix(point: PricePoint, read_unix: float) -> float:
    return seen_unix(point.fetched_unix if point.live else 0.0, read_unix)


class Repricer:
    """The price of ``key`` now; ``fallback`` (what the launcher priced it at) when no source and no table knows it."""

    def __init__(self, live: LivePrices, key: PriceKey, fallback: PricePoint | None = None,
                 clock: Callable[[], float] | None = None):
        self.live, self.key, self.fallback = live, key, fallback
        self.clock = clock or live.clock
        self.point: PricePoint | None = None
        self.read_unix = float("-inf")  # the latest read
        self.previous_seen_unix = float("-inf")  # when the price before this read was last seen: a rise dates from it

    def due(self, now: float | None = None) -> bool:
        now = self.clock() if now is None else now
        return now - self.read_unix >= self.live.max_age_s(self.key.spot)

    def read(self) -> PricePoint | None:
        """Read the price again (never raises: a failure keeps the last price known)."""
        held = self.point if self.point is not None else self.fallback
        if self.read_unix > float("-inf"):
            self.previous_seen_unix = point_seen_unix(held, self.read_unix) if held is not None else self.read_unix
        self.read_unix = self.clock()
        try:
            self.point = self.live.lookup(self.key, held)
        except Exception as exc:  # noqa: BLE001 - a price source must never stop training or a watch
            log.warning("could not read the price of %s %s (%s); keeping $%s/h", self.key.cloud, self.key.instance, exc,
                        f"{self.point.usd_per_hour:.4f}" if self.point else "?")
        return self.point if self.point is not None else self.fallback
