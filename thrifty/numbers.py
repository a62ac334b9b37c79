"""How numbers and notes read wherever people see them (run page, artifacts, `thrifty report`, notifications).

One helper per kind: dollars and metrics to 4 significant digits (``$0.0036``, not ``$0.00359952``; ``0.1297``, not
``0.12968158553818807``), shares as whole percents, a missing value as ``-`` (never ``None``), mappings as
``k=v, k=v`` (never a dict's repr), and notes cut to fit a table column. Imports nothing of the project, so every
layer may use it.
"""

from __future__ import annotations

import math
from typing import Any, Mapping

SIGNIFICANT = 4
MISSING = "-"


def _significant(v: float, digits: int = SIGNIFICANT) -> str:
    """``v`` to ``digits`` significant digits in plain notation (no exponent), trailing zeros trimmed to cents."""
    if v == 0 or not math.isfinite(v):
        return "0.00" if v == 0 else str(v)
    decimals = max(2, digits - 1 - math.floor(math.log10(abs(v))))
    text = f"{v:.{decimals}f}"
    whole, _, frac = text.partition(".")
    frac = frac.rstrip("0").ljust(2, "0")  # "0.003600" -> "0.0036", "1.500" -> "1.50": reads as money
    text = f"{whole}.{frac}"
    return "0.00" if float(text) == 0 else text  # never "-0.00"


def amount(v: float | None) -> str:
    """Dollars without the sign, for a table's ``$`` column: ``0.0036``, ``12.35``, ``1234.57``."""
    return MISSING if v is None else _significant(float(v))


def rounded(v: float) -> float:
    """Dollars as a number a table shows (a table artifact's cells): 4 significant digits, ``0.0001181``."""
    return float(_significant(float(v)))


def money(v: float | None) -> str:
    """Dollars as people read them: ``$0.0036``, ``$1.50``, ``-$0.012``."""
    if v is None:
        return MISSING
    text = amount(v)
    return f"-${text[1:]}" if text.startswith("-") else f"${text}"


def metric(v: Any) -> str:
    """A loss or score to 4 significant digits (``0.1297``); a missing one is ``-``."""
    if v is None:
        return MISSING
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return str(v)
    if isinstance(v, int):
        return str(v)
    if not math.isfinite(v):
        return str(v)
    return f"{v:.0f}" if abs(v) >= 10 ** SIGNIFICANT else f"{v:.{SIGNIFICANT}g}"  # no exponent for a large loss


def share(fraction: float | None) -> str:
    """A fraction as a whole percent: ``70%``."""
    return MISSING if fraction is None else f"{fraction:.0%}"


def hours(h: float | None) -> str:
    """A span of time that never rounds a real one to nothing: ``2.5 h``, ``12.0 min``, ``40 s``, ``0.5 s``."""
    if h is None:
        return MISSING
    seconds = h * 3600
    if h >= 1:
        return f"{h:.1f} h"
    if seconds >= 60:
        return f"{seconds / 60:.1f} min"
    return f"{seconds:.0f} s" if seconds >= 10 else f"{seconds:.2g} s"


def pairs(values: Mapping[str, Any] | None, sep: str = "=") -> str:
    """A mapping as ``k=v, k=v`` (metrics to 4 digits), never a dict's repr; empty is ``-``."""
    if not values:
        return MISSING
    return ", ".join(f"{k}{sep}{metric(v)}" for k, v in values.items())


NOTE_WIDTH = 60  # a table's free-text column ("why", "note", "assumed") past this makes the UI scroll sideways


def cut(text: str | None, width: int = NOTE_WIDTH) -> str:
    """A note shortened to fit a table column: whole words, then '…'."""
    if not text:
        return MISSING
    text = " ".join(str(text).split())
    if len(text) <= width:
        return text
    head = text[: width - 1].rsplit(" ", 1)[0].rstrip(",;:")
    return f"{head}…"
