"""Dollars per hour by cloud, instance and spot/on-demand; dollars per GB-month by storage tier.

The offline table ships with the package so plans, budgets and the local launcher work with
no network. Rows are approximate list prices from the providers' public pricing pages for one
US region each, as of the date in the row; spot prices are typical levels, which move hourly.
Treat them as estimates. Where SkyPilot's catalog files are already on this machine
(``~/.sky/catalogs/<version>/<cloud>/vms.csv``, written by ``sky show-gpus``/``sky launch``),
``source="auto"`` prices accelerators from them instead, cheapest region first, and every
quote says which source it came from. The catalog files are read directly, never through
SkyPilot's loaders, which refresh stale files over the network.
An unknown instance or accelerator is an error, never a silent $0.
"""

from __future__ import annotations

import csv
import importlib.util
import os
import re
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

Cloud = Literal["aws", "gcp", "azure"]
CLOUDS: tuple[str, ...] = ("aws", "gcp", "azure")
Source = Literal["auto", "offline", "skypilot"]


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
    source: str  # where the number came from: the offline table or SkyPilot's catalog, with its date
    accelerator: str = ""
    region: str = ""


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


def _check_cloud(cloud: str) -> None:
    if cloud not in CLOUDS:
        raise PricingError(f"unknown cloud {cloud!r}; use one of {', '.join(CLOUDS)}")


def find_instance(cloud: str, instance: str) -> InstancePrice:
    """The offline row for ``cloud``/``instance``; PricingError naming the known ones if absent."""
    _check_cloud(cloud)
    for row in INSTANCES:
        if row.cloud == cloud and row.instance.lower() == instance.lower():
            return row
    known = ", ".join(r.instance for r in INSTANCES if r.cloud == cloud) or "none"
    raise PricingError(f"no price for {cloud}:{instance}. Known {cloud} instances: {known}.")


def accelerator_of(cloud: str, instance: str) -> str | None:
    """The accelerator (NAME:COUNT) an instance carries: the offline table, then SkyPilot's catalog when on this
    machine; None when neither knows it (a CPU instance, or one priced nowhere here)."""
    if cloud not in CLOUDS:
        return None
    for row in INSTANCES:
        if row.cloud == cloud and row.instance.lower() == instance.lower():
            return row.accelerator
    path = sky_catalog_file(cloud)
    if path is not None:
        with open(path, newline="") as f:
            for r in csv.DictReader(f):
                if (r.get("InstanceType") or "").lower() == instance.lower() and r.get("AcceleratorName"):
                    return f"{r['AcceleratorName']}:{int(_float(r.get('AcceleratorCount')) or 1)}"
    if "+" in instance:  # GCP's n1 host with a GPU attached, as ``catalog_offers`` labels it
        return f"{instance.rsplit('+', 1)[1]}:1"
    return None


def offline_offers(cloud: str, accelerator: str) -> list[InstancePrice]:
    """Offline rows of ``cloud`` carrying exactly ``accelerator`` (NAME:COUNT), cheapest first."""
    _check_cloud(cloud)
    rows = [r for r in INSTANCES if r.cloud == cloud and _same_accelerator(r.accelerator, accelerator)]
    return sorted(rows, key=lambda r: r.on_demand_usd_per_hour)


def known_accelerators(cloud: str | None = None) -> list[str]:
    return sorted({r.accelerator for r in INSTANCES if cloud in (None, r.cloud)})


def _row_quote(row: InstancePrice, spot: bool) -> Quote:
    if spot and row.spot_usd_per_hour is None:
        raise PricingError(f"{row.cloud}:{row.instance} has no spot price in {row.source}; use on-demand for it")
    price = row.spot_usd_per_hour if spot else row.on_demand_usd_per_hour
    region = (row.spot_region or row.region) if spot else row.region
    if row.source.startswith("SkyPilot catalog"):
        src = f"{row.source}, cheapest region {region}"
    else:
        src = f"offline table ({row.source}, {row.as_of}, {region})"
    return Quote(row.cloud, row.instance, spot, float(price), row.on_demand_usd_per_hour, src, row.accelerator, region)


def quote(cloud: str, instance: str, spot: bool) -> Quote:
    """$/hour of one instance from the offline table; raises PricingError if unknown."""
    return _row_quote(find_instance(cloud, instance), spot)


def quote_emulated(spec: str, spot: bool) -> Quote:
    """``aws:g5.xlarge`` -> the quote the local launcher meters at."""
    cloud, _, instance = spec.partition(":")
    return quote(cloud, instance, spot)


