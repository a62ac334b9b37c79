"""Today's prices: the clouds' own sources behind one narrow protocol, cached in the store with their time and source.

``base`` (PriceKey, PricePoint, the PriceSource protocol), one module per source: ``aws`` (EC2's spot price
history), ``azure`` (the Retail Prices API), ``skypilot`` (SkyPilot's catalog, through its public functions),
``table`` (the shipped table, the last fallback, dated); ``cache`` (the store's copy), ``live`` (the chain: fresh
cache, the sources, the newest known, the table), ``offers`` (instances per accelerator at their freshest price),
``text`` (``thrifty prices``). Nothing is read at import time; cloud SDKs are imported where they are used.
"""

from __future__ import annotations

from thrifty.money.prices.base import (
    ON_DEMAND_MAX_AGE_S, PriceKey, PricePoint, PriceSource, PriceSourceError,
)
from thrifty.money.prices.live import LivePrices, cloud_sources, price_mode
from thrifty.money.prices.offers import (
    accelerator_of, emulated_quote, live_quote, offers, point_quote, price_table, quote_accelerator,
)

__all__ = [
    "ON_DEMAND_MAX_AGE_S", "LivePrices", "PriceKey", "PricePoint", "PriceSource", "PriceSourceError", "accelerator_of",
    "cloud_sources", "emulated_quote", "live_quote", "offers", "point_quote", "price_mode", "price_table",
    "quote_accelerator",
]
