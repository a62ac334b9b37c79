"""Jobs that ended while no one watched them: their ledger rows closed by the next look at the run.

A watch loop that dies (its flow run killed or crashed, the worker's machine gone) leaves its job's last ledger
row open; the job may train on and end by itself (finished, stopped at its cap, failed). Its node's meter
records say when and how. :func:`settle` writes that end into the job's ledger file, as its watcher would have,
so the ledger says what was billed and the run is not taken for running; the caller (a rerun of the run,
``thrifty report``) says so. A job whose watcher lives (the run's lease, live, names it) is never touched, and
nor is one whose node has not said it ended (still billing, or silent: a record it could not put may come).
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from thrifty.money.ledger import METER_STALE_S, Attempt, ledger_rows, read_meters, reconcile, write_job_attempts
from thrifty.money.meter_local import flush
from thrifty.runs import lease, read_summary
from thrifty.storage import Store
from thrifty.numbers import money

# a node's word for its end, as a watcher writes it in the ledger
END_REASONS = {"finished": "succeeded", "budget": "budget", "signal": "cancelled", "error": "failed"}


@dataclass(frozen=True)
class Settled:
    """One job's ledger row closed from its node's records."""

    run_id: str
    attempt: Attempt
    finished: bool  # the run's summary says training finished

    def describe(self) -> str:
        a = self.attempt
        how = "finished training" if self.finished and a.end_reason == "succeeded" else f"ended ({a.end_reason})"
        ended = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(a.ended_unix or 0.0))
        return (f"job {a.job_id} of run {self.run_id} {how} at {ended} while no flow run watched it (its watcher "
                f"died); its ledger row is closed now: attempt {a.number}, {a.hours() * 60:.1f} min, "
                f"{money(a.cost_usd())}")


def settle(store: Store, run_id: str, now: float | None = None) -> list[Settled]:
    """Close the open ledger rows of ``run_id`` whose jobs have ended unwatched (see the module docstring)."""
    now = time.time() if now is None else now
    flush(store, run_id)  # records nodes of this machine could not put while the store was down
    rows = ledger_rows(store, run_id)
    open_jobs = sorted({a.job_id for a in rows if a.ended_unix is None})
    if not open_jobs:
        return []
    held = lease.read(store, run_id)
    watched = held.job_id if held is not None and held.live(now) else None
    meters = read_meters(store, run_id)
    reconciled = reconcile(rows, meters, now)
    try:
        summary = read_summary(store, run_id)
    except ValueError:
        summary = None
    out = []
    for job in open_jobs:
        opened = next(a for a in rows if a.job_id == job and a.ended_unix is None)
        nodes = [m for m in meters if m.job_id == job and m.started_unix >= opened.started_unix - METER_STALE_S]
        if job == watched or not nodes or any(m.ended_unix is None for m in nodes):
            continue  # its watcher lives, or its node has not said it ended (billing, or silent: kept open)
        mine = [a for a in reconciled if a.job_id == job]
        for a in mine:
            a.end_reason = END_REASONS.get(a.end_reason or "", a.end_reason)
        write_job_attempts(store, run_id, job, mine)
        finished = summary is not None and (summary.status in ("completed", "stopped_early"))
        out.append(Settled(run_id, mine[-1], finished))
    return out


def settle_all(store: Store, run_ids: list[str]) -> list[Settled]:
    return [s for run_id in run_ids for s in settle(store, run_id)]
