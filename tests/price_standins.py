"""Price sources' wire-protocol stand-ins on loopback, one per use: the Azure Retail Prices API's JSON (``Items``,
``NextPageLink``) from a local HTTP server whose prices a test sets and changes, SkyPilot's catalog files in the
test HOME (read through SkyPilot's public functions), and EC2's DescribeSpotPriceHistory from moto's server (the
session's ThreadedMotoServer, see stores.py). tests/conftest.py registers the fixtures.
"""

from __future__ import annotations

import csv
import json
import threading
import time
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

# SkyPilot's catalog schema (v8 vms.csv); one content for the whole session: SkyPilot keeps a catalog it has read
CATALOG_HEADER = ["InstanceType", "AcceleratorName", "AcceleratorCount", "vCPUs", "MemoryGiB", "GpuInfo", "Price",
                  "SpotPrice", "Region", "AvailabilityZone"]
AWS_CATALOG = [
    ["g5.xlarge", "A10G", "1.0", "4.0", "16.0", "{}", "1.006", "0.41", "us-east-1", "use1-az1"],
    ["g5.xlarge", "A10G", "1.0", "4.0", "16.0", "{}", "1.1", "0.29", "us-west-2", "usw2-az1"],
    ["g5.2xlarge", "A10G", "1.0", "8.0", "32.0", "{}", "1.212", "0.50", "us-east-1", "use1-az1"],
    ["m6i.large", "", "", "2.0", "8.0", "", "0.096", "0.04", "us-east-1", "use1-az1"],
]
GCP_CATALOG = [
    # GPUs are rows without an instance type; the host VM is priced on its own row
    ["", "L4", "1", "", "", "{}", "0.56", "0.22", "us-central1", "us-central1-a"],
    ["g2-standard-4", "", "", "4", "16", "", "0.147", "0.06", "us-central1", "us-central1-a"],
    ["g2-standard-8", "", "", "8", "32", "", "0.3", "0.12", "us-central1", "us-central1-a"],
    ["", "T4", "1", "", "", "{}", "0.35", "0.14", "us-central1", "us-central1-a"],
    ["n1-standard-2", "", "", "2", "7.5", "", "0.095", "0.02", "us-central1", "us-central1-a"],
    ["n1-highmem-4", "", "", "4", "26", "", "0.24", "0.05", "us-central1", "us-central1-a"],
    ["n1-standard-4", "", "", "4", "15", "", "0.19", "0.04", "us-central1", "us-central1-a"],
]


@pytest.fixture
def sky_catalog():
    """SkyPilot-format vms.csv files where SkyPilot keeps them (under the test HOME); removed after."""
    from sky.catalog import common

    written = []
    for cloud, rows in (("aws", AWS_CATALOG), ("gcp", GCP_CATALOG)):
        path = Path(common.get_catalog_path(f"{cloud}/vms.csv"))
        assert str(path).startswith(str(Path.home())), "the catalog must live under the test HOME"
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(path, "w", newline="") as f:
            csv.writer(f).writerows([CATALOG_HEADER, *rows])
        written.append(path)
    yield written
    for path in written:
        path.unlink()


