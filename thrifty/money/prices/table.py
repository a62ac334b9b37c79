"""The shipped table as the last price source: every price it gives says the table's date ("check it")."""

from __future__ import annotations

from thrifty.money.prices.base import PriceKey, PricePoint
from thrifty.money.pricing import PricingError, find_instance, table_note


class OfflineTable:
    """The offline table's row for the instance (one region per cloud: its price wherever the node is)."""

    name = "offline-table"
    endpoint = "thrifty.money.pricing"

    def lookup(self, key: PriceKey, now: float) -> PricePoint | None:
        try:
            row = find_instance(key.cloud, key.instance)
        except PricingError:
            return None
        price = row.spot_usd_per_hour if key.spot else row.on_demand_usd_per_hour
        if price is None:
            return None
        elsewhere = f"; its {row.region} price, the table has no other region" if key.region and \
            key.region != row.region else ""
        return PricePoint(float(price), table_note(row, row.region) + elsewhere, now, row.region, None, row.as_of,
                          live=False)
