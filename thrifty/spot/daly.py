"""Young/Daly: the checkpoint interval that minimises expected wall time, and that expected time, in closed form.

One owner for both formulas: the training loop's ``checkpoint_every: auto`` plans with
:func:`daly_interval_s`, ``thrifty simulate`` checks its Monte Carlo against :func:`daly_expected_wall_s`.
J. T. Daly, "A higher order estimate of the optimum checkpoint interval for restart dumps",
Future Generation Computer Systems 22 (2006) 303-312.
"""

from __future__ import annotations

import math


def daly_interval_s(save_s: float, mtbf_s: float) -> float:
    """Daly (2006) optimum compute time between checkpoints for save cost ``save_s`` and MTBF ``mtbf_s``."""
    if save_s >= 2 * mtbf_s:
        return mtbf_s
    r = save_s / (2 * mtbf_s)
    return math.sqrt(2 * save_s * mtbf_s) * (1 + math.sqrt(r) / 3 + r / 9) - save_s


def daly_expected_wall_s(work_s: float, interval_s: float, save_s: float, restart_s: float, mtbf_s: float) -> float:
    """Expected wall time to finish ``work_s`` of compute, a checkpoint (``save_s``) after every ``interval_s`` of it
    and after the last piece, under exponential failures of mean ``mtbf_s``; each failure costs ``restart_s`` before
    work resumes from the last checkpoint, and failures strike during saves and restarts too (Daly 2006, eq. 13:
    T_w = M e^(R/M) (e^((tau+delta)/M) - 1) T_s / tau). A last piece shorter than ``interval_s`` is priced as its
    own segment, so the result is exact for any ``work_s``, not only for multiples of ``interval_s``.
    """
    if min(work_s, interval_s, mtbf_s) <= 0 or min(save_s, restart_s) < 0:
        raise ValueError("work, interval and MTBF must be positive; save and restart times not negative")
    full, last = divmod(work_s, interval_s)
    per_segment = lambda length: mtbf_s * math.exp(restart_s / mtbf_s) * math.expm1((length + save_s) / mtbf_s)  # noqa: E731
    try:
        return full * per_segment(interval_s) + (per_segment(last) if last > 1e-9 * interval_s else 0.0)
    except OverflowError:  # a segment or restart hundreds of times the MTBF: it never finishes
        return math.inf
