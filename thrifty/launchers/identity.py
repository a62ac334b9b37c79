"""What a cloud node can learn about itself from its metadata server: instance type, spot or not, region, zone.

The node meters its own cost (``thrifty.money.meter``) at the price of the candidate it landed on, so
it asks the same link-local endpoint the notice watcher polls (``$THRIFTY_METADATA_BASE`` in
tests). Every probe returns what it could learn and never raises: an unknown field makes the
meter charge the dearest matching candidate instead.
"""

from __future__ import annotations

import json
import logging
from typing import Mapping

from thrifty.launchers.notice import _http, cluster_cloud, detect_cloud, metadata_base
from thrifty.money.meter import NodeIdentity

log = logging.getLogger("thrifty.money.meter")


def _get(url: str, headers: dict[str, str]) -> str | None:
    status, body = _http("GET", url, headers)
    return body.decode().strip() if status == 200 else None


def _aws(base: str) -> NodeIdentity:
    status, token = _http("PUT", f"{base}/latest/api/token", {"X-aws-ec2-metadata-token-ttl-seconds": "60"})
    headers = {"X-aws-ec2-metadata-token": token.decode().strip()} if status == 200 else {}
    meta = f"{base}/latest/meta-data"
    life = _get(f"{meta}/instance-life-cycle", headers)  # "spot" | "on-demand" (| "scheduled")
    return NodeIdentity("aws", _get(f"{meta}/instance-type", headers), None if life is None else life == "spot",
                        _get(f"{meta}/placement/region", headers), _get(f"{meta}/placement/availability-zone", headers))


def _gcp(base: str) -> NodeIdentity:
    headers = {"Metadata-Flavor": "Google"}
    meta = f"{base}/computeMetadata/v1/instance"
    machine = _get(f"{meta}/machine-type", headers)  # projects/123/machineTypes/g2-standard-4
    model = _get(f"{meta}/scheduling/provisioning-model", headers)  # SPOT | STANDARD
    if model is None:
        preemptible = _get(f"{meta}/scheduling/preemptible", headers)  # TRUE | FALSE (older VMs)
        spot = None if preemptible is None else preemptible.upper() == "TRUE"
    else:
        spot = model.upper() == "SPOT"
    zone = _get(f"{meta}/zone", headers)  # projects/123/zones/us-central1-a
    zone = zone.rsplit("/", 1)[-1] if zone else None
    region = zone.rsplit("-", 1)[0] if zone else None
    return NodeIdentity("gcp", machine.rsplit("/", 1)[-1] if machine else None, spot, region, zone)


def _azure(base: str) -> NodeIdentity:
    text = _get(f"{base}/metadata/instance?api-version=2021-02-01", {"Metadata": "true"})
    if text is None:
        return NodeIdentity("azure")
    compute = json.loads(text).get("compute", {})
    priority = compute.get("priority")  # Spot | Regular | Low
    return NodeIdentity("azure", compute.get("vmSize"), None if not priority else priority in ("Spot", "Low"),
                        compute.get("location"), compute.get("zone") or None)  # zone "1", "2", "3" or ""


_PROBES = {"aws": _aws, "gcp": _gcp, "azure": _azure}


def probe(cloud: str | None) -> NodeIdentity:
    """This node's identity on ``cloud`` (None: not on a known cloud, nothing asked)."""
    if cloud not in _PROBES:
        return NodeIdentity(None)
    try:
        return _PROBES[cloud](metadata_base(cloud).rstrip("/"))
    except Exception as exc:  # an unreachable endpoint: the meter charges the dearest candidate
        log.warning("could not read this node's %s metadata (%s); metering at the dearest candidate", cloud, exc)
        return NodeIdentity(cloud)


def identify(env: Mapping[str, str]) -> NodeIdentity:
    """What this node is, for its meter. A Kubernetes pod has no metadata server to ask and no spot market: it is
    one of the kubernetes candidates (never a cloud's dearest), the dearest of them when their GPU counts differ."""
    if cluster_cloud(env) == "kubernetes":
        return NodeIdentity("kubernetes", None, False)
    return probe(detect_cloud(env))
