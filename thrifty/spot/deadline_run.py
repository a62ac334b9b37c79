"""A run under a deadline as the watch loop keeps it: its record in the store, the config of each market, and what the
run measured (its speed, what a changeover takes). Pure but for the record's read and write.

``runs/<run_id>/deadline.json``: the deadline's clock (started, due), the policy, the step the run started from and
its length, every job with its market, and every move between the markets with why. A watcher that re-attaches to
the run's live job reads it back, so the clock does not restart; the report reads it to say whether the deadline was
met and what each market cost.
"""

from __future__ import annotations

import statistics
from typing import Any

from pydantic import BaseModel, ConfigDict, ValidationError

from thrifty.config import RunConfig
from thrifty.money.ledger import Attempt
from thrifty.runs import run_key
from thrifty.spot.deadline import Market
from thrifty.storage import NotFound, Store

DEADLINE_KEY = "deadline.json"


def deadline_moves(cfg: RunConfig) -> bool:
    """A deadline with spot: the watch loop's deadline policy decides the market (``compute.deadline_policy``)."""
    return cfg.compute.deadline_h is not None and cfg.compute.use_spot


def market_config(cfg: RunConfig, market: Market) -> RunConfig:
    """The config of the job on ``market``: a spot job without an on-demand fallback of its own (the policy decides
    when to leave spot), or an on-demand job."""
    compute = cfg.compute.model_dump(mode="json")
    if market == "spot":
        compute.update(use_spot=True, on_demand_fallback=False)
    else:
        compute.update(use_spot=False)
    return cfg.updated({"compute": compute}, f"the deadline policy's {market.replace('_', '-')} job")


class _Model(BaseModel):
    model_config = ConfigDict(frozen=True, extra="ignore")


class DeadlineJobEntry(_Model):
    job_id: str
    market: Market
    submitted_unix: float


class Move(_Model):
    """One move between the markets."""

    at_unix: float  # when it was decided (the old job was told to stop then)
    from_market: Market
    to_market: Market
    from_job: str
    to_job: str | None = None  # None until the new job was submitted
    step: int | None = None  # progress when it was decided
    reason: str = ""
    safety_net: bool = False


class DeadlineRecord(_Model):
    policy: str
    started_unix: float
    deadline_unix: float
    steps_at_start: int = 0
    jobs: tuple[DeadlineJobEntry, ...] = ()
    moves: tuple[Move, ...] = ()

    def market_of(self, job_id: str) -> Market | None:
        return next((j.market for j in self.jobs if j.job_id == job_id), None)

    def with_job(self, job_id: str, market: Market, now: float) -> "DeadlineRecord":
        return self.model_copy(update={"jobs": self.jobs + (DeadlineJobEntry(job_id=job_id, market=market,
                                                                             submitted_unix=now),)})

    def with_move(self, move: Move) -> "DeadlineRecord":
        return self.model_copy(update={"moves": self.moves + (move,)})


def read_record(store: Store, run_id: str) -> DeadlineRecord | None:
    try:
        return DeadlineRecord.model_validate_json(store.get_bytes(run_key(run_id, DEADLINE_KEY)))
    except (NotFound, ValidationError, ValueError):
        return None


def write_record(store: Store, run_id: str, record: DeadlineRecord) -> None:
    store.put_bytes(run_key(run_id, DEADLINE_KEY), record.model_dump_json(indent=1).encode())


# ---------------------------------------------------------------- what the run measured


def _steps(records: list[dict[str, Any]]) -> list[tuple[float, int]]:
    return [(float(r["time_unix"]), int(r["step"])) for r in records
            if r.get("event") is None and "loss" in r and "step" in r and "time_unix" in r]


def measured_step_s(records: list[dict[str, Any]]) -> float | None:
    """Wall seconds per step of progress over the newest attempt's step lines (evaluations, checkpoints and data
    waits included: what the deadline sees), once it has logged twice."""
    starts = [i for i, r in enumerate(records) if r.get("event") == "start"]
    lines = _steps(records[starts[-1]:] if starts else records)
    if len(lines) < 2 or lines[-1][1] <= lines[0][1] or lines[-1][0] <= lines[0][0]:
        return None
    return (lines[-1][0] - lines[0][0]) / (lines[-1][1] - lines[0][1])


def startup_s(attempts: list[Attempt], records: list[dict[str, Any]]) -> float | None:
    """The longest an attempt took from its start (billed) to its first step line after resuming: start-up and
    resume, as measured; None before any attempt trained."""
    lines = _steps(records)
    seen = []
    for a in attempts:
        first = next((t for t, _ in lines if t >= a.started_unix and (a.ended_unix is None or t <= a.ended_unix)), None)
        if first is not None:
            seen.append(first - a.started_unix)
    return max(seen) if seen else None


def save_s(records: list[dict[str, Any]]) -> float:
    """What a checkpoint held training for (the median of the run's): a stop's save."""
    saves = [float(r.get("block_s", r.get("save_s", 0.0))) for r in records if r.get("event") == "checkpoint"]
    return statistics.median(saves) if saves else 0.0


def changeover_s(cfg: RunConfig, estimated_startup_s: float, attempts: list[Attempt],
                 records: list[dict[str, Any]]) -> tuple[float, str]:
    """What a move between the markets costs in time without progress, and where the figure comes from: the config,
    else a stop's save + start-up and resume as measured (never below the estimate's start-up)."""
    if cfg.compute.deadline_changeover_s is not None:
        return cfg.compute.deadline_changeover_s, "compute.deadline_changeover_s"
    seen = startup_s(attempts, records)
    start = max(estimated_startup_s, seen or 0.0)
    how = f"measured start-up and resume {seen:.1f} s" if seen is not None else f"estimated start-up {start:g} s"
    save = save_s(records)
    return start + save, how + (f" + a checkpoint {save:.2f} s" if save else "")


def market_split(attempts: list[Attempt], now: float | None = None) -> dict[str, tuple[float, float]]:
    """Hours and dollars on each market: {"spot": (h, usd), "on_demand": (h, usd)}."""
    out = {"spot": (0.0, 0.0), "on_demand": (0.0, 0.0)}
    for a in attempts:
        key = "spot" if a.spot else "on_demand"
        h, usd = out[key]
        out[key] = (h + a.hours(now), usd + a.cost_usd(now))
    return out


def describe(record: DeadlineRecord, finished_unix: float | None) -> str:
    """One line for the report: the deadline, met or not, and the moves."""
    due_h = (record.deadline_unix - record.started_unix) / 3600.0
    if finished_unix is None:
        when = "not finished"
    else:
        took = (finished_unix - record.started_unix) / 3600.0
        margin = (record.deadline_unix - finished_unix) / 60.0
        when = (f"finished in {took * 60:.1f} min, {margin:.1f} min before it" if margin >= 0 else
                f"finished in {took * 60:.1f} min, {-margin:.1f} min LATE")
    moves = ", ".join(f"{m.from_market.replace('_', '-')} -> {m.to_market.replace('_', '-')}"
                      + (" (safety net)" if m.safety_net else "") for m in record.moves) or "none"
    return f"{due_h * 60:.1f} min ({record.policy}): {when}; moves: {moves}"