def offers(cloud: str, accelerator: str, source: Source = "auto") -> tuple[list[InstancePrice], str]:
    """Instances of ``cloud`` with ``accelerator``, cheapest first, and the name of the source used.

    ``auto``: SkyPilot's catalog when its file for ``cloud`` is on this machine, else the offline table.
    """
    _check_cloud(cloud)
    parse_accelerator(accelerator)
    if source in ("auto", "skypilot"):
        path = sky_catalog_file(cloud)
        if path is not None:
            return catalog_offers(path, cloud, accelerator), f"SkyPilot catalog {path}"
        if source == "skypilot":
            raise PricingError(f"SkyPilot's {cloud} catalog is not on this machine; run `sky show-gpus --infra {cloud}` "
                               "once with network access, or use the offline table")
    return offline_offers(cloud, accelerator), "offline table"


def quote_accelerator(cloud: str, accelerator: str, spot: bool, source: Source = "auto") -> Quote:
    """The cheapest instance of ``cloud`` carrying ``accelerator`` (NAME:COUNT); PricingError if none is known."""
    rows, used = offers(cloud, accelerator, source)
    if spot:
        rows = [r for r in rows if r.spot_usd_per_hour is not None]
    if not rows:
        known = ", ".join(sorted({r.accelerator for r in INSTANCES if r.cloud == cloud})) if used == "offline table" else "see `sky show-gpus`"
        raise PricingError(f"no {'spot ' if spot else ''}price for {accelerator} on {cloud} in the {used}. "
                           f"Accelerators known on {cloud}: {known}.")
    best = min(rows, key=lambda r: (r.spot_usd_per_hour if spot else r.on_demand_usd_per_hour))
    return _row_quote(best, spot)


# ---------------------------------------------------------------- SkyPilot's catalog (read offline)


def sky_catalog_file(cloud: str) -> Path | None:
    """Path of SkyPilot's ``<cloud>/vms.csv`` when SkyPilot is installed and the file is on disk; else None."""
    if not Path("~/.sky/catalogs").expanduser().is_dir() or importlib.util.find_spec("sky") is None:
        return None  # cheap checks first: importing sky takes seconds
    try:
        from sky.catalog import common as sky_catalog_common
    except Exception:  # a broken SkyPilot install must not break pricing
        return None
    path = Path(sky_catalog_common.get_catalog_path(f"{cloud}/vms.csv"))
    return path if path.is_file() else None


def _float(v: str | None) -> float | None:
    try:
        x = float(v) if v not in (None, "") else None
    except ValueError:
        return None
    return x if x is not None and x == x else None  # NaN -> None


def _gcp_host_rule(name: str, count: int) -> tuple[list[str] | None, int]:
    """SkyPilot's rule for the host VM of a GCP GPU: fixed types (A100, H100, L4...) or n1 with enough vCPUs."""
    fixed: list[str] | None = None
    cpus = 4 * count
    try:
        from sky.catalog import gcp_catalog as g

        fixed = g._ACC_INSTANCE_TYPE_DICTS.get(name, {}).get(count)  # noqa: SLF001 - SkyPilot's own table
        table = g._NUM_ACC_TO_NUM_CPU.get(name, g._NUM_ACC_TO_NUM_CPU["DEFAULT"])  # noqa: SLF001
        cpus = table.get(count, cpus)
    except Exception:
        pass
    return fixed, cpus


