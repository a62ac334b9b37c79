"""A run's figures as people read them, from one place: every report, hook, table and CLI line says them with these.

Each function turns one figure (out of the ledger and ``savings.json``: ``thrifty.money.savings``) into the words
every surface uses, so the run page, the notification, ``thrifty report`` and the cross-run table cannot disagree.
"""

from __future__ import annotations

from thrifty.money.budget import spend_usd
from thrifty.money.ledger import read_attempts
from thrifty.money.savings import SavingsReport
from thrifty.storage import Store
from thrifty.numbers import money

NAIVE = "the same work on-demand, in fp32, without the preprocessing cache"


def run_spend_usd(store: Store, run_id: str, now: float | None = None) -> float:
    """What the run has spent: its ledger, every attempt of every job (the one figure every other one starts from)."""
    return spend_usd(read_attempts(store, run_id, now), now)


def assumed(figures: SavingsReport) -> dict[str, str]:
    """The levers priced from an assumption rather than a measurement, each with its factor."""
    return {k: v.removeprefix("assumed: ") for k, v in figures.lever_basis.items() if v.startswith("assumed")}


def assumed_note(figures: SavingsReport) -> str:
    """'precision assumed: fp32 2x slower than bf16 on a GPU', or '' when every lever was measured."""
    return "; ".join(f"{k} assumed: {v}" for k, v in assumed(figures).items())


def headline(figures: SavingsReport) -> str:
    """Spend against the same work done the naive way: 'spent $X; the same work ... $Y: saved $Z (P%)'."""
    note = assumed_note(figures)
    return (f"spent {money(figures.actual_usd)}; {NAIVE}: {money(figures.naive_usd)}, so saved "
            f"{money(figures.saved_usd)} ({figures.saved_fraction:.0%})" + (f" ({note})" if note else ""))


def early_stop_line(figures: SavingsReport) -> str | None:
    """Early stopping's own line (never in the headline), or None when the run did not stop early."""
    return figures.early_stop.line() if figures.early_stop is not None else None


def lever_rows(figures: SavingsReport) -> list[tuple[str, float, str]]:
    """(lever, dollars saved, how it was priced: measured, or assumed with its factor), the headline's parts."""
    return [(k, v, figures.lever_basis.get(k, "")) for k, v in figures.levers_usd.items()]
