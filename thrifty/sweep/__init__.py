"""A hyperparameter search that cannot blow its budget: successive halving over RunConfig fields under hard caps.

``config`` (SweepConfig, built and validated whole), ``space`` (the fields and how each is drawn, seeded),
``scheduler`` (asynchronous successive halving: who trains to which milestone next), ``caps`` (dollars,
GPU-hours and the wall clock as arithmetic over the trials' ledgers), ``state`` (what the store says of each
trial, and ``sweeps/<name>/state.json``), ``report`` (leaderboard, saving, chart). No Prefect, no torch: the
``thrifty-sweep`` flow (flows/sweep.py) runs it, each trial a ``thrifty-train`` child flow run.
"""

from thrifty.sweep.caps import Need, committed_usd, measured_per_epoch, need_for, refusal
from thrifty.sweep.config import SweepConfig, build_sweep
from thrifty.sweep.scheduler import TrialState, best_trial, leader, next_job, settle
from thrifty.sweep.state import SweepState, load_state, observe, save_state, state_key

__all__ = [
    "Need", "SweepConfig", "SweepState", "TrialState", "best_trial", "build_sweep", "committed_usd", "leader",
    "load_state", "measured_per_epoch", "need_for", "next_job", "observe", "refusal", "save_state", "settle",
    "state_key",
]
