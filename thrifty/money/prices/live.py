"""The freshest price of an instance: the store's cache while fresh, else the clouds' own sources, else the newest
price known (a stale cache, the launcher's), else the shipped table, which says its age.

``budget.prices`` picks the sources (``price_mode``); ``budget.spot_price_max_age_s`` says when a spot price is read
again (on-demand prices: daily). A source that fails is not asked again for a while by the same chain, so a
machine without credentials or network pays for one failed request, not one per candidate.
"""

from __future__ import annotations

import logging
import time
from typing import Callable, Literal, Sequence

from thrifty.config import RunConfig
from thrifty.money.prices.base import ON_DEMAND_MAX_AGE_S, PriceKey, PricePoint, PriceSource, PriceSourceError
from thrifty.money.prices.cache import read_cached, write_cached
from thrifty.money.prices.table import OfflineTable
from thrifty.money.pricing import PricingError
from thrifty.storage import Store

log = logging.getLogger("thrifty.money.prices")
SOURCE_DOWN_S = 300.0  # a source that failed is skipped this long by the chain that saw it fail

Mode = Literal["live", "table"]


def price_mode(cfg: RunConfig) -> Mode:
    """``budget.prices`` resolved: auto is live on a cloud and the table for the local launcher's emulated instance."""
    mode = cfg.budget.prices
    if mode == "auto":
        return "table" if cfg.compute.launcher == "local" else "live"
    return mode


def cloud_sources() -> list[PriceSource]:
    """The clouds' own sources, in the order they are asked (each answers only for what it prices)."""
    from thrifty.money.prices.aws import Ec2SpotPrices
    from thrifty.money.prices.azure import AzureRetailPrices
    from thrifty.money.prices.skypilot import SkyCatalogPrices

    return [Ec2SpotPrices(), AzureRetailPrices(), SkyCatalogPrices()]


class LivePrices:
    """Looks prices up for one caller (a gate, a watch loop, a node's meter), sharing what it reads in the store."""

    def __init__(self, store: Store | None, spot_max_age_s: float = 3600.0,
                 sources: Sequence[PriceSource] | None = None, clock: Callable[[], float] = time.time,
                 mode: Mode = "live"):
        self.store, self.spot_max_age_s, self.clock, self.mode = store, spot_max_age_s, clock, mode
        self.sources: list[PriceSource] = [] if mode == "table" else list(
            cloud_sources() if sources is None else sources)
        self.table = OfflineTable()
        self._down: dict[tuple[str, str], float] = {}  # (source, endpoint) -> until when it is skipped
        self.failures: list[str] = []  # why sources could not answer, for the caller's log

    @classmethod
    def for_config(cls, cfg: RunConfig, store: Store | None = None, sources: Sequence[PriceSource] | None = None,
                   clock: Callable[[], float] = time.time) -> "LivePrices":
        return cls(store, cfg.budget.spot_price_max_age_s, sources, clock, price_mode(cfg))

    @property
    def live(self) -> bool:
        return self.mode == "live"

    def max_age_s(self, spot: bool) -> float:
        return self.spot_max_age_s if spot else max(self.spot_max_age_s, ON_DEMAND_MAX_AGE_S)

    def fresh(self, point: PricePoint | None, spot: bool, now: float | None = None) -> bool:
        return point is not None and point.live and point.age_s(self.clock() if now is None else now) <= \
            self.max_age_s(spot)

    def read_sources(self, key: PriceKey) -> PricePoint | None:
        """Ask the clouds' sources in turn, now; the first answer is cached in the store and returned."""
        now = self.clock()
        for source in self.sources:
            down = (source.name, source.endpoint)
            if self._down.get(down, float("-inf")) > now:
                continue
            try:
                point = source.lookup(key, now)
            except PriceSourceError as exc:
                self._down[down] = now + SOURCE_DOWN_S
                self.failures.append(f"{source.name}: {exc}")
                log.info("price source %s could not answer for %s %s (%s); trying the next", source.name, key.cloud,
                         key.instance, exc)
                continue
            if point is not None:
                write_cached(self.store, key, point)
                return point
        return None

    def lookup(self, key: PriceKey, fallback: PricePoint | None = None) -> PricePoint:
        """The freshest price of ``key``: see the module docstring. ``fallback`` is what the caller already knows (the
        launcher's price handed to a node); PricingError when nothing at all prices it."""
        if not self.live:
            point = self.table.lookup(key, self.clock())
            if point is None and fallback is not None:
                return fallback
            if point is None:
                raise PricingError(f"no price for {key.cloud}:{key.instance} ({key.market}) in the offline table")
            return point
        cached = read_cached(self.store, key)
        if self.fresh(cached, key.spot):
            return cached  # type: ignore[return-value]
        point = self.read_sources(key)
        if point is not None:
            return point
        known = [p for p in (cached, fallback) if p is not None and p.live]
        if known:  # nothing could be read now: the newest live price, saying how old it is
            return max(known, key=lambda p: p.fetched_unix)
        if fallback is not None:  # what the caller was given (a catalog's price, or the table's, dated)
            return fallback
        point = self.table.lookup(key, self.clock())
        if point is not None:
            return point
        raise PricingError(f"no price for {key.cloud}:{key.instance} ({key.market}) from any source "
                           f"({'; '.join(self.failures) or 'none knows it'}) nor in the offline table")
