"""What every price source speaks: the key of a price (cloud, instance, market, region, zone), a price read with its
time and source, and the narrow protocol a source implements (tests inject loopback stand-ins behind it)."""

from __future__ import annotations

import time
from dataclasses import dataclass, replace
from typing import Protocol

ON_DEMAND_MAX_AGE_S = 24 * 3600.0  # on-demand list prices move monthly at most: read again once a day
HTTP_TIMEOUT_S = 10.0  # one request to a price source; a source that does not answer in time is skipped


class PriceSourceError(RuntimeError):
    """A source that could not answer now (no network, no credentials, an error reply): the next one is asked."""


@dataclass(frozen=True)
class PriceKey:
    """One node of ``instance`` on ``cloud``, spot or on-demand, in ``region`` (None: the source's cheapest or, for a
    meter, unknown) and ``zone`` (None: any zone of the region, the dearest counted)."""

    cloud: str
    instance: str  # as the price table names it: g5.xlarge, g2-standard-4, n1-highmem-4+T4, Standard_NC4as_T4_v3
    spot: bool
    region: str | None = None
    zone: str | None = None
    accelerator: str = ""  # NAME:COUNT; GCP bills a GPU apart from its host VM

    @property
    def market(self) -> str:
        return "spot" if self.spot else "on-demand"

    @property
    def host(self) -> str:
        """The VM type as the cloud names it (GCP rows label a host with its GPU: n1-highmem-4+T4)."""
        return self.instance.split("+", 1)[0]


@dataclass(frozen=True)
class PricePoint:
    """A price as read from a source: $/hour of one node, where it came from, and when it was read."""

    usd_per_hour: float
    source: str  # the source and what it answered for, e.g. "AWS EC2 spot price history (us-east-1a)"
    fetched_unix: float  # when it was read from its source (the table: when this process looked it up)
    region: str | None = None
    zone: str | None = None
    as_of: str = ""  # when the source says the price took effect, or the table's date
    live: bool = True  # False: the offline table, whose age every figure states
    cached: bool = False  # read from the store's cache of an earlier lookup

    def age_s(self, now: float | None = None) -> float:
        return max(0.0, (time.time() if now is None else now) - self.fetched_unix)

    def describe(self, now: float | None = None) -> str:
        """The source with its age, for logs, plans and records."""
        if not self.live:
            return self.source
        age = self.age_s(now)
        when = "just now" if age < 60 else f"{_span(age)} ago"
        return f"{self.source}, read {when}" + (" (cached in the store)" if self.cached else "")

    def with_source(self, source: str) -> "PricePoint":
        return replace(self, source=source)


def _span(seconds: float) -> str:
    if seconds < 3600:
        return f"{seconds / 60:.0f} min"
    if seconds < 48 * 3600:
        return f"{seconds / 3600:.1f} h"
    return f"{seconds / 86400:.0f} days"


class PriceSource(Protocol):
    """One place prices come from. ``lookup`` answers None when the source does not price ``key`` (another cloud, an
    unknown instance) and raises :class:`PriceSourceError` when it could not be asked."""

    name: str
    endpoint: str  # where it is asked (a URL, or the SDK's default); negative answers are remembered per endpoint

    def lookup(self, key: PriceKey, now: float) -> PricePoint | None: ...