def catalog_offers(path: Path, cloud: str, accelerator: str) -> list[InstancePrice]:
    """Instances with ``accelerator`` in a SkyPilot ``vms.csv``, each at its cheapest region, cheapest first."""
    name, count = parse_accelerator(accelerator)
    with open(path, newline="") as f:
        rows = list(csv.DictReader(f))
    as_of = time.strftime("%Y-%m-%d", time.gmtime(os.path.getmtime(path)))
    source = f"SkyPilot catalog {path} (file date {as_of})"

    def matches(r: dict[str, str]) -> bool:
        return (r.get("AcceleratorName") or "").lower() == name.lower() and _float(r.get("AcceleratorCount")) == count

    # instance -> [on-demand $/h, its region, spot $/h, its region, vCPUs], each the cheapest seen
    offers_by_instance: dict[str, list] = {}

    def add(instance: str, od: float | None, spot: float | None, region: str, vcpus: float | None) -> None:
        if od is None:
            return
        best = offers_by_instance.setdefault(instance, [od, region, spot, region if spot is not None else None, int(vcpus or 0)])
        if od < best[0]:
            best[0], best[1] = od, region
        if spot is not None and (best[2] is None or spot < best[2]):
            best[2], best[3] = spot, region

    if cloud != "gcp":
        for r in rows:
            if r.get("InstanceType") and matches(r):
                add(r["InstanceType"], _float(r.get("Price")), _float(r.get("SpotPrice")), r.get("Region", ""),
                    _float(r.get("vCPUs")))
    else:
        # GCP lists a GPU and its host VM as separate rows: price = GPU + cheapest host in the same zone.
        fixed, cpus = _gcp_host_rule(name, count)
        hosts = [r for r in rows if r.get("InstanceType") and not r.get("AcceleratorName")]
        for gpu in (r for r in rows if not r.get("InstanceType") and matches(r)):
            zone = [h for h in hosts if h.get("AvailabilityZone") == gpu.get("AvailabilityZone")
                    and _float(h.get("Price")) is not None]
            if fixed:
                zone = [h for h in zone if h["InstanceType"] in fixed]
            else:
                zone = [h for h in zone if h["InstanceType"].startswith("n1-")
                        and (_float(h.get("vCPUs")) or 0) >= cpus and (_float(h.get("MemoryGiB")) or 0) >= 4 * cpus]
            if not zone:
                continue
            host = min(zone, key=lambda h: _float(h["Price"]) or 0.0)
            g_od, h_od = _float(gpu.get("Price")), _float(host.get("Price"))
            g_sp, h_sp = _float(gpu.get("SpotPrice")), _float(host.get("SpotPrice"))
            od = g_od + h_od if g_od is not None and h_od is not None else None
            sp = g_sp + h_sp if g_sp is not None and h_sp is not None else None
            label = host["InstanceType"] if fixed else f"{host['InstanceType']}+{name}"
            add(label, od, sp, gpu.get("Region", ""), _float(host.get("vCPUs")))
    out = [InstancePrice(cloud, inst, f"{name}:{count}", vcpus, od, spot, od_region, source, as_of, spot_region)
           for inst, (od, od_region, spot, spot_region, vcpus) in offers_by_instance.items()]
    return sorted(out, key=lambda r: r.on_demand_usd_per_hour)


def price_table(accelerator: str | None = None, clouds: tuple[str, ...] | list[str] = CLOUDS,
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
    _check_cloud(cloud)
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


# ---------------------------------------------------------------- `thrifty prices`


def prices_text(accelerator: str | None = None, clouds: list[str] | None = None, storage: bool = False,
                source: Source = "auto") -> str:
    """The price table as text: instances (optionally one accelerator), or storage tiers; each row with its source."""
    clouds = list(clouds or CLOUDS)
    for cloud in clouds:
        _check_cloud(cloud)
    lines: list[str] = []
    if storage:
        lines.append(f"{'cloud':<6} {'tier':<13} {'kind':<8} {'$/GB-month':>10} {'min days':>8} {'retrieval $/GB':>14}  region, source, date")
        for cloud in clouds:
            for t in storage_tiers(cloud):
                lines.append(f"{t.cloud:<6} {t.tier:<13} {t.temperature:<8} {t.usd_per_gb_month:>10.5f} {t.min_storage_days:>8} "
                             f"{t.retrieval_usd_per_gb:>14.3f}  {t.region}, {t.source}, {t.as_of}")
        return "\n".join(lines) + "\n"
    rows = price_table(accelerator, clouds, source)
    lines.append(f"{'cloud':<6} {'accelerator':<11} {'instance':<26} {'vCPUs':>5} {'on-demand $/h':>13} {'spot $/h':>9} {'spot saves':>10}  region")
    for r in rows:
        spot = f"{r.spot_usd_per_hour:>9.3f}" if r.spot_usd_per_hour is not None else f"{'-':>9}"
        saves = f"{1 - r.spot_usd_per_hour / r.on_demand_usd_per_hour:>10.0%}" if r.spot_usd_per_hour else f"{'-':>10}"
        lines.append(f"{r.cloud:<6} {r.accelerator:<11} {r.instance:<26} {r.vcpus:>5} {r.on_demand_usd_per_hour:>13.3f} "
                     f"{spot} {saves}  {r.region}")
    lines.append("")
    lines.append("Sources:")
    for src in sorted({(r.source, r.as_of) for r in rows}):
        lines.append(f"  {src[0]} ({src[1]})" if not src[0].startswith("SkyPilot") else f"  {src[0]}")
    if not any(r.source.startswith("SkyPilot") for r in rows):
        lines.append("  (SkyPilot's catalog is not on this machine; `sky show-gpus` fetches it. Spot prices move hourly.)")
    return "\n".join(lines) + "\n"
