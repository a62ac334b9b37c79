"""The search's state: what the store says of each trial (ledger, rung records, summary) and ``sweeps/<name>/state.json``.

The store is the truth: a trial's spend is its run's ledger, its metric at a milestone the ``rung`` record its
job wrote at that epoch, its end the run's summary. ``state.json`` (one atomic put after every decision) adds
what the store cannot say: when the search started, which job each trial was launched for, and the decisions
made, for the leaderboard. A search started again rebuilds its trials from the seed and reads both.
"""

from __future__ import annotations

import time

from pydantic import BaseModel, Field

from thrifty.money.budget import gpu_hours, gpus_per_node, spend_usd
from thrifty.config import ConfigError, RunConfig
from thrifty.money.ledger import read_attempts
from thrifty.runs import RunSummary, finished_summary, read_metrics
from thrifty.storage import NotFound, Store, join_key
from thrifty.sweep.config import SweepConfig
from thrifty.sweep.scheduler import TrialState


class SweepState(BaseModel):
    """``sweeps/<name>/state.json``."""

    name: str
    fingerprint: str  # SweepConfig.fingerprint(): a search resumed under another space is refused
    started_unix: float
    trials: list[TrialState]
    decisions: list[str] = Field(default_factory=list)  # what was launched, pruned, refused and why, in order
    best: int | None = None  # the winning trial's index once the search ended
    ended: bool = False


def state_key(name: str) -> str:
    return join_key("sweeps", name, "state.json")


def save_state(store: Store, state: SweepState) -> None:
    store.put_bytes(state_key(state.name), state.model_dump_json(indent=1).encode())  # one put: old or new, never half


def load_state(store: Store, cfg: SweepConfig, now: float | None = None) -> SweepState:
    """The saved state of this search (its trials extended to max_trials), or a fresh one."""
    fresh = [TrialState(index=i, run_name=cfg.run_name(i), values=cfg.values(i)) for i in range(cfg.max_trials)]
    try:
        saved = SweepState.model_validate_json(store.get_bytes(state_key(cfg.name)))
    except NotFound:
        return SweepState(name=cfg.name, fingerprint=cfg.fingerprint(), started_unix=now or time.time(), trials=fresh)
    if saved.fingerprint != cfg.fingerprint():
        raise ConfigError(f"sweep {cfg.name!r} in {cfg.base.store} was started with another base, space, seed, metric "
                          "or rungs; its trials would not be the ones this config draws. Use a new name for a new "
                          "search, or restore the config it was started with.")
    kept = {t.index: t for t in saved.trials}
    trials = [kept.get(i, fresh[i]) for i in range(cfg.max_trials)] + [t for t in saved.trials if t.index >= cfg.max_trials]
    for t in trials:
        if t.status == "running":  # the search was killed while this job ran: it resumes from its checkpoint
            t.status = "paused"  # (its cap is kept until the flow has seen the job gone)
        elif t.status == "out_of_budget":  # refused for money last time: a start with larger caps tries again
            t.status, t.note = ("paused" if t.reached else "pending"), ""
    return saved.model_copy(update={"trials": trials, "ended": False})


def rung_metrics(records: list[dict], metric: str) -> dict[int, float]:
    """The metric at each milestone, from the ``rung`` records the trial's jobs wrote when they stopped there."""
    return {int(r["epoch"]): float(r[metric]) for r in records
            if r.get("event") == "rung" and r.get("epoch") is not None and r.get(metric) is not None}


def epoch_hours(records: list[dict], run_cfg: RunConfig) -> float:
    """How long one more epoch of this trial takes at the speed its jobs measured (training steps, no start-up)."""
    steps = sorted(float(r["step_time_s"]) for r in records if r.get("event") is None and r.get("step_time_s"))
    start = next((r for r in records if r.get("event") == "start" and r.get("train_examples")), None)
    if not steps or start is None:
        return 0.0
    per_epoch = run_cfg.train.steps_per_epoch(int(start["train_examples"]), int(start.get("world_size") or 1))
    return steps[len(steps) // 2] * per_epoch / 3600.0


def finished_score(summary: RunSummary, metric: str) -> tuple[float | None, int | None]:
    """What a finished trial is ranked by, and the step of the weights that scored it (its gold): the run's best
    when ``metric`` is the one early stopping watched (saved at its step), else its last evaluation (of the final
    weights, saved at the end)."""
    best = summary.best_metric
    if best.name == metric and best.value is not None:
        return best.value, best.checkpoint_step
    value = summary.final_metrics.get(metric)
    return value, summary.steps if value is not None else None


def rung_step(records: list[dict], epochs: int) -> int | None:
    """The step a trial's job stopped at for the milestone ``epochs`` (its rung record), whose weights scored it."""
    return next((int(r["step"]) for r in reversed(records) if r.get("event") == "rung" and r.get("epoch") == epochs
                 and r.get("step") is not None), None)


def observe(store: Store, cfg: SweepConfig, trial: TrialState, now: float | None = None) -> None:
    """Bring ``trial``'s money and results up to date from its run in the store (never the other way round)."""
    now = time.time() if now is None else now
    run_cfg = cfg.trial(trial.index)
    attempts = read_attempts(store, trial.run_name, now)
    trial.spent_usd = spend_usd(attempts, now)
    trial.gpu_hours = gpu_hours(attempts, gpus_per_node(run_cfg), now)
    trial.billed_hours = sum(a.hours(now) * a.nodes for a in attempts)
    metric = cfg.rank_metric
    records = read_metrics(store, trial.run_name)
    trial.metrics.update(rung_metrics(records, metric))
    if attempts:
        trial.epoch_hours = epoch_hours(records, run_cfg)
        trial.epoch_usd = trial.epoch_hours * attempts[-1].usd_per_hour * attempts[-1].nodes
    if trial.metrics and max(trial.metrics) > trial.reached:
        trial.reached, trial.milestone_usd = max(trial.metrics), trial.spent_usd
    if trial.status != "running" and trial.target is not None and trial.reached >= trial.target:
        trial.target, trial.cap_stops = None, 0  # its job ended at its milestone (or a killed search's did): afresh
    summary = finished_summary(store, trial.run_name, run_cfg.training_fingerprint())
    if summary is None:
        return
    trial.result, trial.result_step = finished_score(summary, metric)
    if not summary.stopped_early:  # trained to max_epochs: its last evaluation is that epoch's
        final = summary.final_metrics.get(metric)
        if final is not None:
            trial.metrics[cfg.full_epochs] = float(final)
        trial.reached = max(trial.reached, cfg.full_epochs)
    else:  # stopped early inside an epoch range: the epochs it trained (no milestone evaluation of its own)
        trial.reached = max(trial.reached, int(summary.epochs + 1e-9))
    if trial.status != "running":
        trial.status = "finished"
        trial.note = f"{summary.status} at step {summary.steps} ({summary.epochs:g} epochs)"
