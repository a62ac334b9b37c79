"""The embedded stand-in for a SkyPilot managed spot job: the training program as a local process group.

It gets the same environment a cloud node gets, can be preempted on purpose (SIGTERM then
SIGKILL after a grace period, or a hard kill), is restarted like SkyPilot's recovery
(preemptions always; failures up to ``compute.max_restarts``, but never bad input or a failure that repeats
the attempt before it: ``thrifty.launchers.failures``), and meters cost at the price of
the instance it emulates, so budgets and reports work on a laptop: the table's price, or with
``budget.prices: live`` its freshest price in the table's region, read again as it ages (the node does the same).
"""

from __future__ import annotations

import copy
import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path

from thrifty.money.budget import TEARDOWN_S
from thrifty.config import RunConfig
from thrifty.launchers.availability import SpotMarket, spot_trace
from thrifty.launchers.base import (JobState, JobStatus, LaunchError, free_loopback_port, node_env, skypilot_node_vars,
                                    torchrun_command)
from thrifty.launchers.notice import children_of, send_sigterm
from thrifty.money.pricing import find_instance, quote_emulated
from thrifty.money.meter import Price
from thrifty.launchers.failures import final_failure, program_code
from thrifty.money.prices import LivePrices, PriceKey, point_quote, price_mode
from thrifty.money.prices.repricing import Repricer, change_from
from thrifty.protocol import ENV_BILLING_START, ENV_JOB_ID, ENV_PREEMPT_AT_STEP, EXIT_BUDGET
from thrifty.runs.exits import ExitRecord, read_exits
from thrifty.money.ledger import Attempt
from thrifty.runs import finished_since, run_key
from thrifty.storage import open_store

log = logging.getLogger("thrifty.launch")

POLL_S = 0.1
NODE_END_GRACE_S = 15.0  # after one node of a multi-node job ends, the others' time to end by themselves


