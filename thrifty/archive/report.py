"""An archival pass as money and text: the monthly saving at the price table's storage tiers, a summary, markdown."""

from __future__ import annotations

from collections import Counter, defaultdict
from dataclasses import dataclass
from typing import Any

from thrifty.archive.plan import GIB, Item, Plan
from thrifty.archive.store import Outcome
from thrifty.numbers import cut, money
from thrifty.money.pricing import PricingError, StorageTierPrice, storage_cloud, storage_price

# ------------------------------------------------------------------------------------------- money and text


@dataclass(frozen=True)
class Savings:
    usd_per_month: float | None  # None on a local store (no tier prices)
    target: StorageTierPrice | None
    note: str


def monthly_savings(items: list[Item], store_uri: str, target_class: str) -> Savings:
    """Dollars a month saved by moving ``items`` from their class to ``target_class``, from the price table."""
    try:
        cloud = storage_cloud(store_uri)
    except PricingError:
        return Savings(None, None, "local store: disk has no tier prices (moving frees hot disk only)")
    target = storage_price(cloud, target_class)
    usd = 0.0
    for i in items:
        try:
            now = storage_price(cloud, i.storage_class)
        except PricingError:
            now = storage_price(cloud, "STANDARD" if cloud != "azure" else "Hot")
        usd += i.size / GIB * max(0.0, now.usd_per_gb_month - target.usd_per_gb_month)
    note = (f"{target.tier} on {cloud}: ${target.usd_per_gb_month}/GB-month, billed for at least "
            f"{target.min_storage_days} days, retrieval ${target.retrieval_usd_per_gb}/GB ({target.source}, "
            f"{target.as_of})")
    return Savings(usd, target, note)


def human_bytes(n: float) -> str:
    if n < 1024:
        return f"{n:.0f} B"
    for unit in ("KiB", "MiB", "GiB"):
        n /= 1024
        if n < 1024:
            return f"{n:.1f} {unit}"
    return f"{n / 1024:.1f} TiB"


def summary(p: Plan, outcome: Outcome | None = None) -> dict[str, Any]:
    todo = p.to_archive
    savings = monthly_savings(todo, p.settings.store, p.target_class)
    kept = Counter(i.reason for i in p.items if i.action == "keep")
    out: dict[str, Any] = {
        "store": p.settings.store, "as_of": p.as_of.isoformat(), "older_than_days": p.settings.older_than_days,
        "target_class": p.target_class, "dry_run": outcome is None,
        "objects_to_archive": len(todo), "bytes_to_archive": sum(i.size for i in todo),
        "groups_to_archive": len({i.group for i in todo}),
        "usd_per_month_saved": None if savings.usd_per_month is None else round(savings.usd_per_month, 6),
        "price_note": savings.note,
        "kept": dict(kept), "already_cold": sum(1 for i in p.items if i.action == "skip"),
    }
    if outcome is not None:
        out.update(moved=len(outcome.moved), bytes_moved=outcome.bytes_moved, failed=len(outcome.failed),
                   left_alone=len(outcome.left_alone))
    return out


def markdown(p: Plan, outcome: Outcome | None = None, max_rows: int | None = None) -> str:
    """The pass as a report: totals, then each group to archive and each kept group with its reason
    (the first ``max_rows`` of them, archive rows first, when given)."""
    s = summary(p, outcome)
    usd = "n/a" if s["usd_per_month_saved"] is None else money(s['usd_per_month_saved'])
    head = "Dry run: nothing moved (a preview; `--apply`, or dry_run off, moves it)" if outcome is None else (
        f"Moved {s['moved']} objects ({human_bytes(s['bytes_moved'])}); {s['failed']} failed, "
        f"{s['left_alone']} left alone")
    lines = [
        f"# Archive {s['store']}", "",
        f"{head}. As of {p.as_of:%Y-%m-%d %H:%M} UTC, stale = not modified for {s['older_than_days']:g} days; "
        f"target class **{s['target_class']}**.", "",
        "| item | value |", "|---|---|",  # words in the header: an empty one draws a blank bar in the UI
        f"| to archive | {s['objects_to_archive']} objects in {s['groups_to_archive']} checkpoints / cache entries |",
        f"| bytes | {human_bytes(s['bytes_to_archive'])} ({s['bytes_to_archive']} B) |",
        f"| saved per month | {usd} |",
        f"| already cold | {s['already_cold']} objects |",
        f"| prices | {s['price_note']} |", "",
    ]
    groups: dict[tuple[str, str, str], list[Item]] = defaultdict(list)
    for i in p.items:
        if i.action != "skip":
            groups[(i.action, i.group, i.reason)].append(i)
    lines += ["| action | checkpoint / cache entry / run | objects | bytes | why |", "|---|---|---|---|---|"]
    rows = sorted(groups.items())
    for (action, group, reason), members in rows[:max_rows]:
        lines.append(f"| {action} | `{group}` | {len(members)} | {human_bytes(sum(m.size for m in members))} | "
                     f"{cut(reason)} |")
    if max_rows is not None and len(rows) > max_rows:
        lines.append(f"\n{len(rows) - max_rows} more rows; `thrifty archive` (a dry run) lists them all.")
    if outcome is not None and outcome.failed:
        lines += ["", "## Failed", ""] + [f"- `{i.key}`: {why}" for i, why in outcome.failed]
    return "\n".join(lines) + "\n"
