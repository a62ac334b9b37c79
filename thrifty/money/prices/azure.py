"""Azure VM prices from Azure's public Retail Prices API (no account needed): pay-as-you-go and spot, per region.

``GET {url}?api-version=2023-01-01-preview&$filter=...`` answers ``{"Items": [...], "NextPageLink": ...}``; each
item names its VM (``armSkuName``), region (``armRegionName``), meter (``meterName``: "... Spot", "... Low
Priority" or the pay-as-you-go one), product ("... Windows" for Windows VMs) and ``retailPrice`` per
``unitOfMeasure`` "1 Hour". ``$THRIFTY_AZURE_PRICES_URL`` points it at a stand-in.
"""

from __future__ import annotations

import json
import os
import re
import urllib.error
import urllib.parse
import urllib.request

from thrifty.money.prices.base import HTTP_TIMEOUT_S, PriceKey, PricePoint, PriceSourceError

AZURE_PRICES_URL = "https://prices.azure.com/api/retail/prices"
ENV_AZURE_PRICES_URL = "THRIFTY_AZURE_PRICES_URL"
API_VERSION = "2023-01-01-preview"
MAX_PAGES = 10
_SAFE = re.compile(r"[A-Za-z0-9_.\-]+")  # what a VM size or region name is made of (goes into the OData filter)


def _market(item: dict) -> str | None:
    """spot | on-demand for a Linux VM meter billed by the hour in USD; None for anything else."""
    meter = str(item.get("meterName") or item.get("skuName") or "")
    if str(item.get("productName", "")).endswith("Windows") or item.get("currencyCode", "USD") != "USD":
        return None
    if item.get("type", "Consumption") != "Consumption" or item.get("unitOfMeasure", "1 Hour") != "1 Hour":
        return None
    if meter.endswith("Low Priority"):
        return None
    return "spot" if meter.endswith("Spot") else "on-demand"


class AzureRetailPrices:
    """$/hour of an Azure VM size in a region, spot or pay-as-you-go."""

    name = "azure-retail-prices"

    def __init__(self, url: str | None = None):
        self.endpoint = url or os.environ.get(ENV_AZURE_PRICES_URL) or AZURE_PRICES_URL

    def _get(self, url: str) -> dict:
        try:
            with urllib.request.urlopen(urllib.request.Request(url, headers={"Accept": "application/json"}),
                                        timeout=HTTP_TIMEOUT_S) as reply:
                return json.loads(reply.read().decode())
        except (urllib.error.URLError, OSError, ValueError) as exc:
            raise PriceSourceError(f"Azure Retail Prices API at {self.endpoint}: {exc}") from None

    def lookup(self, key: PriceKey, now: float) -> PricePoint | None:
        if key.cloud != "azure" or not key.region or not all(_SAFE.fullmatch(v) for v in (key.host, key.region)):
            return None
        query = (f"serviceName eq 'Virtual Machines' and armSkuName eq '{key.host}' and "
                 f"armRegionName eq '{key.region}' and priceType eq 'Consumption'")
        url = f"{self.endpoint}?{urllib.parse.urlencode({'api-version': API_VERSION, '$filter': query})}"
        base = urllib.parse.urlsplit(self.endpoint)
        items: list[dict] = []
        for _ in range(MAX_PAGES):
            page = self._get(url)
            items.extend(page.get("Items") or [])
            url = page.get("NextPageLink") or ""
            nxt = urllib.parse.urlsplit(url)
            if not url or (nxt.scheme, nxt.netloc) != (base.scheme, base.netloc):  # never follow a link elsewhere
                break
        mine = [i for i in items if str(i.get("armSkuName", "")).lower() == key.host.lower()
                and i.get("armRegionName") == key.region and _market(i) == key.market
                and isinstance(i.get("retailPrice"), (int, float)) and i["retailPrice"] > 0]
        if not mine:
            return None
        newest = max(str(i.get("effectiveStartDate", "")) for i in mine)
        current = [i for i in mine if str(i.get("effectiveStartDate", "")) == newest]
        pick = max(current, key=lambda i: float(i["retailPrice"]))  # two meters at once: the dearer counts
        return PricePoint(float(pick["retailPrice"]),
                          f"Azure Retail Prices API ({key.region}, meter {pick.get('meterName', '?')!r})", now,
                          key.region, key.zone, as_of=newest)