class _Job:
    def __init__(self, job_id: str, cfg: RunConfig, log_dir: Path, env: dict[str, str], market: SpotMarket | None = None):
        self.job_id, self.cfg, self.log_dir, self.env = job_id, cfg, log_dir, env
        self.market = market  # spot capacity by compute.spot_trace (spot jobs only)
        self.state = JobState.PENDING
        self.attempts: list[Attempt] = []
        self.message = ""
        self.cancel_requested = threading.Event()
        self.cancel_deadline_s: float | None = None  # a stop at the budget cap: ended for good within this
        self.preemptions_injected = 0
        # one chain per job, so a source that failed is not asked again at once; the store shares what it reads
        self.live = LivePrices.for_config(cfg, open_store(cfg.store) if price_mode(cfg) == "live" else None)
        self.procs: list[subprocess.Popen] = []  # the attempt running now, one process per node
        self.flag_dir = Path(tempfile.mkdtemp(prefix="thrifty-preempt-"))  # where a node says it waits to be preempted
        self.lock = threading.Lock()
        self.thread = threading.Thread(target=self._supervise, name=f"thrifty-{job_id}", daemon=True)

    # -------------------------------------------------------------- supervisor
    def _supervise(self) -> None:
        """Run attempts until the job ends. An error of the launcher itself (an attempt log it cannot open, a full
        disk) ends the job failed at once, saying so, with what it started stopped: never a thread that dies and
        leaves a job that seems to be starting, billed, with nothing running."""
        try:
            self._attempts_until_done()
        except Exception as exc:  # noqa: BLE001 -- reported as the job's end, not lost with the thread
            log.exception("the local launcher failed running job %s", self.job_id)
            self._stop_all([p for p in self.procs if p.poll() is None], graceful=True)
            with self.lock:
                for a in self.attempts:
                    if a.ended_unix is None:
                        a.ended_unix, a.end_reason = time.time(), "failed"
            self._set(JobState.FAILED, f"the local launcher failed: {type(exc).__name__}: {exc}. Nothing more runs "
                                       f"or is billed for this job; fix that and run it again (it resumes from its "
                                       f"last checkpoint). Logs: {self.log_dir}")
        finally:
            shutil.rmtree(self.flag_dir, ignore_errors=True)

    def _attempts_until_done(self) -> None:
        failures = 0
        while True:
            if self.market is not None and not self.market.available():
                self._set(JobState.RECOVERING if self.attempts else JobState.PENDING,
                          "no spot capacity (compute.spot_trace): waiting for it, unbilled")
                if not self.market.wait(self.cancel_requested):
                    self._set(JobState.CANCELLED, "cancelled while waiting for spot capacity")
                    return
            reason, code = self._run_attempt()
            if reason == "succeeded":
                self._set(JobState.SUCCEEDED, "training finished")
                return
            if reason == "budget":  # as on SkyPilot, whose node wrapper turns this exit into success: no recovery
                self._set(JobState.SUCCEEDED, "the job stopped itself at the budget cap, after a checkpoint")
                return
            if reason == "cancelled":
                self._set(JobState.CANCELLED, "cancelled; the job saved a checkpoint on SIGTERM")
                return
            if reason == "failed":
                failures += 1
                final = final_failure(self._exits(), self.attempts[-1].started_unix, code)  # exit 2, or a repeat
                if final or failures > self.cfg.compute.max_restarts:
                    why = f"not restarted: {final}" if final else f"giving up after {failures} failures"
                    self._set(JobState.FAILED, f"training exited with code {code}; {why}. Logs: {self.log_dir}")
                    return
            self._set(JobState.RECOVERING, f"attempt {len(self.attempts)} {reason}; recovering")

    def _run_attempt(self) -> tuple[str, int | None]:
        c = self.cfg.compute
        price = quote_emulated(c.emulate, c.use_spot)
        repricer = None
        if self.live.live:  # the emulated instance's freshest price in the table's region, read again as it ages
            repricer = Repricer(self.live, PriceKey(price.cloud, price.instance, c.use_spot, price.region or None))
            point = repricer.read()
            if point is not None:
                price = point_quote(find_instance(price.cloud, price.instance), c.use_spot, point)
        attempt = Attempt(self.job_id, len(self.attempts) + 1, price.cloud, "local", price.instance, c.use_spot,
                          price.usd_per_hour, c.num_nodes, time.time(), price_source=price.source)
        node = {**node_env(self.cfg, [Price(price.cloud, price.instance, c.use_spot, price.usd_per_hour,
                                            price.accelerator, price.source, price.region, price.fetched_unix)]),
                ENV_JOB_ID: self.job_id, ENV_BILLING_START: repr(attempt.started_unix), **self.env}
        hit = c.num_nodes - 1 if c.preempt_node is None else min(c.preempt_node, c.num_nodes - 1)
        flag = self.flag_dir / f"attempt-{attempt.number}"
        if c.preempt_after_steps is not None and self.preemptions_injected == 0:  # the node stops at exactly that step
            node[ENV_PREEMPT_AT_STEP] = json.dumps({"step": c.preempt_after_steps, "node": hit, "mode": c.preempt_mode,
                                                    "flag": str(flag), "launcher_pid": os.getpid()})
        self.log_dir.mkdir(parents=True, exist_ok=True)
        with self.lock:
            self.state = JobState.STARTING
        procs = self._start_nodes(attempt.number, node)  # billed from the start: a start that failed bills nothing
        with self.lock:
            self.attempts.append(attempt)
        self._set(JobState.RUNNING, f"attempt {attempt.number} running on {len(procs)} node(s) (pid "
                                    f"{', '.join(str(p.pid) for p in procs)}, logs in {self.log_dir})")
        reason = None
        # a node that ends ends the attempt: its peers would wait on it in their next collective
        while all(p.poll() is None for p in procs):
            if self.cancel_requested.is_set():
                self._stop_all(procs, graceful=True, grace_s=self.cancel_deadline_s)
                reason = "cancelled"
            elif self._preemption_due(attempt, flag):
                self.preemptions_injected += 1
                log.warning("injecting a preemption (%s) into attempt %d%s%s", c.preempt_mode, attempt.number,
                            f", node {hit} of {len(procs)}" if len(procs) > 1 else "",
                            f" at step {json.loads(flag.read_text())['step']}" if flag.exists() else "")
                self._stop(procs[hit], graceful=c.preempt_mode == "sigterm")
                reason = "preempted"
            elif self.market is not None and not self.market.available():
                log.warning("spot capacity gone (compute.spot_trace): preempting attempt %d", attempt.number)
                self._stop_all(procs, graceful=True)
                reason = "preempted"
            else:
                if repricer is not None and repricer.due():
                    self._reprice(attempt, repricer)
                time.sleep(POLL_S)
        code = program_code(self._end_nodes(procs), self._exits(), attempt.started_unix)  # (torchrun says 1)
        if code == EXIT_BUDGET:
            reason = "budget"
        elif code == 0 and (reason is None or finished_since(open_store(self.cfg.store, retry_s=self.cfg.store_retry_s),
                                                             self.cfg.run_name, attempt.started_unix)):
            reason = "succeeded"  # a stop that came after training had finished: it finished, it was not stopped
        elif reason is None:
            reason = "failed"
        with self.lock:
            attempt.ended_unix, attempt.end_reason, attempt.exit_code = time.time(), reason, code
        return reason, code

    def _reprice(self, attempt: Attempt, repricer: Repricer) -> None:
        point = repricer.read()
        if point is None:
            return
        now = time.time()
        with self.lock:
            since = change_from(attempt.usd_per_hour, point.usd_per_hour, repricer.previous_seen_unix, now)
            moved = attempt.repriced(point.usd_per_hour, point.describe(), since)
        if moved:
            log.warning("attempt %d: the price of %s moved to $%.4f/h (%s)", attempt.number, attempt.instance,
                        point.usd_per_hour, point.describe())

    def _start_nodes(self, attempt_number: int, node: dict[str, str]) -> list[subprocess.Popen]:
        """One process group per node. One node runs the training program; several run it under torchrun, which
        rendezvous (c10d, on loopback) from the variables a SkyPilot node gets: SKYPILOT_NODE_IPS, _NODE_RANK,
        _NUM_NODES."""
        n = self.cfg.compute.num_nodes
        if n == 1:
            commands, envs = [[sys.executable, "-m", "training"]], [node]
        else:
            port = free_loopback_port()
            envs = [{**node, **skypilot_node_vars(["127.0.0.1"] * n, rank)} for rank in range(n)]
            commands = [torchrun_command(e, port, f"{self.job_id}-{attempt_number}") for e in envs]
        procs: list[subprocess.Popen] = []
        try:
            for rank, (command, env) in enumerate(zip(commands, envs)):
                name = f"attempt-{attempt_number}.log" if rank == 0 else f"attempt-{attempt_number}-node{rank}.log"
                with open(self.log_dir / name, "ab") as log_file:
                    procs.append(subprocess.Popen(command, env={**os.environ, **env}, stdout=log_file,
                                                  stderr=subprocess.STDOUT, start_new_session=True))  # its own group
        except BaseException:
            self._stop_all(procs, graceful=False)  # a node started without its peers would wait on them forever
            raise
        self.procs = procs
        return procs

    def _end_nodes(self, procs: list[subprocess.Popen]) -> int | None:
        """The attempt's exit code once every node is gone: the first failure, else the first node's. Nodes still
        running when one ended get a moment to finish the same way (a stop they agreed on), then are stopped."""
        deadline = time.monotonic() + NODE_END_GRACE_S
        while any(p.poll() is None for p in procs) and time.monotonic() < deadline:
            time.sleep(POLL_S)
        self._stop_all([p for p in procs if p.poll() is None], graceful=True)
        codes = [p.returncode for p in procs]
        return next((c for c in codes if c not in (0, None)), codes[0])

    def _stop_all(self, procs: list[subprocess.Popen], graceful: bool, grace_s: float | None = None) -> None:
        threads = [threading.Thread(target=self._stop, args=(p, graceful, grace_s)) for p in procs]
        for t in threads:
            t.start()
        for t in threads:
            t.join()

    def _preemption_due(self, attempt: Attempt, flag: Path) -> bool:
        c = self.cfg.compute
        if self.preemptions_injected > 0:
            return False  # one injected preemption per job
        if c.preempt_after_s is not None and time.time() - attempt.started_unix >= c.preempt_after_s:
            return True
        return flag.exists()  # the node finished step preempt_after_steps and waits there (training.boundary)

    def _stop(self, proc: subprocess.Popen, graceful: bool, grace_s: float | None = None) -> None:
        """SIGTERM the process group and wait out the grace period, then SIGKILL; or SIGKILL at once."""
        grace_s = self.cfg.compute.preempt_grace_s if grace_s is None else grace_s
        if graceful:
            if self.cfg.compute.num_nodes > 1:  # a node's workers, as the notice watcher does: torchrun gives them 30 s
                send_sigterm(proc.pid, children=True)
            else:
                _signal_group(proc, signal.SIGTERM)
            try:
                proc.wait(timeout=grace_s)
                return
            except subprocess.TimeoutExpired:
                log.warning("job did not exit within %.0f s of SIGTERM; killing it", grace_s)
        if self.cfg.compute.num_nodes > 1:  # torchrun's workers have sessions of their own: a dead node takes them too
            for worker in children_of(proc.pid):
                _kill(worker)
        _signal_group(proc, signal.SIGKILL)
        proc.wait()

    def _exits(self) -> list[ExitRecord]:
        """How the program says this job's attempts ended (``thrifty.runs.exits``)."""
        try:
            return read_exits(open_store(self.cfg.store), self.cfg.run_name, self.job_id)
        except Exception as exc:  # unreadable: the process's exit code decides alone
            log.warning("cannot read job %s's exit records: %s", self.job_id, exc)
            return []

    def _set(self, state: JobState, message: str) -> None:
        with self.lock:
            self.state, self.message = state, message
        log.info("%s: %s", state.value, message)

    def snapshot(self) -> JobStatus:
        with self.lock:
            return JobStatus(self.job_id, self.state, copy.deepcopy(self.attempts), self.message)


