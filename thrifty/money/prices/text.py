"""``thrifty prices``: instances with their freshest spot and on-demand prices, each with its source (or the storage
tiers, from the table)."""

from __future__ import annotations

from thrifty.money.prices.live import LivePrices
from thrifty.money.prices.offers import live_quote, price_table
from thrifty.money.pricing import CLOUDS, Quote, Source, check_cloud, row_quote, storage_text


def prices_text(accelerator: str | None = None, clouds: list[str] | None = None, storage: bool = False,
                source: Source = "auto", live: LivePrices | None = None) -> str:
    """The price table as text: instances (optionally one accelerator) at their freshest price (``auto``: the
    clouds' own sources first), or storage tiers; each price numbered by its source, listed under the table."""
    clouds = list(clouds or CLOUDS)
    for cloud in clouds:
        check_cloud(cloud)
    if storage:
        return storage_text(clouds)
    rows = price_table(accelerator, clouds, source)
    if source == "auto" and live is None:
        live = LivePrices(None)
    sources: dict[str, int] = {}

    def priced(row, spot: bool) -> Quote | None:
        if spot and row.spot_usd_per_hour is None:
            return None
        return live_quote(row, spot, live) if source == "auto" and live is not None else row_quote(row, spot)

    def ref(q: Quote | None) -> str:
        return "-" if q is None else str(sources.setdefault(q.source, len(sources) + 1))

    lines = [f"{'cloud':<6} {'accelerator':<11} {'instance':<26} {'vCPUs':>5} {'on-demand $/h':>13} {'spot $/h':>9} "
             f"{'spot saves':>10}  {'region':<14} source (on-demand/spot)"]
    for r in rows:
        od, sp = priced(r, False), priced(r, True)
        spot = f"{sp.usd_per_hour:>9.3f}" if sp else f"{'-':>9}"
        saves = f"{1 - sp.usd_per_hour / od.usd_per_hour:>10.0%}" if sp and od and od.usd_per_hour else f"{'-':>10}"
        region = (sp.region if sp else "") or r.region
        lines.append(f"{r.cloud:<6} {r.accelerator:<11} {r.instance:<26} {r.vcpus:>5} {od.usd_per_hour:>13.3f} "
                     f"{spot} {saves}  {region:<14} [{ref(od)}/{ref(sp)}]")
    lines += ["", "Sources:"]
    lines += [f"  [{n}] {text}" for text, n in sorted(sources.items(), key=lambda kv: kv[1])]
    if not any(text.startswith("SkyPilot") for text in sources):
        lines.append("  (SkyPilot's catalog is not on this machine; `sky show-gpus` fetches it.)")
    for failure in dict.fromkeys(live.failures if live is not None else []):
        lines.append(f"  could not ask {failure}")
    if any("check it" in text for text in sources):
        lines.append("  Spot prices move hourly: a price from the table is a typical level, not today's.")
    return "\n".join(lines) + "\n"