class AzurePrices:
    """A loopback Azure Retail Prices API: ``set(sku, region, spot=..., usd=...)`` publishes a price (a new one
    replaces the old from now, as a new effectiveStartDate would); every change is kept with its time, so a test can
    price any interval at the price in force then. Answers one item per page, so readers must follow NextPageLink."""

    def __init__(self) -> None:
        self.prices: dict[tuple[str, str, bool], float] = {}
        self.history: list[tuple[float, str, str, bool, float]] = []  # (since, sku, region, spot, usd)
        self.requests: list[str] = []
        self.lock = threading.Lock()
        standin = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args) -> None:  # quiet
                pass

            def do_GET(self) -> None:
                query = urllib.parse.parse_qs(urllib.parse.urlsplit(self.path).query)
                standin.requests.append(self.path)
                page = int(query.get("$skip", ["0"])[0])
                items = standin.items(query.get("$filter", [""])[0])
                body = {"BillingCurrency": "USD", "CustomerEntityId": "Default", "CustomerEntityType": "Retail",
                        "Items": items[page:page + 1], "Count": len(items[page:page + 1]), "NextPageLink": None}
                if page + 1 < len(items):
                    rest = dict(query, **{"$skip": [str(page + 1)]})
                    body["NextPageLink"] = f"{standin.url}?{urllib.parse.urlencode(rest, doseq=True)}"
                data = json.dumps(body).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/api/retail/prices"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def set(self, sku: str, region: str, spot: bool, usd: float) -> float:
        with self.lock:
            now = time.time()
            self.prices[sku, region, spot] = usd
            self.history.append((now, sku, region, spot, usd))
            return now

    def items(self, odata: str) -> list[dict]:
        """Every meter of what the filter names: Linux pay-as-you-go and spot, plus the Windows and low-priority
        meters a reader must skip."""
        wanted = dict(part.split(" eq ") for part in odata.split(" and ") if " eq " in part)
        sku, region = wanted.get("armSkuName", "").strip("'"), wanted.get("armRegionName", "").strip("'")
        out = []
        with self.lock:
            for (s, r, spot), usd in sorted(self.prices.items()):
                if (s, r) != (sku, region):
                    continue
                size = s.removeprefix("Standard_").replace("_", " ")
                meter = f"{size} Spot" if spot else size
                common = {"currencyCode": "USD", "tierMinimumUnits": 0.0, "armRegionName": r, "location": "US East",
                          "effectiveStartDate": "2026-01-01T00:00:00Z", "meterId": "m", "productId": "p",
                          "skuId": "p/1", "serviceName": "Virtual Machines", "serviceFamily": "Compute",
                          "unitOfMeasure": "1 Hour", "type": "Consumption", "isPrimaryMeterRegion": True,
                          "armSkuName": s, "skuName": meter}
                product = f"Virtual Machines {size.split(' ')[0]} Series"
                out.append({**common, "retailPrice": usd, "unitPrice": usd, "meterName": meter, "productName": product})
                out.append({**common, "retailPrice": usd * 2.5, "unitPrice": usd * 2.5, "meterName": meter,
                            "productName": product + " Windows"})
                if spot:
                    out.append({**common, "retailPrice": usd / 3, "unitPrice": usd / 3,
                                "meterName": f"{size} Low Priority", "productName": product})
        return out

    def in_force(self, sku: str, region: str, spot: bool) -> list[tuple[float, float]]:
        """[(since, usd)] of that price, oldest first."""
        return [(t, usd) for t, s, r, sp, usd in self.history if (s, r, sp) == (sku, region, spot)]

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def azure_prices(monkeypatch):
    """A fresh loopback Azure Retail Prices API, and THRIFTY_AZURE_PRICES_URL pointing at it (children inherit it)."""
    standin = AzurePrices()
    monkeypatch.setenv("THRIFTY_AZURE_PRICES_URL", standin.url)
    try:
        yield standin
    finally:
        standin.close()


class Ec2SpotPrices:
    """EC2's spot price history as moto's server answers it, with the prices a test sets per zone.

    STAND-IN PATCH (moto): moto answers DescribeSpotPriceHistory with one constant price ("0.00001") and a 2006
    timestamp for every zone that offers the type; EC2 answers each zone's history, each entry with the time its
    price took effect. The patch keeps moto's zones and request handling and serves, per zone, the entries ``set``
    recorded (every one, newest first), so a reader must take the newest entry of its zone."""

    def __init__(self, endpoint: str) -> None:
        self.endpoint = endpoint
        self.history: dict[tuple[str, str], list[tuple[float, float]]] = {}  # (type, zone) -> [(since, usd)]

    def set(self, instance: str, zone: str, usd: float, since: float | None = None) -> float:
        since = time.time() if since is None else since
        self.history.setdefault((instance, zone), []).append((since, usd))
        return since

    def env(self) -> dict[str, str]:
        return {"AWS_ENDPOINT_URL_EC2": self.endpoint, "AWS_ACCESS_KEY_ID": "testing",
                "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1",
                "AWS_EC2_METADATA_DISABLED": "true"}

    def patch(self, real):
        import datetime as dt

        from moto.core.responses import ActionResult

        standin = self

        def describe_spot_price_history(response):
            answer = real(response)
            out = []
            for entry in answer.result["SpotPriceHistory"]:
                set_here = standin.history.get((entry["InstanceType"], entry["AvailabilityZone"]))
                if not set_here:
                    out.append(entry)
                    continue
                for since, usd in sorted(set_here, reverse=True):
                    out.append({**entry, "SpotPrice": f"{usd:.6f}",
                                "Timestamp": dt.datetime.fromtimestamp(since, dt.timezone.utc).isoformat()})
            return ActionResult({"SpotPriceHistory": out})

        return describe_spot_price_history


@pytest.fixture
def ec2_spot(s3_standin, monkeypatch):
    """The session's moto server as EC2 (spot price history with the prices a test sets), and the env pointing boto3
    at it with dummy credentials."""
    from moto.ec2.responses.spot_instances import SpotInstances

    standin = Ec2SpotPrices(s3_standin.endpoint)
    monkeypatch.setattr(SpotInstances, "describe_spot_price_history",
                        standin.patch(SpotInstances.describe_spot_price_history))
    for key, value in standin.env().items():
        monkeypatch.setenv(key, value)
    return standin
