"""A team's view of the store's runs: a month's spend and savings per cost allocation tag and per lever.

Pure functions of the runs' savings figures (``thrifty.money.savings.read_all``): every figure here is a sum of
per-run figures the runs' own reports show, so the team's totals and a run's page never disagree. Shown by
``thrifty report --by KEY``, ``--levers`` and ``--month YYYY-MM``, and by the ``thrifty-savings-by-tag`` and
``thrifty-levers`` artifacts every run's end refreshes.
"""

from __future__ import annotations

import datetime as dt
import re
from typing import Any

from thrifty.config import ConfigError
from thrifty.numbers import amount, rounded
from thrifty.money.savings import SavingsReport

UNTAGGED = "(untagged)"
# what each lever makes cheaper: time (fewer instance-hours) or only the price of the same hours
# short: a cell past about 30 characters makes the UI's table scroll sideways
LEVER_WORDS = {"spot": "spot, not on-demand", "precision": "mixed precision, not fp32",
               "cache": "preprocessing cache", "warm_start": "warm start, not from scratch",
               "early_stopping": "early stop (not in the total)"}


def month_of(unix: float | None) -> str | None:
    return dt.datetime.fromtimestamp(unix, dt.timezone.utc).strftime("%Y-%m") if unix is not None else None


def check_month(month: str) -> str:
    if not re.fullmatch(r"\d{4}-(0[1-9]|1[0-2])", month):
        raise ConfigError(f"--month takes a month as YYYY-MM (e.g. 2026-11), not {month!r}")
    return month


def in_month(all_figures: list[SavingsReport], month: str | None) -> list[SavingsReport]:
    """The runs that started in ``month`` (UTC, YYYY-MM); all of them when None."""
    return [f for f in all_figures if month is None or month_of(f.started_unix) == month]


def by_tag(all_figures: list[SavingsReport], key: str) -> list[dict[str, Any]]:
    """One row per value of tag ``key`` (runs without it under "(untagged)"), most spent first."""
    groups: dict[str, list[SavingsReport]] = {}
    for f in all_figures:
        groups.setdefault(f.tags.get(key, UNTAGGED), []).append(f)
    rows = []
    for value, runs in groups.items():
        spent, naive = sum(f.actual_usd for f in runs), sum(f.naive_usd for f in runs)
        rows.append({key: value, "runs": len(runs), "spent $": rounded(spent), "naive $": rounded(naive),
                     "saved $": rounded(naive - spent), "saved": f"{(naive - spent) / naive:.0%}" if naive else "0%"})
    return sorted(rows, key=lambda r: -r["spent $"])


def _rates(f: SavingsReport) -> tuple[float, float]:
    """The run's $/instance-hour on-demand (what time levers are priced at) and as paid (early stopping's rate)."""
    hours = f.instance_hours or 0.0
    return (f.on_demand_usd / hours if hours else 0.0), (f.actual_usd / hours if hours else 0.0)


def levers(all_figures: list[SavingsReport]) -> list[dict[str, Any]]:
    """Per lever, across the runs: dollars saved and instance-hours not spent (a lever priced at on-demand rates
    saved lever $ / that rate; spot saves price, not time), with how many runs it counted in and how many of them
    priced it from an assumption."""
    totals: dict[str, dict[str, Any]] = {}

    def add(lever: str, usd: float, hours: float, assumed: bool) -> None:
        row = totals.setdefault(lever, {"lever": lever, "what": LEVER_WORDS.get(lever, lever), "saved $": 0.0,
                                        "hours saved": 0.0, "runs": 0, "assumed in": 0})
        row["saved $"] += usd
        row["hours saved"] += hours
        row["runs"] += 1
        row["assumed in"] += int(assumed)

    for f in all_figures:
        od_rate, paid_rate = _rates(f)
        for lever, usd in f.levers_usd.items():
            hours = 0.0 if lever == "spot" or not od_rate else usd / od_rate
            add(lever, usd, hours, f.lever_basis.get(lever, "").startswith("assumed"))
        if f.early_stop is not None:
            add("early_stopping", f.early_stop.usd, f.early_stop.usd / paid_rate if paid_rate else 0.0, False)
    rows = sorted(totals.values(), key=lambda r: -r["saved $"])
    for r in rows:
        r["saved $"] = rounded(r["saved $"])
        r["hours saved"] = round(r["hours saved"], 4)
    return rows


def markdown(title: str, rows: list[dict[str, Any]]) -> str:
    """A small markdown table (the artifacts' form)."""
    if not rows:
        return f"### {title}\n\n_no runs with spend yet_\n"
    head = list(rows[0])
    lines = [f"### {title}", "", "| " + " | ".join(head) + " |", "|" + "|".join("---" for _ in head) + "|"]
    lines += ["| " + " | ".join(amount(v) if isinstance(v, float) else str(v) for v in r.values()) + " |" for r in rows]
    return "\n".join(lines) + "\n"
