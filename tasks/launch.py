"""Launch the training job and watch it to the end: ledger, budget, one job per run, a stop at the cap.

Never retried by Prefect: a retry rents another machine. Recovery after preemption is the launcher's job.
The run's lease (``thrifty.runs.lease``) makes this the only watcher of the run: a second trigger while
this one lives fails saying who holds it; one that finds the holder gone but its job still running
re-attaches to that job instead of renting another.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
from typing import Any, Callable

from prefect import get_run_logger, task
from prefect.artifacts import create_progress_artifact, update_progress_artifact

from tasks.alerts import BudgetGuard, StarvedAlert
from tasks.deadline import DeadlineWatch
from tasks.errors import fails_quietly
from thrifty.runs import checkpoints, exits, lease
from thrifty.money.budget import TEARDOWN_S, spend_usd, stop_margin_s
from thrifty.config import ConfigError, RunConfig
from thrifty.money.estimate import Estimate
from thrifty.launchers import JobState, JobStatus, LaunchError, Launcher, make_launcher
from thrifty.money.ledger import Attempt, job_ended_at_cap, read_attempts, read_meters, write_job_attempts
from thrifty.protocol import ENV_LEASE_TOKEN
from thrifty.results import JobOutcome
from thrifty.report import ends
from thrifty.runs import finished_since, latest_progress, reached_end, read_metrics, read_summary
from thrifty.storage import Store, open_store
from thrifty.numbers import metric, money

LEASE_TTL_S = 60.0  # a watcher silent this long is gone; its lease may be taken over
LEASE_BEAT_S = 10.0
END_EXIT_S = 60.0  # a job that reached its end is given this long (past the stop margin) to exit by itself


_STOP_REQUESTS: dict[str, str] = {}  # run_id -> why: a graceful stop asked of the watch loop in this process
_STOP_LOCK = threading.Lock()


def request_stop(run_id: str, reason: str) -> None:
    """Ask the watch loop of ``run_id`` in this process (a child flow run of a search, say) to stop its job the
    graceful way, whatever the launcher: checkpoint, then end. The loop acts on it within a poll interval."""
    with _STOP_LOCK:
        _STOP_REQUESTS[run_id] = reason


def _stop_requested(run_id: str) -> str | None:
    with _STOP_LOCK:
        return _STOP_REQUESTS.pop(run_id, None)


def _holder() -> str:
    from prefect.runtime import flow_run

    return f"flow run {flow_run.name or flow_run.id or '?'} on {socket.gethostname()} pid {os.getpid()}"


def live_job(launcher: Launcher, store: Store, config: RunConfig, previous: lease.LeaseRecord | None) -> str | None:
    """A job of this run that is still alive although no one watches it: re-attach to it when the launcher can
    see it; stop here when it cannot (a local job whose flow process died: it ends by itself at the cap)."""
    run_id = config.run_name
    candidates = [a.job_id for a in read_attempts(store, run_id) if a.ended_unix is None]
    if previous is not None and previous.job_id:
        candidates.append(previous.job_id)
    now = time.time()
    for job_id in dict.fromkeys(reversed(candidates)):  # newest first, once each
        try:
            state = launcher.status(job_id).state
        except LaunchError:
            state = None  # this launcher cannot see it (another process's local job)
        if state is not None:
            if not state.terminal:
                return job_id
            continue
        alive = [m for m in read_meters(store, run_id) if m.job_id == job_id and not m.gone(now)]
        if alive:
            raise ConfigError(
                f"run {run_id!r}: its job {job_id} is still training without a watcher (the process that started it "
                f"is gone; the job last reported {now - alive[-1].last_unix:.0f} s ago). It stops by itself at the "
                "budget cap. Wait for it to end, or stop it, before starting this run again; a second job never "
                "trains beside it.")
    return None


class CapTimer:
    """The stop, scheduled for the moment the money runs out less the stop margin, re-armed at every look.

    The watch loop's own check leaves a poll interval of reserve, measured from its recent pace; a look that
    comes late (a starved machine, a slow API) would still be too late. The timer is not: it fires on time
    whatever the loop is doing, and the launcher ends the job within the margin after it.
    """

    def __init__(self, launcher: Launcher, job_id: str, margin_s: float, logger: Any,
                 reached_end: Callable[[], bool] | None = None):
        self.launcher, self.job_id, self.margin_s, self.logger = launcher, job_id, margin_s, logger
        self.reached_end = reached_end  # a job that reached its end is exiting: never stopped for money
        self.fired = threading.Event()  # set once the job has been told to stop
        self._firing = False  # set the moment it starts telling it: no timer after that
        self._timer: threading.Timer | None = None

    def arm(self, spend_usd: float, burn_usd_per_hour: float, max_usd: float) -> None:
        self.disarm()
        if burn_usd_per_hour <= 0 or self._firing:
            return
        seconds = (max_usd - spend_usd) / burn_usd_per_hour * 3600.0 - self.margin_s
        self._timer = threading.Timer(max(0.0, seconds), self._fire)
        self._timer.daemon = True
        self._timer.start()

    def _fire(self) -> None:
        if self._firing or (self.reached_end is not None and self.reached_end()):
            return
        self._firing = True
        self.logger.warning("budget: the money left covers only the stop itself; stopping job %s now", self.job_id)
        try:
            self.launcher.cancel(self.job_id, deadline_s=self.margin_s)
        finally:
            self.fired.set()  # after the request: whoever sees it set may count on the job being told

    def disarm(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None


def record(store: Store, run_id: str, status: JobStatus, tags: dict[str, str] | None = None) -> None:
    """The job's ledger rows, each with the run's cost allocation tags (a bill split by team reads them)."""
    for a in status.attempts:
        a.tags = dict(tags) if tags else None
    write_job_attempts(store, run_id, status.job_id, status.attempts)


class AttemptLog:
    """Says in the flow run's log (what the UI shows) when an attempt ends, a new one starts and where it resumed:
    the launcher's own lines go to the worker's terminal and the attempt logs, which the UI does not show."""

    def __init__(self, logger: Any):
        self.logger = logger
        self.ended: set[tuple[str, int]] = set()  # (job, attempt): a deadline's move starts a job at attempt 1 again
        self.started: set[tuple[str, int]] = set()
        self.resumes: set[float] = set()

    def attempts(self, attempts: list[Attempt]) -> None:
        for a in attempts:
            if (a.job_id, a.number) not in self.started:
                self.started.add((a.job_id, a.number))
                if a.number > 1:
                    self.logger.warning("attempt %d started on %s %s (%s): the job recovers after attempt %d",
                                        a.number, a.cloud, a.instance, "spot" if a.spot else "on-demand", a.number - 1)
            if a.ended_unix is not None and (a.job_id, a.number) not in self.ended:
                self.ended.add((a.job_id, a.number))
                level = logging.WARNING if a.end_reason in ("preempted", "failed") else logging.INFO
                self.logger.log(level, "attempt %d ended: %s (exit code %s) after %.1f min, %s",
                                a.number, a.end_reason, a.exit_code, a.hours() * 60, money(a.cost_usd()))

    def metrics(self, records: list[dict[str, Any]]) -> None:
        for rec in records:
            if rec.get("event") == "start" and rec.get("step", 0) > 0 and rec["time_unix"] not in self.resumes:
                self.resumes.add(rec["time_unix"])
                self.logger.warning("resumed from step %d of %s (resume %d): the steps before it are not paid for "
                                    "again", rec["step"], rec.get("total_steps"), rec.get("resumes", 0))


def progress_notes(where: str, spend_usd: float, max_usd: float) -> tuple[str, str]:
    """The two progress artifacts' descriptions (steps first, money first), short enough for the UI's cards: spend
    against the budget shows while the run runs, not only steps."""
    spent = f"{money(spend_usd)} of ${max_usd:g} budget ({spend_usd / max_usd:.0%})"
    return f"{where} · {spent}", f"{spent} · {where}"


def _wait_terminal(launcher: Launcher, job_id: str, within_s: float) -> JobStatus:
    deadline = time.time() + within_s
    status = launcher.status(job_id)
    while not status.state.terminal and time.time() < deadline:
        time.sleep(0.2)
        status = launcher.status(job_id)
    return status


def outcome(config: RunConfig, store: Store, status: JobStatus, earlier: list[Attempt], since_unix: float,
            stopped_at_cap: bool, reattached: bool) -> JobOutcome:
    """How the job ended. A job that finished training succeeded, whatever stop came after it."""
    run_id = config.run_name
    finished = status.state is JobState.SUCCEEDED and finished_since(store, run_id, since_unix)
    # a job whose records say it reached its end (the run's, or its rung) did its work, whatever stop came after
    done = finished or reached_end(read_metrics(store, run_id, since_unix=since_unix), config.train.stop_at_epoch)
    try:
        summary = read_summary(store, run_id) if done or status.state is JobState.SUCCEEDED else None
    except ValueError:  # a summary.json that does not parse: the run is reported without it
        summary = None
    saved = checkpoints.committed(store, run_id)
    step = saved[-1].step if saved else None
    spent = spend_usd(earlier + status.attempts)
    def said(kind: str, detail: str) -> str:
        return ends.sentence(kind, run_id, spent, config.budget.max_usd, detail, step)

    stop = config.train.stop_at_epoch  # a search's rung: the job ends where it is told to, checkpoint kept
    trained = ("training finished" if stop is None or finished else
               f"trained to epoch {stop} (train.stop_at_epoch); the run continues from there")
    given_up = None if done else exits.given_up(store, run_id, status.job_id)  # SkyPilot saw exit 0 for it
    if done:
        end, message = "succeeded", trained
    elif given_up is not None:
        end, message = "failed", said("failed", f"job {status.job_id} failed and was not restarted: {given_up}; "
                                                f"{ends.kept(run_id, step)}")
    elif stopped_at_cap or job_ended_at_cap(store, run_id, status.job_id) is not None:
        end, message = "budget", said("budget", ends.kept(run_id, step) if step is not None else
                                      "it wrote no checkpoint: the budget ran out before the first one")
    elif status.state is JobState.SUCCEEDED:
        end, message = "succeeded", trained
    elif status.state is JobState.CANCELLED:
        end, message = "cancelled", said("cancelled", f"job {status.job_id} was stopped ({status.message}); "
                                                      f"{ends.kept(run_id, step)}")
    else:
        end, message = "failed", said("failed", f"job {status.job_id} ended {status.state.value}: {status.message}; "
                                                f"{ends.kept(run_id, step)}")
    return JobOutcome(job_id=status.job_id, state=status.state.value, end=end, message=message,
                      attempts=status.attempts, summary=summary if end == "succeeded" else None,
                      checkpoint_step=step, run_spend_usd=round(spent, 6), reattached=reattached)


@task(name="launch-and-watch", retries=0)
@fails_quietly
def launch_and_watch(config: RunConfig, estimate: Estimate | None = None, poll_s: float = 1.0) -> JobOutcome:
    """Submit the job (or re-attach to this run's live one), poll until it ends, keep the ledger and the budget."""
    logger = get_run_logger()
    store = open_store(config.store, retry_s=config.store_retry_s)  # a store's brief outage is waited out
    run_id = config.run_name
    previous = lease.read(store, run_id)
    held = lease.acquire(store, run_id, _holder(), ttl_s=LEASE_TTL_S)  # LeaseHeld (exit 2) while another watcher lives
    beat = lease.Heartbeat(held, LEASE_BEAT_S)
    try:
        launcher = make_launcher(config)
        job_id = live_job(launcher, store, config, previous)
        reattached = job_id is not None
        earlier = [a for a in read_attempts(store, run_id) if a.job_id != job_id]  # the budget is per run
        since = time.time()

        def submit(cfg: RunConfig) -> str:
            new = launcher.submit(cfg, env={ENV_LEASE_TOKEN: held.token}, estimate=estimate)
            held.attach(new)
            return new

        deadline = DeadlineWatch.begin(config, store, estimate, logger, job_id, submit)  # None without a deadline
        if job_id is None:
            job_id = deadline.launch() if deadline else launcher.submit(config, env={ENV_LEASE_TOKEN: held.token},
                                                                        estimate=estimate)
            logger.info("submitted job %s (%s launcher)", job_id, config.compute.launcher)
        else:
            logger.warning("re-attached to job %s of run %s, which an earlier flow run started and no one was "
                           "watching; no second job is rented", job_id, run_id)
        held.attach(job_id)
        guard = BudgetGuard(config, store, run_id, logger, estimate, poll_s)
        return watch(config, store, launcher, job_id, guard, earlier, since, poll_s, reattached, logger, deadline)
    finally:
        _stop_requested(run_id)  # one that came as the job ended is spent: it must not stop the run's next job
        beat.stop()
        held.release()


def watch(config: RunConfig, store: Store, launcher: Launcher, job_id: str, guard: BudgetGuard,
          earlier: list[Attempt], since: float, poll_s: float, reattached: bool, logger: Any,
          deadline: DeadlineWatch | None = None) -> JobOutcome:
    """Poll the job to its end. The job's status comes first: a job that has ended is never called over budget.
    With a ``deadline``, its policy may move the run between spot and on-demand: a graceful stop, a new job."""
    run_id = config.run_name
    steps_note, money_note = progress_notes("starting", 0.0, config.budget.max_usd)
    progress_id = create_progress_artifact(0.0, description=steps_note)
    budget_id = create_progress_artifact(0.0, description=money_note)
    said = AttemptLog(logger)
    shown_progress: tuple | None = None
    recorded: list[Attempt] | None = None
    last_logged: tuple | None = None
    stopped_at_cap = False
    ended_at: float | None = None  # when the job's records said it reached its end
    steps_pct = 0.0  # what the steps card shows
    reprojected = False
    margin = stop_margin_s(config)
    def ended() -> bool:  # asked again the moment the cap would stop the job: it may have just finished
        return reached_end(read_metrics(store, run_id, since_unix=since), config.train.stop_at_epoch)

    timer = CapTimer(launcher, job_id, margin, logger, ended)
    planned_burn = guard.estimate.usd_per_hour if guard.estimate else 0.0
    starved = StarvedAlert(config, logger)
    try:
        while True:
            status = launcher.status(job_id)
            if status.attempts != recorded:
                record(store, run_id, status, config.tags)
                recorded = status.attempts
                said.attempts(status.attempts)
            if status.state.terminal:
                move = deadline.stopped_for_move(job_id, status) if deadline else None
                if move is None:
                    break
                earlier = earlier + status.attempts  # stopped for the deadline: one on the other market resumes
                job_id = deadline.moved(move, status)
                timer, recorded = CapTimer(launcher, job_id, margin, logger), None
                continue
            records = read_metrics(store, run_id, since_unix=since)
            said.metrics(records)
            if reached_end(records, config.train.stop_at_epoch):  # its work is saved: it is exiting, never stopped
                timer.disarm()  # for money (the node meters the seconds it takes; a hung exit is cut off)
                ended_at = ended_at or time.time()
                if time.time() - ended_at > margin + END_EXIT_S:
                    logger.warning("job %s reached its end %.0f s ago and has not exited; stopping it", job_id,
                                   time.time() - ended_at)
                    launcher.cancel(job_id, deadline_s=margin)
                    status = _wait_terminal(launcher, job_id, margin + 10.0)
                    break
                timer.fired.wait(poll_s)
                continue
            progress = latest_progress(records)
            snap, exceeded = guard.check(earlier + status.attempts, progress, ended)
            if snap.measured and not reprojected:  # the first look with the job's own speed: said once
                reprojected = True
                logger.info("re-projected from this job's own measured steps: %s for the run (the estimate before "
                            "launch said %s)", money(snap.projected_usd),
                            f"{money(guard.estimate.usd)} for what was left" if guard.estimate else "nothing")
            timer.arm(snap.spend_usd, max(snap.burn_usd_per_hour, planned_burn), config.budget.max_usd)
            starved.check(records, snap.burn_usd_per_hour or planned_burn)  # data waits priced at the run's $/h
            step, total = progress.get("step"), progress.get("total_steps")
            shown = (status.state, len(status.attempts), step)
            if shown != last_logged:
                last_logged = shown
                where = f"step {step}/{total} loss {metric(progress.get('loss'))}" if step is not None else "starting"
                logger.info("%s attempt %d: %s, spend %s (%.0f%% of budget), burn %s/h, %s %s",
                            status.state.value, len(status.attempts), where, money(snap.spend_usd), 100 * snap.fraction,
                            money(snap.burn_usd_per_hour), "projected" if snap.measured else "estimated",
                            money(snap.projected_usd))
            spent_at = (step, round(snap.spend_usd, 4))
            if spent_at != shown_progress:  # spend moves while steps do not (a restart): the UI shows both
                shown_progress = spent_at
                where = f"step {step} of {total}" if step is not None else "starting"
                steps_note, money_note = progress_notes(where, snap.spend_usd, config.budget.max_usd)
                steps_pct = 100.0 * step / total if step is not None and total else 0.0
                update_progress_artifact(progress_id, steps_pct, description=steps_note)
                update_progress_artifact(budget_id, min(100.0, 100.0 * snap.fraction), description=money_note)
            asked = _stop_requested(run_id)
            if asked is not None:
                timer.disarm()
                logger.warning("stopping job %s: %s (it checkpoints first)", job_id, asked)
                launcher.cancel(job_id)
                status = _wait_terminal(launcher, job_id, config.compute.stop_checkpoint_timeout_s + 30.0)
                break
            if exceeded or timer.fired.is_set():
                timer.disarm()
                if not timer.fired.is_set():
                    launcher.cancel(job_id, deadline_s=margin)  # checkpoint first; ended for good within the margin
                status = _wait_terminal(launcher, job_id, margin + 10.0)
                stopped_at_cap = True
                break
            if deadline and deadline.poll(job_id, status, records, earlier, guard.gap_s):
                timer.disarm()  # the job checkpoints and ends (the move is made once it has: above)
                launcher.cancel(job_id)
                if not _wait_terminal(launcher, job_id, config.compute.stop_checkpoint_timeout_s
                                      + TEARDOWN_S[config.compute.launcher] + 30.0).state.terminal:
                    logger.warning("deadline: job %s has not ended yet; the move waits for it", job_id)
                continue
            timer.fired.wait(poll_s)  # a poll interval, cut short when the timer stops the job
    except BaseException:
        timer.disarm()
        logger.warning("the watch was interrupted; stopping job %s (it checkpoints first)", job_id)
        launcher.cancel(job_id, deadline_s=margin)
        record(store, run_id, _wait_terminal(launcher, job_id, margin + 10.0), config.tags)
        raise
    timer.disarm()
    record(store, run_id, status, config.tags)
    said.attempts(status.attempts)
    said.metrics(read_metrics(store, run_id, since_unix=since))
    result = outcome(config, store, status, earlier, since, stopped_at_cap, reattached)
    final_spend = result.run_spend_usd  # both cards end on the run's spend, the ledger's figure
    steps_note, money_note = progress_notes(result.end, final_spend, config.budget.max_usd)
    update_progress_artifact(budget_id, min(100.0, 100.0 * final_spend / config.budget.max_usd),
                             description=money_note)
    update_progress_artifact(progress_id, 100.0 if result.end == "succeeded" else steps_pct, description=steps_note)
    if result.end == "budget":
        guard.stopped(result.message, {"run_id": run_id, "job_id": job_id, "spend_usd": result.run_spend_usd,
                                       "max_usd": config.budget.max_usd, "checkpoint_step": result.checkpoint_step})
    return result
