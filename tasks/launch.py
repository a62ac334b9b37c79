"""Launch the training job and watch it to the end: progress, one ledger row per attempt, graceful cancel.

Never retried by Prefect: a retry rents another machine. Recovery after preemption is the launcher's job.
"""

from __future__ import annotations

import time
from typing import Any

from prefect import get_run_logger, task
from prefect.artifacts import create_progress_artifact, update_progress_artifact

from tasks.alerts import BudgetGuard
from thrifty.budget import BudgetExceeded, spend_usd
from thrifty.config import RunConfig
from thrifty.launchers import JobState, LaunchError, make_launcher
from thrifty.results import JobOutcome
from thrifty.runs import Attempt, latest_progress, read_attempts, read_metrics, read_summary, write_attempts
from thrifty.storage import open_store


def merge_ledger(previous: list[Attempt], attempts: list[Attempt]) -> list[Attempt]:
    """Earlier jobs' rows unchanged, this job's rows replaced by the latest view of its attempts."""
    mine = {a.job_id for a in attempts}
    return [r for r in previous if r.job_id not in mine] + attempts


def _stop_gracefully(launcher: Any, job_id: str, grace_s: float) -> None:
    """Cancel (SIGTERM: the job checkpoints) and wait for the job to end."""
    launcher.cancel(job_id)
    deadline = time.time() + grace_s + 10
    while not launcher.status(job_id).state.terminal and time.time() < deadline:
        time.sleep(0.2)


@task(name="launch-and-watch", retries=0)
def launch_and_watch(config: RunConfig, poll_s: float = 1.0) -> JobOutcome:
    """Submit the job, poll until it ends, keep the ledger and the budget; returns the outcome and the run summary."""
    logger = get_run_logger()
    store = open_store(config.store)
    run_id = config.run_name
    launcher = make_launcher(config)
    guard = BudgetGuard(config, store, run_id, logger)
    previous_rows = read_attempts(store, run_id)  # the budget is per run: earlier jobs count too
    submitted_unix = time.time()
    job_id = launcher.submit(config)
    logger.info("submitted job %s (%s launcher)", job_id, config.compute.launcher)
    progress_id = create_progress_artifact(0.0, description=f"training progress of run {run_id}")
    last_logged: tuple | None = None
    ledger_seen: list[Attempt] = []
    try:
        while True:
            status = launcher.status(job_id)
            rows = merge_ledger(previous_rows, status.attempts)
            if rows != ledger_seen:
                write_attempts(store, run_id, rows)
                ledger_seen = rows
            progress = latest_progress(read_metrics(store, run_id, since_unix=submitted_unix))
            snap, exceeded = guard.check(previous_rows + status.attempts, progress)
            step, total = progress.get("step"), progress.get("total_steps")
            shown = (status.state, len(status.attempts), step)
            if shown != last_logged:
                last_logged = shown
                where = f"step {step}/{total} loss {progress.get('loss')}" if step is not None else "starting"
                logger.info("%s attempt %d: %s, spend $%.4f (%.0f%% of budget), burn $%.3f/h, projected $%.4f",
                            status.state.value, len(status.attempts), where, snap.spend_usd, 100 * snap.fraction,
                            snap.burn_usd_per_hour, snap.projected_usd)
                if step is not None and total:
                    update_progress_artifact(progress_id, 100.0 * step / total)
            if exceeded:
                _stop_gracefully(launcher, job_id, config.compute.preempt_grace_s)
                attempts = launcher.attempts(job_id)
                write_attempts(store, run_id, merge_ledger(previous_rows, attempts))
                stopped_at = latest_progress(read_metrics(store, run_id, since_unix=submitted_unix)).get("step")
                raise BudgetExceeded(
                    f"run {run_id} stopped at its budget cap after spending "
                    f"${spend_usd(previous_rows + attempts):.4f} "
                    f"of budget.max_usd ${config.budget.max_usd:g} (stopping {config.budget.stop_margin_s:g} s of "
                    f"burn early); its checkpoints are kept{f' (step {stopped_at})' if stopped_at else ''}. "
                    "Run it again with a larger budget.max_usd to finish from there."
                )
            if status.state.terminal:
                break
            time.sleep(poll_s)
    except BudgetExceeded:
        raise
    except BaseException:
        logger.warning("the watch was interrupted; cancelling job %s gracefully (it checkpoints first)", job_id)
        _stop_gracefully(launcher, job_id, config.compute.preempt_grace_s)
        write_attempts(store, run_id, merge_ledger(previous_rows, launcher.attempts(job_id)))
        raise
    write_attempts(store, run_id, merge_ledger(previous_rows, status.attempts))
    if status.state != JobState.SUCCEEDED:
        raise LaunchError(f"job {job_id} ended {status.state.value}: {status.message}")
    update_progress_artifact(progress_id, 100.0)
    return JobOutcome(job_id=job_id, state=status.state.value, attempts=status.attempts,
                      summary=read_summary(store, run_id))
