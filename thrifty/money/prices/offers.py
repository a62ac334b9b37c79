"""Instances that carry an accelerator, each at its freshest price: what the gate, the ranking and ``thrifty prices``
use. Which instances exist comes from SkyPilot's catalog (when on this machine) or the table; what they cost now
comes from the clouds' own sources through :class:`~thrifty.money.prices.live.LivePrices`.
"""

from __future__ import annotations

import logging
from dataclasses import replace

from thrifty.money.prices.base import PriceKey, PricePoint, PriceSourceError
from thrifty.money.prices.live import LivePrices
from thrifty.money.prices.skypilot import catalog_accelerator, catalog_file, catalog_offers
from thrifty.money.pricing import (
    INSTANCES, InstancePrice, PricingError, Quote, Source, accelerator_of as table_accelerator, check_cloud, find_instance,
    known_accelerators, offline_offers, parse_accelerator, quote_emulated, row_quote,
)

log = logging.getLogger("thrifty.money.prices")
LIVE_PRICED_ROWS = 3  # per accelerator and cloud, the listed-cheapest rows priced live (the rest are dearer anyway)


def offers(cloud: str, accelerator: str, source: Source = "auto") -> tuple[list[InstancePrice], str]:
    """Instances of ``cloud`` with ``accelerator``, cheapest listed first, and the name of the listing used: SkyPilot's
    catalog when its file for ``cloud`` is on this machine (``auto``, ``skypilot``), else the offline table."""
    check_cloud(cloud)
    parse_accelerator(accelerator)
    if source in ("auto", "skypilot"):
        path = catalog_file(cloud)
        if path is not None:
            try:
                return catalog_offers(cloud, accelerator), f"SkyPilot catalog {path}"
            except PriceSourceError as exc:
                if source == "skypilot":
                    raise PricingError(str(exc)) from None
                log.warning("%s; using the offline table", exc)
        elif source == "skypilot":
            raise PricingError(f"SkyPilot's {cloud} catalog is not on this machine; run `sky show-gpus --infra {cloud}` "
                               "once with network access, or use the offline table")
    return offline_offers(cloud, accelerator), "offline table"


def point_quote(row: InstancePrice, spot: bool, point: PricePoint) -> Quote:
    """A quote for ``row`` at ``point``'s price, saying where and when it was read."""
    return Quote(row.cloud, row.instance, spot, point.usd_per_hour, row.on_demand_usd_per_hour, point.describe(),
                 row.accelerator, point.region or "", point.fetched_unix if point.live else 0.0)


def live_quote(row: InstancePrice, spot: bool, live: LivePrices, region: str | None = None) -> Quote:
    """``row`` priced at the freshest price in ``region`` (None: where its listing is cheapest)."""
    listed = row_quote(row, spot)
    where = region or listed.region or None
    try:
        point = live.lookup(PriceKey(row.cloud, row.instance, spot, where, None, row.accelerator))
    except PricingError:
        return listed  # a catalog row the sources and the table do not know: the catalog's own price
    if not point.live and row.source.startswith("SkyPilot catalog"):
        return listed  # the catalog is fresher than the table
    return point_quote(row, spot, point)


def quote_accelerator(cloud: str, accelerator: str, spot: bool, source: Source = "auto",
                      live: LivePrices | None = None, region: str | None = None) -> Quote:
    """The cheapest instance of ``cloud`` carrying ``accelerator`` (NAME:COUNT): with ``live`` (and source auto), the
    listed-cheapest few priced at their freshest price in ``region``; PricingError if none is known."""
    rows, used = offers(cloud, accelerator, source)
    if spot:
        rows = [r for r in rows if r.spot_usd_per_hour is not None]
    if not rows:
        known = ", ".join(sorted({r.accelerator for r in INSTANCES if r.cloud == cloud})) if used == "offline table" \
            else "see `sky show-gpus`"
        raise PricingError(f"no {'spot ' if spot else ''}price for {accelerator} on {cloud} in the {used}. "
                           f"Accelerators known on {cloud}: {known}.")
    listed = sorted(rows, key=lambda r: (r.spot_usd_per_hour if spot else r.on_demand_usd_per_hour))
    if live is None or source != "auto" or not live.live:
        return replace(row_quote(listed[0], spot), region=region or row_quote(listed[0], spot).region)
    return min((live_quote(r, spot, live, region) for r in listed[:LIVE_PRICED_ROWS]), key=lambda q: q.usd_per_hour)


def accelerator_of(cloud: str, instance: str) -> str | None:
    """NAME:COUNT an instance carries: the offline table, then SkyPilot's catalog when on this machine."""
    return table_accelerator(cloud, instance) or catalog_accelerator(cloud, instance)


def emulated_quote(spec: str, spot: bool, live: LivePrices | None = None) -> Quote:
    """What the local launcher meters its emulated instance (``aws:g5.xlarge``) at: the table's row, at its freshest
    price in the table's region when ``live`` reads the clouds' sources (``budget.prices: live``)."""
    q = quote_emulated(spec, spot)
    if live is None or not live.live:
        return q
    return live_quote(find_instance(q.cloud, q.instance), spot, live, q.region)


def price_table(accelerator: str | None = None, clouds: tuple[str, ...] | list[str] = ("aws", "gcp", "azure"),
                source: Source = "auto") -> list[InstancePrice]:
    """Rows for ``thrifty prices``: every known offer (or those with ``accelerator``), per cloud, cheapest first."""
    out: list[InstancePrice] = []
    for cloud in clouds:
        if accelerator is None:
            accs = known_accelerators(cloud)
        elif ":" in accelerator:
            accs = [accelerator]
        else:  # a bare name: every count the offline table knows, plus 1
            accs = sorted({a for a in known_accelerators(cloud) if a.split(":")[0].lower() == accelerator.lower()}
                          | {f"{accelerator}:1"})
        for acc in accs:
            out.extend(offers(cloud, acc, source)[0])
    if accelerator is not None and not out:
        raise PricingError(f"no prices for accelerator {accelerator!r} on {', '.join(clouds)}. "
                           f"Known: {', '.join(known_accelerators())}.")
    return out
