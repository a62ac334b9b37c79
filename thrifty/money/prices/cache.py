"""Prices read from the clouds, kept in the store with their time and source: ``prices/<cloud>/<market>/<instance>/
<region>/<zone>.json``. The launcher, its watch loop and the nodes share it, so a price read by one is fresh for all
(a GCP node, which has no catalog of its own, meters at what its watcher last read)."""

from __future__ import annotations

import json
import logging
import re

from thrifty.money.prices.base import PriceKey, PricePoint
from thrifty.storage import NotFound, Store

log = logging.getLogger("thrifty.money.prices")
PREFIX = "prices"


def _part(value: str) -> str:
    return re.sub(r"[^A-Za-z0-9._+-]", "_", value)


def cache_key(key: PriceKey) -> str:
    instance = key.instance + (f"@{key.accelerator}" if key.cloud == "gcp" and key.accelerator else "")
    parts = (key.cloud, key.market, instance, key.region or "any-region", key.zone or "any-zone")
    return "/".join((PREFIX, *map(_part, parts))) + ".json"


def read_cached(store: Store | None, key: PriceKey) -> PricePoint | None:
    """The last live price read for ``key``, whatever its age; None when there is none (or the store is unreadable)."""
    if store is None:
        return None
    try:
        raw = json.loads(store.get_bytes(cache_key(key)))
        return PricePoint(float(raw["usd_per_hour"]), str(raw["source"]), float(raw["fetched_unix"]),
                          raw.get("region"), raw.get("zone"), str(raw.get("as_of", "")), True, True)
    except NotFound:
        return None
    except Exception as exc:  # a torn or foreign file, a store hiccup: read the source again
        log.debug("price cache %s unreadable (%s)", cache_key(key), exc)
        return None


def write_cached(store: Store | None, key: PriceKey, point: PricePoint) -> None:
    if store is None or not point.live:
        return
    record = {"usd_per_hour": point.usd_per_hour, "source": point.source, "fetched_unix": point.fetched_unix,
              "region": point.region, "zone": point.zone, "as_of": point.as_of}
    try:
        store.put_bytes(cache_key(key), json.dumps(record).encode())
    except Exception as exc:  # the price stands; only its sharing is lost
        log.warning("could not cache the price of %s %s in the store (%s)", key.cloud, key.instance, exc)
