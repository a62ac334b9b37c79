"""The embedded stand-in for a SkyPilot managed spot job: the training program as a local process group.

It gets the same environment a cloud node gets, can be preempted on purpose (SIGTERM then
SIGKILL after a grace period, or a hard kill), is restarted like SkyPilot's recovery
(preemptions always; failures up to ``compute.max_restarts``), and meters cost at the price of
the instance it emulates, so budgets and reports work on a laptop.
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
from thrifty.money.pricing import quote_emulated
from thrifty.money.meter import Price
from thrifty.protocol import ENV_BILLING_START, ENV_JOB_ID, ENV_PREEMPT_AT_STEP, EXIT_BAD_INPUT, EXIT_BUDGET
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
        self.flag_dir = Path(tempfile.mkdtemp(prefix="thrifty-preempt-"))  # where a node says it waits to be preempted
        self.lock = threading.Lock()
        self.thread = threading.Thread(target=self._supervise, name=f"thrifty-{job_id}", daemon=True)

    # -------------------------------------------------------------- supervisor
    def _supervise(self) -> None:
        try:
            self._recover()
        finally:
            shutil.rmtree(self.flag_dir, ignore_errors=True)

    def _recover(self) -> None:
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
                if code == EXIT_BAD_INPUT or failures > self.cfg.compute.max_restarts:
                    why = "bad input (exit 2)" if code == EXIT_BAD_INPUT else f"{failures} failures"
                    self._set(JobState.FAILED, f"training exited with code {code}; giving up after {why}. "
                                               f"Logs: {self.log_dir}")
                    return
            self._set(JobState.RECOVERING, f"attempt {len(self.attempts)} {reason}; recovering")

    def _run_attempt(self) -> tuple[str, int | None]:
        c = self.cfg.compute
        price = quote_emulated(c.emulate, c.use_spot)
        attempt = Attempt(self.job_id, len(self.attempts) + 1, price.cloud, "local", price.instance, c.use_spot,
                          price.usd_per_hour, c.num_nodes, time.time())
        node = {**node_env(self.cfg, [Price(price.cloud, price.instance, c.use_spot, price.usd_per_hour,
                                            price.accelerator, price.source)]),
                ENV_JOB_ID: self.job_id, ENV_BILLING_START: repr(attempt.started_unix), **self.env}
        hit = c.num_nodes - 1 if c.preempt_node is None else min(c.preempt_node, c.num_nodes - 1)
        flag = self.flag_dir / f"attempt-{attempt.number}"
        if c.preempt_after_steps is not None and self.preemptions_injected == 0:  # the node stops at exactly that step
            node[ENV_PREEMPT_AT_STEP] = json.dumps({"step": c.preempt_after_steps, "node": hit, "mode": c.preempt_mode,
                                                    "flag": str(flag), "launcher_pid": os.getpid()})
        with self.lock:
            self.attempts.append(attempt)
            self.state = JobState.STARTING
        self.log_dir.mkdir(parents=True, exist_ok=True)
        procs = self._start_nodes(attempt.number, node)
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
                time.sleep(POLL_S)
        code = self._end_nodes(procs)
        if code == EXIT_BUDGET:
            reason = "budget"
        elif code == 0 and (reason is None or finished_since(open_store(self.cfg.store), self.cfg.run_name, attempt.started_unix)):
            reason = "succeeded"  # a stop that came after training had finished: it finished, it was not stopped
        elif reason is None:
            reason = "failed"
        with self.lock:
            attempt.ended_unix, attempt.end_reason, attempt.exit_code = time.time(), reason, code
        return reason, code

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
        procs = []
        for rank, (command, env) in enumerate(zip(commands, envs)):
            name = f"attempt-{attempt_number}.log" if rank == 0 else f"attempt-{attempt_number}-node{rank}.log"
            with open(self.log_dir / name, "ab") as log_file:
                procs.append(subprocess.Popen(command, env={**os.environ, **env}, stdout=log_file,
                                              stderr=subprocess.STDOUT, start_new_session=True))  # its own group
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
