"""AWS spot prices from EC2's own ``DescribeSpotPriceHistory``: the price in force now, per availability zone.

boto3 is imported when a price is asked for, with the machine's own credentials (a node's instance role, a
laptop's profile). The endpoint is boto3's: ``AWS_ENDPOINT_URL_EC2`` (or ``AWS_ENDPOINT_URL``) points it at a
stand-in. On-demand prices barely move; they come from SkyPilot's catalog or the table.
"""

from __future__ import annotations

import datetime as dt
import os

from thrifty.money.prices.base import HTTP_TIMEOUT_S, PriceKey, PricePoint, PriceSourceError

LINUX = ("Linux/UNIX", "Linux/UNIX (Amazon VPC)")  # the product descriptions a Linux VM is billed under
MAX_PAGES = 5


def _region_of(key: PriceKey) -> str | None:
    if key.region:
        return key.region
    if key.zone and key.zone[-1].isalpha():  # us-east-1a -> us-east-1
        return key.zone[:-1]
    return None


class Ec2SpotPrices:
    """Spot $/hour of an instance type in a region (its zone's, or the dearest zone's when no zone is named)."""

    name = "aws-ec2-spot"

    def __init__(self, endpoint_url: str | None = None):
        self.endpoint_url = endpoint_url
        self.endpoint = endpoint_url or os.environ.get("AWS_ENDPOINT_URL_EC2") or os.environ.get("AWS_ENDPOINT_URL") \
            or "ec2 (boto3 default)"

    def lookup(self, key: PriceKey, now: float) -> PricePoint | None:
        region = _region_of(key)
        if key.cloud != "aws" or not key.spot or region is None:
            return None
        try:
            import boto3
            from botocore.config import Config
            from botocore.exceptions import BotoCoreError, ClientError
        except ImportError as exc:  # the node may lack boto3; the next source answers
            raise PriceSourceError(f"boto3 is not installed ({exc})") from None
        config = Config(connect_timeout=HTTP_TIMEOUT_S, read_timeout=HTTP_TIMEOUT_S,
                        retries={"max_attempts": 2, "mode": "standard"})
        args = {"InstanceTypes": [key.host], "ProductDescriptions": list(LINUX),
                "StartTime": dt.datetime.fromtimestamp(now, dt.timezone.utc)}
        if key.zone:
            args["AvailabilityZone"] = key.zone
        latest: dict[str, tuple[dt.datetime, float]] = {}  # zone -> (since when, $/h), the newest entry of each
        try:
            client = boto3.session.Session().client("ec2", region_name=region, endpoint_url=self.endpoint_url,
                                                    config=config)
            for _ in range(MAX_PAGES):
                reply = client.describe_spot_price_history(**args)
                for entry in reply.get("SpotPriceHistory", []):
                    if entry.get("InstanceType") != key.host or entry.get("ProductDescription") not in LINUX:
                        continue
                    zone, since = entry.get("AvailabilityZone", ""), entry.get("Timestamp")
                    price = float(entry["SpotPrice"])
                    if zone not in latest or (since is not None and since > latest[zone][0]):
                        latest[zone] = (since, price)
                token = reply.get("NextToken")
                if not token:
                    break
                args["NextToken"] = token
        except (BotoCoreError, ClientError) as exc:
            raise PriceSourceError(f"EC2 DescribeSpotPriceHistory in {region}: {exc}") from None
        if key.zone:
            latest = {z: v for z, v in latest.items() if z == key.zone}
        if not latest:
            return None
        zone = max(latest, key=lambda z: latest[z][1])  # the asked zone, or the dearest: a cap never counts low
        since, price = latest[zone]
        where = zone if key.zone else f"{region}, the dearest of {len(latest)} zone(s): {zone}"
        return PricePoint(price, f"AWS EC2 spot price history ({where})", now, region, zone,
                          as_of=since.isoformat() if since is not None else "")
