"""The watch loop's deadline (``compute.deadline_h`` with spot): where the run stands against it, and the moves between
spot and on-demand that ``thrifty.spot.deadline`` decides.

Each poll measures progress (steps done against the steps the run needs, at the job's own measured pace), the time
left and what a changeover costs (a stop's checkpoint, start-up and resume: measured, or the estimate's), and asks
the policy for a market. A move stops the job the graceful way (checkpoint first; the watch loop does that) and
submits one on the other market that resumes from the checkpoint. Every move is logged, evented
(``thrifty.deadline.switch``) and kept in ``runs/<run>/deadline.json``; each job's attempts, with their market, are
in the ledger like any other's.
"""

from __future__ import annotations

import time
from typing import Any, Callable

from tasks.alerts import deadline_switch
from thrifty.config import RunConfig
from thrifty.launchers import JobState, JobStatus
from thrifty.money.estimate import Estimate, PROVISIONING_S
from thrifty.money.ledger import Attempt
from thrifty.runs import checkpoints, latest_progress
from thrifty.spot.deadline import DeadlineState, Decision, Margins, Market, decide
from thrifty.spot.deadline_run import (DeadlineRecord, Move, changeover_s, deadline_moves, market_config,
                                       measured_step_s, read_record, write_record)
from thrifty.storage import Store

Submit = Callable[[RunConfig], str]  # a job for this config, on the run's lease: its id


