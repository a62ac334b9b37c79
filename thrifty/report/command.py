"""`thrifty report`: the store's runs and what they spent and saved, printed as the savings artifacts show them.

The cross-run table (one row per run that spent money, whatever its end, and the totals), or a team's views of one
month (``--month``): spend and savings per value of a cost allocation tag (``--by team``) and per lever
(``--levers``). Every figure is read from the runs' own savings figures (``thrifty.money.savings``).
"""

from __future__ import annotations

import sys
from typing import Any

from thrifty.config import RunConfig
from thrifty.protocol import EXIT_OK
from thrifty.numbers import amount, money


def _print_table(title: str, rows: list[dict[str, Any]], left: tuple[str, ...]) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title=title)
    for col in rows[0]:
        table.add_column(col, justify="left" if col in left else "right", no_wrap=col in left[:1])
    for row in rows:
        table.add_row(*[amount(v) if isinstance(v, float) else str(v) for v in row.values()])
    Console(width=None if sys.stdout.isatty() else 200).print(table)  # piped or captured: no clipped figures


def report(cfg: RunConfig, by: str | None = None, month: str | None = None, levers: bool = False) -> int:
    from thrifty.money import savings
    from thrifty.money.unwatched import settle_all
    from thrifty.report import figures as figures_text
    from thrifty.report import team
    from thrifty.report.ends import state_name
    from thrifty.storage import open_store

    if month is not None:
        team.check_month(month)  # a bad month is exit 2 before the store is read
    store = open_store(cfg.store)
    for settled in settle_all(store, savings.billed_runs(store)):  # jobs that ended while no flow watched them
        print(settled.describe(), file=sys.stderr)
    all_figures = team.in_month(savings.read_all(store), month)
    when = f" started in {month}" if month else ""
    if not all_figures:
        print(f"no runs with spend{when} in {cfg.store}", file=sys.stderr)
        return EXIT_OK
    total = savings.totals(all_figures)  # the same sums as the artifact's total row
    if by:
        _print_table(f"Spend and savings by {by}{when} in {cfg.store}", team.by_tag(all_figures, by), (by, "saved"))
    if levers:
        _print_table(f"Savings by lever{when} in {cfg.store}", team.levers(all_figures), ("lever", "what"))
    if not by and not levers:
        rows = savings.table(all_figures)
        _print_table(f"Savings in {cfg.store}", [{**r, "state": state_name(r["state"])} for r in rows],
                     ("run", "state", "saved"))
    print(f"total of {total.runs} run(s){when}: spent {money(total.actual_usd)}, {figures_text.NAIVE} "
          f"{money(total.naive_usd)}, saved {money(total.saved_usd)} ({total.saved_fraction:.0%})")
    notes: dict[str, list[str]] = {}
    for f in all_figures:
        for lever, why in figures_text.assumed(f).items():
            notes.setdefault(f"{lever} assumed: {why}", []).append(f.run_id)
    for note, runs in notes.items():
        print(f"{note} (runs {', '.join(runs)})")
    for f in all_figures:
        if line := figures_text.early_stop_line(f):
            print(f"{f.run_id}: {line} (not in the saving above)")
    return EXIT_OK