def _signal_group(proc: subprocess.Popen, sig: int) -> None:
    try:
        os.killpg(proc.pid, sig)
    except ProcessLookupError:
        pass


def _kill(pid: int) -> None:
    try:
        os.killpg(pid, signal.SIGKILL)  # the worker and what it started
    except (ProcessLookupError, PermissionError):
        pass
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


class LocalLauncher:
    """Runs jobs on this machine; one supervisor thread per job, in this process."""

    def __init__(self, cfg: RunConfig | None = None) -> None:
        self._jobs: dict[str, _Job] = {}
        self._trace_origin: dict[str, float] = {}  # run -> when its first job here started: the trace's tick 0

    def submit(self, cfg: RunConfig, env: dict[str, str] | None = None, estimate: object = None) -> str:
        # ``estimate`` ranks cloud candidates; here there is one machine, this one
        quote_emulated(cfg.compute.emulate, cfg.compute.use_spot)  # an unknown instance fails here, not mid-job
        job_id = f"local-{cfg.run_name}-{uuid.uuid4().hex[:8]}"
        # attempt logs beside the run in a local store (runs/<id>/logs/<job>/), else in the temp directory
        log_dir = open_store(cfg.store).local_path(run_key(cfg.run_name, "logs", job_id))
        origin = self._trace_origin.setdefault(cfg.run_name, time.time())
        trace = spot_trace(cfg) if cfg.compute.use_spot else None  # an unreadable trace fails here, not mid-job
        market = SpotMarket(trace, origin) if trace is not None else None
        job = _Job(job_id, cfg, log_dir or Path(tempfile.gettempdir()) / "thrifty-logs" / job_id, env or {}, market)
        self._jobs[job_id] = job
        job.thread.start()
        return job_id

    def _job(self, job_id: str) -> _Job:
        try:
            return self._jobs[job_id]
        except KeyError:
            raise LaunchError(f"unknown local job {job_id!r} (local jobs live in the process that submitted them)") from None

    def status(self, job_id: str) -> JobStatus:
        return self._job(job_id).snapshot()

    def cancel(self, job_id: str, deadline_s: float | None = None) -> None:
        job = self._job(job_id)
        # within a deadline, the job gets what is left after the kill and its exit to checkpoint in
        job.cancel_deadline_s = None if deadline_s is None else max(0.0, deadline_s - TEARDOWN_S["local"])
        job.cancel_requested.set()

    def attempts(self, job_id: str) -> list[Attempt]:
        return self._job(job_id).snapshot().attempts

    def wait(self, job_id: str, timeout: float | None = None) -> JobStatus:
        self._job(job_id).thread.join(timeout)
        return self.status(job_id)
