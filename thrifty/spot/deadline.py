"""Deadline-aware spot (Wu et al., "Can't Be Late", NSDI '24): which market a run with a deadline should be on now.

Pure: a state in (work left, time left, what a move costs, where the job is, whether spot capacity is there), a market
out. The watch loop (``tasks/deadline.py``) and ``thrifty simulate --deadline-h`` (``deadline_sim``) ask the same
function, the simulator for hundreds of start points at once (``wants_on_demand`` works on numbers and numpy arrays
alike).

- ``slack`` = time left - work left: how long the job may still make no progress and finish on time on on-demand.
- A *changeover* (stop with a checkpoint, start-up, resume) costs ``changeover_s`` of billed time without progress.
- The *safety net*: off on-demand, once slack falls to one changeover + the gap to the next decision + a safety
  margin, the job moves to on-demand: a preemption or an empty spot market later could leave too little to move.
- ``greedy`` (the baseline): spot while the slack lasts, waiting through outages; the safety net moves it to
  on-demand for good.
- ``uniform_progress``: keep progress on the line work x elapsed / deadline. Spot whenever there is capacity; with
  none, wait while ahead of the line, move to on-demand once behind it; leave on-demand for spot only when ahead of
  the line by the hysteresis margin and the slack still holds a changeover there and one back (no flapping).
- ``on_demand``: on-demand throughout.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Literal, get_args

import numpy as np

Policy = Literal["uniform_progress", "greedy", "on_demand"]
POLICIES: tuple[str, ...] = get_args(Policy)
Market = Literal["spot", "on_demand"]  # spot: a spot job, running or waiting for capacity
MAX_DOUBLINGS = 6  # the hysteresis doubles per fruitless move to spot, at most this often


@dataclass(frozen=True)
class Margins:
    """Kept beyond what a changeover needs. ``safety_s``: slack held back before the safety net (the paper's second
    changeover); ``hysteresis_s``: how far ahead of the uniform line progress must be to leave on-demand for spot."""

    safety_s: float
    hysteresis_s: float

    @classmethod
    def default(cls, changeover_s: float, safety_s: float | None = None,
                hysteresis_s: float | None = None) -> "Margins":
        """One changeover of safety, two of hysteresis, unless given."""
        return cls(changeover_s if safety_s is None else safety_s,
                   2.0 * changeover_s if hysteresis_s is None else hysteresis_s)


@dataclass(frozen=True)
class DeadlineState:
    """Where a run with a deadline stands, in seconds (work in seconds of compute at the measured speed)."""

    elapsed_s: float  # since the deadline's clock started (the run's launch)
    deadline_s: float  # launch to deadline
    work_s: float  # compute the run needed at launch
    done_s: float  # compute done since launch
    market: Market
    spot_available: bool | None  # None: unknown (an on-demand job sees no spot market; trying tells)
    changeover_s: float
    gap_s: float = 0.0  # until the next decision: the most slack that can go before it is looked at again
    misses: int = 0  # moves to spot in a row that found no capacity before the job had to come back

    @property
    def left_s(self) -> float:
        return max(0.0, self.work_s - self.done_s)

    @property
    def slack_s(self) -> float:
        return (self.deadline_s - self.elapsed_s) - self.left_s

    @property
    def ahead_s(self) -> float:
        """Progress past the uniform line (negative: behind it)."""
        return self.done_s - uniform_line(self.work_s, self.elapsed_s, self.deadline_s)


@dataclass(frozen=True)
class Decision:
    market: Market
    reason: str
    safety_net: bool = False  # the move is the safety net's (the deadline would be at risk otherwise)


def uniform_line(work_s: Any, elapsed_s: Any, deadline_s: Any) -> Any:
    """Progress on the uniform line: the work spread evenly over the time to the deadline."""
    return work_s * np.minimum(1.0, elapsed_s / deadline_s)


def safety_net_s(changeover_s: Any, gap_s: Any, margins: Margins) -> Any:
    """The slack at which a job off on-demand must move there: one changeover, one decision gap, the margin."""
    return changeover_s + gap_s + margins.safety_s


def hysteresis_s(margins: Margins, misses: Any) -> Any:
    """The lead over the uniform line that lets a job leave on-demand: the margin, doubled for each move to spot in a
    row that found no capacity (an on-demand job cannot see the spot market, so an empty one costs a changeover)."""
    return margins.hysteresis_s * 2.0 ** np.minimum(misses, MAX_DOUBLINGS)


def wants_on_demand(policy: str, on_demand: Any, elapsed_s: Any, deadline_s: Any, work_s: Any, done_s: Any,
                    spot_maybe: Any, changeover_s: Any, gap_s: Any, margins: Margins, misses: Any = 0) -> Any:
    """True where the job should be on on-demand now. ``spot_maybe``: spot capacity is there, or unknown (on
    on-demand, where only trying tells). Numbers or numpy arrays (one entry per simulated start)."""
    if policy == "on_demand":
        return np.ones_like(np.asarray(on_demand), dtype=bool)
    slack = (deadline_s - elapsed_s) - np.maximum(0.0, work_s - done_s)
    net = slack < safety_net_s(changeover_s, gap_s, margins)
    if policy == "greedy":
        return on_demand | net
    if policy != "uniform_progress":
        raise ValueError(f"unknown deadline policy {policy!r}; use one of {', '.join(POLICIES)}")
    ahead = done_s - uniform_line(work_s, elapsed_s, deadline_s)
    # leaving costs a changeover to spot and, should spot go, one back: the slack must hold both, a gap each, the margin
    roomy = slack - changeover_s >= safety_net_s(changeover_s, gap_s, margins) + gap_s
    leave = spot_maybe & (ahead >= hysteresis_s(margins, misses)) & roomy
    enter = net | (~np.asarray(spot_maybe, dtype=bool) & (ahead < 0))
    return np.where(on_demand, ~leave, enter)


def decide(policy: str, state: DeadlineState, margins: Margins) -> Decision:
    """The market ``policy`` wants for ``state``, and why in words (what the log and the switch event say)."""
    s = state
    on_od = s.market == "on_demand"
    maybe = True if s.spot_available is None else s.spot_available
    want = bool(wants_on_demand(policy, on_od, s.elapsed_s, s.deadline_s, s.work_s, s.done_s, maybe,
                                s.changeover_s, s.gap_s, margins, s.misses))
    market: Market = "on_demand" if want else "spot"
    net = safety_net_s(s.changeover_s, s.gap_s, margins)
    where = (f"{_h(s.left_s)} of work left, {_h(s.deadline_s - s.elapsed_s)} to the deadline, slack {_h(s.slack_s)}, "
             f"{'ahead of' if s.ahead_s >= 0 else 'behind'} the uniform line by {_h(abs(s.ahead_s))}")
    if policy == "on_demand":
        return Decision(market, "deadline_policy on_demand: on-demand throughout")
    if want and not on_od and s.slack_s < net:
        late = (f"; even on-demand finishes {_h(s.changeover_s - s.slack_s)} late"
                if s.slack_s < s.changeover_s else "")
        return Decision(market, f"safety net: slack {_h(s.slack_s)} is down to a changeover ({_h(s.changeover_s)}) "
                                f"+ margin ({_h(net - s.changeover_s)}); {where}{late}", safety_net=True)
    if want and not on_od:
        return Decision(market, f"no spot capacity and behind the uniform line: {where}")
    if not want and on_od:
        return Decision(market, f"back to spot: {where} (hysteresis {_h(float(hysteresis_s(margins, s.misses)))}), "
                                "slack for a changeover there and back")
    return Decision(market, f"stay on {market.replace('_', '-')}: {where}")


def _h(seconds: float) -> str:
    if not math.isfinite(seconds):
        return str(seconds)
    a = abs(seconds)
    text = f"{a:.0f} s" if a < 120 else f"{a / 60:.1f} min" if a < 7200 else f"{a / 3600:.2f} h"
    return f"-{text}" if seconds < 0 else text