class DeadlineWatch:
    """One watch loop's deadline: the record, the policy's inputs, the moves."""

    def __init__(self, config: RunConfig, store: Store, estimate: Estimate | None, logger: Any, record: DeadlineRecord,
                 submit: Submit):
        self.config, self.store, self.estimate, self.logger = config, store, estimate, logger
        self.record, self.submit = record, submit
        self.step_s = estimate.step_s if estimate and estimate.step_s > 0 else None  # until the job measures its own
        self.misses = 0  # moves to spot in a row that found no capacity
        self.trying = False  # moved to spot, no capacity found yet
        self.pending: Move | None = None  # announced, its job not yet stopped

    @classmethod
    def begin(cls, config: RunConfig, store: Store, estimate: Estimate | None, logger: Any, live_job: str | None,
              submit: Submit) -> "DeadlineWatch | None":
        """The deadline of this watch, or None without one. A watcher re-attaching to the run's live job keeps the
        clock of the watcher that started it; a new job starts the clock now (``compute.deadline_h`` from launch)."""
        if not deadline_moves(config):
            return None
        c = config.compute
        record = read_record(store, config.run_name) if live_job else None
        if record is None or record.market_of(live_job or "") is None:
            now = time.time()
            saved = checkpoints.committed(store, config.run_name)
            record = DeadlineRecord(policy=c.deadline_policy, started_unix=now, deadline_unix=now + c.deadline_h * 3600.0,
                                    steps_at_start=saved[-1].step if saved else 0)
            if live_job:
                record = record.with_job(live_job, "spot" if c.use_spot else "on_demand", now)
            write_record(store, config.run_name, record)
        logger.info("deadline: %.1f min from now, policy %s", (record.deadline_unix - time.time()) / 60, record.policy)
        return cls(config, store, estimate, logger, record, submit)

    def launch(self, market: Market | None = None) -> str:
        """Submit the run's job on ``market`` (the policy's first: on-demand for ``on_demand``, else spot)."""
        market = market or ("on_demand" if self.record.policy == "on_demand" else "spot")
        job_id = self.submit(market_config(self.config, market))
        self.record = self.record.with_job(job_id, market, time.time())
        write_record(self.store, self.config.run_name, self.record)
        return job_id

    # ------------------------------------------------------------ each poll
    def poll(self, job_id: str, status: JobStatus, records: list[dict[str, Any]], earlier: list[Attempt],
             gap_s: float) -> Move | None:
        """The move the policy wants now (logged and evented once), or None to stay."""
        if self.pending is not None and self.pending.from_job == job_id:
            return self.pending  # announced; its job is still stopping
        state = self.state(job_id, status, records, earlier, gap_s)
        if state is None:
            return None
        c = self.config.compute
        margins = Margins.default(state.changeover_s, c.deadline_safety_margin_s, c.deadline_hysteresis_s)
        decision = decide(self.record.policy, state, margins)
        if decision.market == state.market:
            return None
        self.pending = self._announce(job_id, state, decision, latest_progress(records).get("step"))
        return self.pending

    def state(self, job_id: str, status: JobStatus, records: list[dict[str, Any]], earlier: list[Attempt],
              gap_s: float) -> DeadlineState | None:
        """The policy's inputs now; None while the run's length or pace is not known yet."""
        now, r = time.time(), self.record
        progress = latest_progress(records)
        total = progress.get("total_steps") or (self.estimate.total_steps if self.estimate else None)
        pace = measured_step_s(records)
        if pace is not None:
            self.step_s = pace
        if not total or not self.step_s:
            return None
        step = max(r.steps_at_start, int(progress.get("step") or r.steps_at_start))
        market = r.market_of(job_id) or "spot"
        startup = self.estimate.startup_s if self.estimate else PROVISIONING_S[self.config.compute.launcher]
        change, _how = changeover_s(self.config, startup, earlier + status.attempts, records)
        available = self._spot_available(job_id, status, change, now) if market == "spot" else None
        return DeadlineState(elapsed_s=now - r.started_unix, deadline_s=r.deadline_unix - r.started_unix,
                             work_s=(total - r.steps_at_start) * self.step_s, done_s=(step - r.steps_at_start) * self.step_s,
                             market=market, spot_available=available, changeover_s=change, gap_s=gap_s,
                             misses=self.misses)

    def _spot_available(self, job_id: str, status: JobStatus, change_s: float, now: float) -> bool:
        """Whether the spot job has capacity: an attempt running, or one expected within a start-up of the job's
        submission or its last preemption (provisioning); waiting longer than that, it has none."""
        if any(a.ended_unix is None for a in status.attempts) and status.state in (JobState.RUNNING, JobState.STARTING):
            if self.trying:
                self.trying, self.misses = False, 0  # the move found spot
            return True
        submitted = next((j.submitted_unix for j in self.record.jobs if j.job_id == job_id), now)
        since = max([submitted] + [a.ended_unix for a in status.attempts if a.ended_unix is not None])
        return now - since < change_s

    def _announce(self, job_id: str, state: DeadlineState, decision: Decision, step: int | None) -> Move:
        move = Move(at_unix=time.time(), from_market=state.market, to_market=decision.market, from_job=job_id,
                    step=step, reason=decision.reason, safety_net=decision.safety_net)
        run_id = self.config.run_name
        deadline_switch(self.config, f"run {run_id}: {state.market.replace('_', '-')} -> "
                                     f"{decision.market.replace('_', '-')} (job {job_id} stops with a checkpoint): "
                                     f"{decision.reason}",
                        {"run_id": run_id, "policy": self.record.policy, "from_market": state.market,
                         "to_market": decision.market, "from_job": job_id, "step": step,
                         "safety_net": decision.safety_net, "slack_s": round(state.slack_s, 1),
                         "time_left_s": round(state.deadline_s - state.elapsed_s, 1),
                         "work_left_s": round(state.left_s, 1), "changeover_s": round(state.changeover_s, 1),
                         "reason": decision.reason}, self.logger)
        return move

    def stopped_for_move(self, job_id: str, status: JobStatus) -> Move | None:
        """The move ``job_id`` was stopped for, now that it has ended cancelled; None for any other end (it finished,
        failed, or was stopped for another reason)."""
        if self.pending is not None and self.pending.from_job == job_id and status.state is JobState.CANCELLED:
            return self.pending
        return None

    def moved(self, move: Move, stopped: JobStatus) -> str:
        """The old job has stopped (``stopped``, checkpoint kept): submit the job on the other market, record the move;
        its id."""
        if move.to_market == "on_demand" and self.trying:
            self.misses += 1  # back on on-demand without having found spot
        self.trying = move.to_market == "spot"
        job_id = self.launch(move.to_market)
        self.pending = None
        self.record = self.record.with_move(move.model_copy(update={"to_job": job_id}))
        write_record(self.store, self.config.run_name, self.record)
        self.logger.info("deadline: job %s (%s) resumes run %s from its checkpoint; job %s ended %s",
                         job_id, move.to_market.replace("_", "-"), self.config.run_name, stopped.job_id,
                         stopped.state.value)
        return job_id
