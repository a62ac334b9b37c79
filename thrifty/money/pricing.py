"""Dollars per hour by cloud, instance and spot/on-demand; dollars per GB-month by storage tier: the offline table.

The table ships with the package so plans, budgets and the local launcher work with no network. Rows are
approximate list prices from the providers' public pricing pages for one US region each, as of the date in the
row; spot prices are typical levels, which move hourly. It is the last fallback: ``thrifty.money.prices`` reads
today's prices from the clouds' own sources (and SkyPilot's catalog), and every figure taken from this table says
its date ("price from a table of 2025-06: check it"). An unknown instance or accelerator is an error, never a
silent $0.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal

Cloud = Literal["aws", "gcp", "azure"]
CLOUDS: tuple[str, ...] = ("aws", "gcp", "azure")
Source = Literal["auto", "offline", "skypilot"]  # freshest (clouds, then catalog, then table) | table | catalog only


class PricingError(ValueError):
    """No price is known for what was asked."""


@dataclass(frozen=True)
class InstancePrice:
    cloud: str
    instance: str
    accelerator: str  # NAME:COUNT
    vcpus: int
    on_demand_usd_per_hour: float
    spot_usd_per_hour: float | None  # None: no spot offer known
    region: str
    source: str
    as_of: str  # date the row was compiled (offline) or the catalog file's date (SkyPilot)
    spot_region: str | None = None  # where the spot price is (SkyPilot's cheapest); None = ``region``


_AWS = "aws.amazon.com/ec2/pricing (on-demand), EC2 spot price history (typical)"
_GCP = "cloud.google.com/compute/gpus-pricing + vm-instance pricing (spot = Spot VM price)"
_AZ = "azure.microsoft.com/pricing/details/virtual-machines/linux (pay-as-you-go, spot)"
_DATE = "2025-06"

INSTANCES: tuple[InstancePrice, ...] = (
    InstancePrice("aws", "g4dn.xlarge", "T4:1", 4, 0.526, 0.158, "us-east-1", _AWS, _DATE),
    InstancePrice("aws", "g4dn.12xlarge", "T4:4", 48, 3.912, 1.174, "us-east-1", _AWS, _DATE),
    InstancePrice("aws", "g6.xlarge", "L4:1", 4, 0.805, 0.320, "us-east-1", _AWS, _DATE),
    InstancePrice("aws", "g6.12xlarge", "L4:4", 48, 4.602, 1.841, "us-east-1", _AWS, _DATE),
    InstancePrice("aws", "g5.xlarge", "A10G:1", 4, 1.006, 0.302, "us-east-1", _AWS, _DATE),
    InstancePrice("aws", "g5.12xlarge", "A10G:4", 48, 5.672, 1.702, "us-east-1", _AWS, _DATE),
    InstancePrice("aws", "p3.2xlarge", "V100:1", 8, 3.060, 0.918, "us-east-1", _AWS, _DATE),
    InstancePrice("aws", "p3.8xlarge", "V100:4", 32, 12.240, 3.672, "us-east-1", _AWS, _DATE),
    InstancePrice("aws", "p4d.24xlarge", "A100:8", 96, 32.773, 11.570, "us-east-1", _AWS, _DATE),
    InstancePrice("aws", "p5.48xlarge", "H100:8", 192, 98.320, 39.330, "us-east-1", _AWS, _DATE),
    InstancePrice("gcp", "n1-standard-4+T4", "T4:1", 4, 0.540, 0.180, "us-central1", _GCP, _DATE),
    InstancePrice("gcp", "g2-standard-4", "L4:1", 4, 0.707, 0.283, "us-central1", _GCP, _DATE),
    InstancePrice("gcp", "g2-standard-48", "L4:4", 48, 3.998, 1.599, "us-central1", _GCP, _DATE),
    InstancePrice("gcp", "n1-standard-8+V100", "V100:1", 8, 2.860, 0.980, "us-central1", _GCP, _DATE),
    InstancePrice("gcp", "a2-highgpu-1g", "A100:1", 12, 3.673, 1.469, "us-central1", _GCP, _DATE),
    InstancePrice("gcp", "a2-highgpu-8g", "A100:8", 96, 29.387, 11.755, "us-central1", _GCP, _DATE),
    InstancePrice("gcp", "a3-highgpu-8g", "H100:8", 208, 88.250, 29.000, "us-central1", _GCP, _DATE),
    InstancePrice("azure", "Standard_NC4as_T4_v3", "T4:1", 4, 0.526, 0.158, "eastus", _AZ, _DATE),
    InstancePrice("azure", "Standard_NV36ads_A10_v5", "A10:1", 36, 3.200, 0.960, "eastus", _AZ, _DATE),
    InstancePrice("azure", "Standard_NC6s_v3", "V100:1", 6, 3.060, 0.918, "eastus", _AZ, _DATE),
    InstancePrice("azure", "Standard_NC24ads_A100_v4", "A100:1", 24, 3.673, 1.470, "eastus", _AZ, _DATE),
    InstancePrice("azure", "Standard_ND96asr_v4", "A100:8", 96, 27.197, 8.159, "eastus", _AZ, _DATE),
    InstancePrice("azure", "Standard_NC40ads_H100_v5", "H100:1", 40, 6.980, 2.790, "eastus", _AZ, _DATE),
)


@dataclass(frozen=True)
class Quote:
    cloud: str
    instance: str
    spot: bool
    usd_per_hour: float  # one node
    on_demand_usd_per_hour: float
    source: str  # where the number came from (a cloud's own source, SkyPilot's catalog, the offline table) and when
    accelerator: str = ""
    region: str = ""
    fetched_unix: float = 0.0  # when a cloud's source was read for it; 0: a catalog file or the table (dated in source)


# ---------------------------------------------------------------- accelerators


def parse_accelerator(spec: str) -> tuple[str, int]:
    """``A10G:1`` -> ('A10G', 1); a bare name means one."""
    name, _, count = spec.partition(":")
    if not re.fullmatch(r"[A-Za-z0-9\-]+", name) or (count and not count.isdigit()) or count == "0":
        raise PricingError(f"accelerator {spec!r} must look like NAME or NAME:COUNT, e.g. 'A10G:1'")
    return name, int(count or 1)


def _same_accelerator(a: str, b: str) -> bool:
    (na, ca), (nb, cb) = parse_accelerator(a), parse_accelerator(b)
    return na.lower() == nb.lower() and ca == cb


def check_cloud(cloud: str) -> None:
    if cloud not in CLOUDS:
        raise PricingError(f"unknown cloud {cloud!r}; use one of {', '.join(CLOUDS)}")


def find_instance(cloud: str, instance: str) -> InstancePrice:
    """The offline row for ``cloud``/``instance``; PricingError naming the known ones if absent."""
    check_cloud(cloud)
    for row in INSTANCES:
        if row.cloud == cloud and row.instance.lower() == instance.lower():
            return row
    known = ", ".join(r.instance for r in INSTANCES if r.cloud == cloud) or "none"
    raise PricingError(f"no price for {cloud}:{instance}. Known {cloud} instances: {known}.")


def accelerator_of(cloud: str, instance: str) -> str | None:
    """The accelerator (NAME:COUNT) an instance carries in the offline table (``thrifty.money.prices.accelerator_of``
    also asks SkyPilot's catalog); None when the table does not know it."""
    if cloud not in CLOUDS:
        return None
    for row in INSTANCES:
        if row.cloud == cloud and row.instance.lower() == instance.lower():
            return row.accelerator
    if "+" in instance:  # GCP's n1 host with a GPU attached, as the catalog's offers label it
        return f"{instance.rsplit('+', 1)[1]}:1"
    return None


def offline_offers(cloud: str, accelerator: str) -> list[InstancePrice]:
    """Offline rows of ``cloud`` carrying exactly ``accelerator`` (NAME:COUNT), cheapest first."""
    check_cloud(cloud)
    rows = [r for r in INSTANCES if r.cloud == cloud and _same_accelerator(r.accelerator, accelerator)]
    return sorted(rows, key=lambda r: r.on_demand_usd_per_hour)


def known_accelerators(cloud: str | None = None) -> list[str]:
    return sorted({r.accelerator for r in INSTANCES if cloud in (None, r.cloud)})


def table_note(row: InstancePrice, region: str) -> str:
    """Where a table price comes from, with the age every figure taken from it must state."""
    return f"offline table ({row.source}, {region}): {age_note(row.as_of)}"


def age_note(as_of: str = _DATE) -> str:
    """What every figure from the table says about itself."""
    return f"price from a table of {as_of}: check it"


def row_quote(row: InstancePrice, spot: bool) -> Quote:
    if spot and row.spot_usd_per_hour is None:
        raise PricingError(f"{row.cloud}:{row.instance} has no spot price in {row.source}; use on-demand for it")
    price = row.spot_usd_per_hour if spot else row.on_demand_usd_per_hour
    region = (row.spot_region or row.region) if spot else row.region
    if row.source.startswith("SkyPilot catalog"):
        src = f"{row.source}, cheapest region {region}"
    else:
        src = table_note(row, region)
    return Quote(row.cloud, row.instance, spot, float(price), row.on_demand_usd_per_hour, src, row.accelerator, region)


def quote(cloud: str, instance: str, spot: bool) -> Quote:
    """$/hour of one instance from the offline table; raises PricingError if unknown."""
    return row_quote(find_instance(cloud, instance), spot)


def quote_emulated(spec: str, spot: bool) -> Quote:
    """``aws:g5.xlarge`` -> the quote the local launcher meters at."""
    cloud, _, instance = spec.partition(":")
    return quote(cloud, instance, spot)


# ---------------------------------------------------------------- storage tiers


@dataclass(frozen=True)
class StorageTierPrice:
    cloud: str
    tier: str  # the provider's own storage-class / access-tier name
    temperature: Literal["hot", "cool", "cold", "archive"]
    usd_per_gb_month: float
    min_storage_days: int  # billed at least this long (early-deletion charge)
    retrieval_usd_per_gb: float  # standard retrieval / data-access charge
    region: str
    source: str
    as_of: str


_S3 = "aws.amazon.com/s3/pricing (storage, retrieval)"
_GCS = "cloud.google.com/storage/pricing (regional; retrieval fees)"
_BLOB = "azure.microsoft.com/pricing/details/storage/blobs (block blob, LRS, first 50 TB)"

STORAGE_TIERS: tuple[StorageTierPrice, ...] = (
    StorageTierPrice("aws", "STANDARD", "hot", 0.023, 0, 0.0, "us-east-1", _S3, _DATE),
    StorageTierPrice("aws", "STANDARD_IA", "cool", 0.0125, 30, 0.01, "us-east-1", _S3, _DATE),
    StorageTierPrice("aws", "GLACIER_IR", "cold", 0.004, 90, 0.03, "us-east-1", _S3, _DATE),
    StorageTierPrice("aws", "GLACIER", "cold", 0.0036, 90, 0.01, "us-east-1", _S3, _DATE),
    StorageTierPrice("aws", "DEEP_ARCHIVE", "archive", 0.00099, 180, 0.02, "us-east-1", _S3, _DATE),
    StorageTierPrice("gcp", "STANDARD", "hot", 0.020, 0, 0.0, "us-central1", _GCS, _DATE),
    StorageTierPrice("gcp", "NEARLINE", "cool", 0.010, 30, 0.01, "us-central1", _GCS, _DATE),
    StorageTierPrice("gcp", "COLDLINE", "cold", 0.004, 90, 0.02, "us-central1", _GCS, _DATE),
    StorageTierPrice("gcp", "ARCHIVE", "archive", 0.0012, 365, 0.05, "us-central1", _GCS, _DATE),
    StorageTierPrice("azure", "Hot", "hot", 0.018, 0, 0.0, "eastus", _BLOB, _DATE),
    StorageTierPrice("azure", "Cool", "cool", 0.010, 30, 0.01, "eastus", _BLOB, _DATE),
    StorageTierPrice("azure", "Cold", "cold", 0.0036, 90, 0.03, "eastus", _BLOB, _DATE),
    StorageTierPrice("azure", "Archive", "archive", 0.002, 180, 0.02, "eastus", _BLOB, _DATE),
)

_SCHEME_CLOUD = {"s3": "aws", "gs": "gcp", "az": "azure"}


def storage_cloud(store_uri: str) -> str:
    """``s3://b/p`` -> aws; a local path is an error (it has no tier prices)."""
    scheme = store_uri.split("://", 1)[0] if "://" in store_uri else "file"
    if scheme not in _SCHEME_CLOUD:
        raise PricingError(f"store {store_uri!r} is local; storage tier prices exist for s3://, gs:// and az:// stores")
    return _SCHEME_CLOUD[scheme]


def storage_tiers(cloud: str) -> list[StorageTierPrice]:
    """The tiers of ``cloud``, hottest (dearest) first."""
    check_cloud(cloud)
    return sorted((t for t in STORAGE_TIERS if t.cloud == cloud), key=lambda t: -t.usd_per_gb_month)


def storage_price(cloud: str, tier: str) -> StorageTierPrice:
    """$/GB-month of ``tier`` (the provider's name, any case) on ``cloud``; PricingError if unknown."""
    for t in storage_tiers(cloud):
        if t.tier.lower() == tier.lower():
            return t
    known = ", ".join(t.tier for t in storage_tiers(cloud))
    raise PricingError(f"no storage price for tier {tier!r} on {cloud}. Known {cloud} tiers: {known}.")


def hot_tier(cloud: str) -> StorageTierPrice:
    return storage_tiers(cloud)[0]


def coldest_tier(cloud: str) -> StorageTierPrice:
    return storage_tiers(cloud)[-1]


# ---------------------------------------------------------------- `thrifty prices --storage`


def storage_text(clouds: list[str] | None = None) -> str:
    """The storage tiers as text, each row with its source and date."""
    clouds = list(clouds or CLOUDS)
    for cloud in clouds:
        check_cloud(cloud)
    lines = [f"{'cloud':<6} {'tier':<13} {'kind':<8} {'$/GB-month':>10} {'min days':>8} {'retrieval $/GB':>14}  "
             "region, source, date"]
    for cloud in clouds:
        for t in storage_tiers(cloud):
            lines.append(f"{t.cloud:<6} {t.tier:<13} {t.temperature:<8} {t.usd_per_gb_month:>10.5f} {t.min_storage_days:>8} "
                         f"{t.retrieval_usd_per_gb:>14.3f}  {t.region}, {t.source}, {t.as_of}")
    return "\n".join(lines) + "\n"
