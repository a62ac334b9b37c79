"""The flags of ``thrifty simulate`` that only its deadline mode (``--deadline-h``) reads: imports nothing heavy, so
``thrifty --help`` stays quick. ``deadline_inputs`` reads them."""

from __future__ import annotations

from typing import Any

POLICY_CHOICES = ("uniform_progress", "greedy", "on_demand")  # thrifty.spot.deadline.POLICIES (a test keeps them equal)
DEFAULT_CHANGEOVER_S = 300.0  # thrifty.spot.simulate_inputs.DEFAULT_RESTART_S
SYNTHETIC_TICK_S = 600.0  # thrifty.spot.traces.SYNTHETIC_TICK_S


def add_options(p: Any) -> None:
    """The flags of ``thrifty simulate`` that only the deadline mode reads."""
    p.add_argument("--deadline-h", type=float, metavar="H", help="simulate a run with this deadline (hours from its "
                   "launch) under the deadline policies, over availability traces, instead of checkpoint intervals")
    p.add_argument("--policy", choices=[*POLICY_CHOICES, "all"], default="all",
                   help="with --deadline-h: the policy to replay (default all, side by side)")
    p.add_argument("--work-h", type=float, metavar="H",
                   help="with --deadline-h: the compute the run needs (default --steps x --step-s, or measured)")
    p.add_argument("--changeover-s", type=float, metavar="S", help="with --deadline-h: seconds a move between spot "
                   f"and on-demand (or a restart) takes without progress (default compute.deadline_changeover_s, "
                   f"else {DEFAULT_CHANGEOVER_S:g})")
    p.add_argument("--trace", action="append", metavar="FILE", help="with --deadline-h: an availability trace in "
                   "the public format (repeatable); default: synthetic ones from the shipped statistics of each zone "
                   "of the instance")
    p.add_argument("--trace-hours", type=float, default=2000.0, help="with --deadline-h: length of each synthetic "
                   "trace (default 2000)")
    p.add_argument("--tick-s", type=float, default=SYNTHETIC_TICK_S, help="with --deadline-h: tick of the synthetic "
                   f"traces, also the decision gap (default {SYNTHETIC_TICK_S:g}, the traces' probe interval)")
    p.add_argument("--starts", type=int, default=300, help="with --deadline-h: start points per trace (default 300)")
    p.add_argument("--spot-visible", action="store_true", help="with --deadline-h: let an on-demand job see the spot "
                   "market (the paper's assumption; the watch loop learns it only by going there)")
