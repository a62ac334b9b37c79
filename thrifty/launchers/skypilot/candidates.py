"""The SkyPilot task's candidates: one per (cloud[/region], accelerator, spot|on-demand) the price source knows."""

from __future__ import annotations

from dataclasses import dataclass

from thrifty.config import RunConfig
from thrifty.pricing import PricingError, Quote, parse_accelerator, quote_accelerator


@dataclass(frozen=True)
class Candidate:
    """One ``any_of`` entry with the price the plan expects for it."""

    cloud: str
    region: str | None
    accelerator: str
    spot: bool
    quote: Quote
    nodes: int
    within_cap: bool  # price at or below compute.max_hourly_cost (SkyPilot would skip it otherwise)

    @property
    def infra(self) -> str:
        return f"{self.cloud}/{self.region}" if self.region else self.cloud

    @property
    def usd_per_hour(self) -> float:
        """The whole job: every node."""
        return self.quote.usd_per_hour * self.nodes


def candidates(cfg: RunConfig, source: str = "auto") -> tuple[list[Candidate], list[str]]:
    """Priced candidates, cheapest first, and notes on the combinations left out (not offered or unpriced)."""
    c = cfg.compute
    markets = [True, False] if c.use_spot and c.on_demand_fallback else [c.use_spot]
    out, notes = [], []
    for cloud in c.clouds:
        regions = [r.split("/", 1)[1] for r in c.regions if r.startswith(cloud + "/")] or [None]
        for acc in c.accelerators:
            name, count = parse_accelerator(acc)
            acc = f"{name}:{count}"
            missing = []
            for spot in markets:
                try:
                    q = quote_accelerator(cloud, acc, spot, source)  # type: ignore[arg-type]
                except PricingError:
                    missing.append("spot" if spot else "on-demand")
                    continue
                for region in regions:
                    within = c.max_hourly_cost is None or q.usd_per_hour <= c.max_hourly_cost
                    out.append(Candidate(cloud, region, acc, spot, q, c.num_nodes, within))
            if missing:
                notes.append(f"{cloud} {acc} ({', '.join(missing)}): no price known, probably not offered there; left out")
    out.sort(key=lambda k: (not k.within_cap, k.usd_per_hour))
    return out, notes
