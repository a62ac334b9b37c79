"""The SkyPilot task's candidates: one per (cloud[/region], accelerator, spot|on-demand) the price source knows, each
at its freshest price (``thrifty.money.prices``: the clouds' own sources, SkyPilot's catalog, the dated table), its
quote saying where that price came from.

``kubernetes`` (SkyPilot's Kubernetes infra: your kubeconfig's cluster) is a candidate per accelerator at
``compute.kubernetes_usd_per_gpu_hour`` x its GPUs, with no spot market: it is never a spot candidate and
never an on-demand fallback, but a peer of the spot candidates ranked by run cost like them.
"""

from __future__ import annotations

from dataclasses import dataclass

from thrifty.config import RunConfig
from thrifty.money.prices import LivePrices, quote_accelerator
from thrifty.money.pricing import PricingError, Quote, parse_accelerator

KUBERNETES = "kubernetes"  # SkyPilot's infra name (also `k8s`); its record's cloud, lower-cased


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

    @property
    def spot_applies(self) -> bool:
        """False on a Kubernetes cluster: its pods are not bought on a spot market (nor an on-demand fallback)."""
        return self.cloud != KUBERNETES

    @property
    def market(self) -> str:
        return "cluster" if not self.spot_applies else "spot" if self.spot else "on-demand"


def kubernetes_quote(cfg: RunConfig, accelerator: str) -> Quote:
    """A pod with ``accelerator`` on the user's cluster, at compute.kubernetes_usd_per_gpu_hour per GPU."""
    name, count = parse_accelerator(accelerator)
    rate = cfg.compute.kubernetes_usd_per_gpu_hour
    usd = rate * count
    why = "0: a cluster you already pay for" if rate == 0 else "your rate"
    return Quote(KUBERNETES, f"pod-{name}-{count}", False, usd, usd,
                 f"compute.kubernetes_usd_per_gpu_hour ${rate:g}/GPU-hour x {count} ({why})", f"{name}:{count}", "")


def candidate_prices(cfg: RunConfig) -> LivePrices:
    """The chain cloud candidates are priced by (``budget.prices`` auto or live), cached in the run's store."""
    try:
        from thrifty.storage import open_store

        store = open_store(cfg.store)
    except Exception:  # a store this machine cannot open: prices are read without the shared cache
        store = None
    return LivePrices(store, cfg.budget.spot_price_max_age_s)  # a candidate is a cloud's: live (auto) it is


def candidates(cfg: RunConfig, source: str = "auto", live: LivePrices | None = None) -> tuple[list[Candidate], list[str]]:
    """Priced candidates, cheapest first, and notes on the combinations left out (not offered or unpriced)."""
    c = cfg.compute
    if source == "auto" and cfg.budget.prices == "table":
        source = "offline"  # the shipped table only, as budget.prices says
    if live is None and source == "auto":
        live = candidate_prices(cfg)
    markets = [True, False] if c.use_spot and c.on_demand_fallback else [c.use_spot]
    out, notes = [], []
    for cloud in c.clouds:
        if cloud == KUBERNETES:
            for acc in c.accelerators:
                q = kubernetes_quote(cfg, acc)
                # SkyPilot prices a Kubernetes pod at $0, so max_hourly_cost never skips it
                out.append(Candidate(cloud, None, q.accelerator, False, q, c.num_nodes, True))
            notes.append(f"kubernetes: spot does not apply (pods on your cluster are not bought on a spot market); "
                         f"priced at compute.kubernetes_usd_per_gpu_hour ${c.kubernetes_usd_per_gpu_hour:g}/GPU-hour"
                         + (" (0: a cluster you already pay for)" if c.kubernetes_usd_per_gpu_hour == 0 else ""))
            continue
        regions = [r.split("/", 1)[1] for r in c.regions if r.startswith(cloud + "/")] or [None]
        for acc in c.accelerators:
            name, count = parse_accelerator(acc)
            acc = f"{name}:{count}"
            missing = []
            for spot in markets:
                for region in regions:
                    try:
                        q = quote_accelerator(cloud, acc, spot, source, live, region)  # type: ignore[arg-type]
                    except PricingError:
                        missing.append("spot" if spot else "on-demand")
                        break
                    within = c.max_hourly_cost is None or q.usd_per_hour <= c.max_hourly_cost
                    out.append(Candidate(cloud, region, acc, spot, q, c.num_nodes, within))
            if missing:
                notes.append(f"{cloud} {acc} ({', '.join(missing)}): no price known, probably not offered there; left out")
    out.sort(key=lambda k: (not k.within_cap, k.usd_per_hour))
    return out, notes
