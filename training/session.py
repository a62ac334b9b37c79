"""The session a training script of its own runs under (``thrifty.session.init()``): what the managed loop gives.

The run's checkpoints through the same COMMIT protocol (``CheckpointManager``), the RNG streams
saved and restored with them, a resumable data order, stop requests (a spot notice, the budget cap
by the node's own meter, early stopping, the smoke test's step limit), the metric lines, the lease, ``summary.json``;
what the script did is told to the wrapper that started it (``training.script``) in a status file.
"""

from __future__ import annotations

import atexit
import datetime as dt
import json
import logging
import math
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from thrifty.config import ConfigError, RunConfig, script_config
from thrifty.faults import fault_point, pace
from thrifty.launchers.identity import identify
from thrifty.money.meter import NodeMeter
from thrifty.money.throughput import speed_key
from thrifty.spot.preemption import config_mtbp, node_mtbp
from thrifty.protocol import EXIT_BAD_INPUT, EXIT_FAILED
from thrifty.runs import RunSummary, run_key, write_summary
from thrifty.runs.exits import error_signature
from thrifty.usercode.script import ENV_STATUS, ENV_STEP_LIMIT, SessionStatus, is_script, script_params
from thrifty.storage import open_store
from training.boundary import StepBoundary
from training.cap_watchdog import CapWatchdog
from training.checkpoint import CheckpointManager
from training.ckpt_writer import CheckpointWriter, Written
from training.data import epoch_permutation
from training.early_stopping import EarlyStopping, best_metric, best_metric_at
from training.lazy_dynamo import defer_dynamo_import
from training.resume import check_compatible, one_trainer
from training.progress import CheckpointSchedule, MetricsWriter
from training.runtime import Dist, StopSignal, rng_state, seed_everything, set_rng_state, state_sha256
from training.session_end import (INTERRUPTIONS, METER_END, changed_settings, load_failure, mismatch_message,
                                  state_mismatch, verdict)

log = logging.getLogger("thrifty.session")


class ScriptError(ConfigError):
    """The script used the session in a way that loses work or money; the message says what to change."""


class Session:
    """One process's part of a run. Create it with :func:`init`; end it with :meth:`close` (or let exit do it)."""

    def __init__(self, cfg: RunConfig, total_steps: int | None = None):
        if "{date}" in cfg.run_name:  # started by hand with a dated name: today's run, as `thrifty train` does
            cfg = cfg.resolved(dt.datetime.now(dt.timezone.utc).date())
        if not is_script(cfg):
            raise ScriptError(f"thrifty.session runs the command of a `recipe: script` config; this one has recipe "
                              f"{cfg.recipe!r}. Set recipe: script and recipe_params.command to the script's command")
        self.cfg = cfg
        self.params = script_params(cfg)
        tc, es = cfg.train, cfg.train.early_stopping
        self.run_id = cfg.run_name
        self.dist = Dist.from_env()
        self.is_main = self.dist.is_main
        self.store = open_store(cfg.store, retry_s=cfg.store_retry_s)  # a store's brief outage is waited out
        self._lease = one_trainer(self.store, self.run_id, self.dist)  # a by-hand run takes the lease itself
        self._lease.__enter__()
        self._closed, self._crashed = False, False
        self._write_error: Exception | None = None
        self._saved_cfg: dict[str, Any] | None = None  # the config of the checkpoint resumed from
        self.status_path = os.environ.get(ENV_STATUS)
        limit = os.environ.get(ENV_STEP_LIMIT)
        self.step_limit = int(limit) if limit else None  # the smoke test's: more steps than this is an error
        self.max_steps = min([n for n in (self.step_limit, tc.max_steps) if n], default=None)
        reported = total_steps or self.params.total_steps
        self.total_steps = min(reported, tc.max_steps) if reported and tc.max_steps else (reported or tc.max_steps)
        self.step = 0
        self.stop_reason: str | None = None
        self.status = SessionStatus(pid=os.getpid(), total_steps=self.total_steps)
        self.resumes = 0
        self.checkpoints_written = 0
        self.checkpoint_time_s = 0.0
        self.base_train_time_s = 0.0
        self.weights_sha256 = ""
        self.last_eval: dict[str, float] = {}
        self._best_unsaved: int | None = None  # the step of a new best logged but not yet saved: should_save says so
        self._saved_step: int | None = None  # the step of the last save asked for
        self._t0 = time.perf_counter()
        self._last_log: tuple[int, float] | None = None
        self._window: dict[str, list[float]] = {}
        self._window_start = 0
        self._started = False
        self.stopper = EarlyStopping(es.mode, es.patience, es.min_delta, es.enabled)
        self.ckpts = CheckpointManager(self.store, self.run_id, tc.keep_last, es.mode)
        self._shas: dict[int, str] = {}  # step -> weights hash, set by the writer thread before that step's data
        self.meter: NodeMeter | None = None
        self.metrics: MetricsWriter | None = None
        mtbp = config_mtbp(cfg)
        if self.is_main:
            swept = self.store.sweep(run_key(self.run_id))
            if swept:
                log.info("removed %d file(s) a killed writer of run %r left behind", swept, self.run_id)
            self.meter = NodeMeter.from_env(self.store, cfg, identify=identify)
            self.metrics = MetricsWriter(self.store, self.run_id)
            if self.meter is not None:  # the watchdog ends the script at the cap even while it cannot ask (a hung store)
                CapWatchdog(self.meter).start()
                if self.meter.over_cap(save_s=0.0, step_s=0.0):
                    self.stop_reason = "budget"
            mtbp = node_mtbp(self.store, cfg, self.meter.price if self.meter else None)  # as the loop plans auto
        self.schedule = CheckpointSchedule(tc.checkpoint_every, mtbp.mtbp_s, 0, mtbp.source)
        self.writer = CheckpointWriter(self.ckpts, tc.async_checkpoint,  # the metrics go up after each COMMIT
                                       self.metrics.put if self.metrics and self.metrics.upload else None)
        self.stop = StopSignal().install()
        self._boundary = StepBoundary.from_env()  # the local launcher's preemption, at exactly its step
        defer_dynamo_import()  # the script's optimizer imports torch._dynamo only if something compiles
        self._excepthook = sys.excepthook
        sys.excepthook = self._on_uncaught
        atexit.register(self.close)
        self._write_status()

    # ------------------------------------------------------------------ checkpoints
    def load_latest(self, like: Any = None) -> tuple[int, Any] | None:
        """``(step, state)`` of the run's newest complete checkpoint (the RNG streams restored as they were when
        it was saved), or None for a fresh run. ``like``: the state as the script built it (e.g. ``{"model":
        model.state_dict()}``); a checkpoint whose tensors do not fit it (keys, shapes) ends the run with exit 2."""
        loaded = self.ckpts.load_latest()
        if loaded is None:
            self._start()
            return None
        info, saved = loaded
        meta = saved.get("thrifty") if isinstance(saved, dict) else None
        if meta is None:
            raise ScriptError(f"run {self.run_id!r} has a checkpoint (step {info.step}) not written by a "
                              "thrifty session; use a new run_name")
        self._saved_cfg = json.loads(meta["config"])
        check_compatible(self.cfg, self._saved_cfg, self.run_id)
        problems = state_mismatch(saved["state"], like) if like is not None else []
        if problems:
            raise ScriptError(mismatch_message(self.run_id, info.step, problems, self._changed()))
        self.stopper.load_state_dict(meta["early_stopping"])
        self.ckpts.best_step = self.stopper.best_step
        set_rng_state(meta["rng"])
        self.step = info.step
        self.resumes, self.checkpoints_written = int(meta["resumes"]) + 1, int(meta["checkpoints_written"])
        self.checkpoint_time_s, self.base_train_time_s = float(meta["checkpoint_time_s"]), float(meta["train_time_s"])
        self.weights_sha256, self.last_eval = meta["weights_sha256"], dict(meta.get("last_eval") or {})
        if not self.total_steps and meta.get("total_steps"):
            self.total_steps = int(meta["total_steps"])
        self.schedule.follow(info.step, self.schedule.interval)
        self.status = self.status.model_copy(update={"loaded_step": info.step, "step": info.step,
                                                     "total_steps": self.total_steps})
        self._start()
        log.info("resumed run %r from step %d", self.run_id, info.step)
        return info.step, saved["state"]

    def save(self, state: Any, step: int) -> None:
        """Checkpoint ``state`` (what ``torch.load(weights_only=True)`` reads: tensors, numbers, strings, lists, dicts)
        as step ``step`` with the RNG streams and the session's state. A copy is taken now and written in the
        background (``train.async_checkpoint``), COMMIT last; a save after a stop request, and ``close``, wait."""
        step = int(step)
        self._start()
        self.step = max(self.step, step)
        if not self.is_main:
            return
        metric = best_metric_at(self.stopper, step)  # the COMMIT names the best those weights scored, if they did
        self._saved_step = step
        for_best_only = self._best_unsaved == step and not self.schedule.due(step)
        if self._best_unsaved is not None and step >= self._best_unsaved:
            self._best_unsaved = None
        meta = {"step": step, "rng": rng_state(), "early_stopping": self.stopper.state_dict(),
                "resumes": self.resumes, "checkpoints_written": self.checkpoints_written + 1,
                "checkpoint_time_s": self.checkpoint_time_s, "train_time_s": self._train_time_s(),
                "total_steps": self.total_steps, "config": self.cfg.model_dump_json(), "weights_sha256": "",
                "last_eval": self.last_eval}

        def hash_weights(snap: dict[str, Any]) -> None:  # on the writer: hashing every weight is not the step's work
            snap["thrifty"]["weights_sha256"] = self._shas[step] = state_sha256(snap["state"])
        self.checkpoints_written += 1
        if not for_best_only:  # a best's save leaves the cadence as it was
            self.schedule.follow(step, self.schedule.interval)  # the next one is due an interval from this snapshot
        self._report(self.writer.save({"state": state, "thrifty": meta}, step, metric, prepare=hash_weights,
                                      wait=self.stop_reason is not None or self.stop.signum is not None))

    def _report(self, written: list[Written]) -> None:
        """Finished writes: their checkpoint events, the auto interval, the status the wrapper reads."""
        for w in written:
            self.checkpoint_time_s += w.block_s
            self.weights_sha256 = self._shas.pop(w.step, self.weights_sha256)
            self._emit(w.event())
            plan = self.schedule.saved(w.step, w.block_s, self.step_time_s() or 0.0, write_s=w.write_s)
            if plan:
                self._emit(plan)
                log.info("auto checkpoint interval: every %d steps", plan["steps"])
            self.status = self.status.model_copy(update={"saves": self.status.saves + 1, "last_saved_step": w.step})
            self._write_status()

    def _poll(self, step: int | None = None) -> None:
        self._report(self.writer.poll(max(self.step, step or 0)) if self.writer.in_flight else [])

    def should_save(self, step: int) -> bool:
        """Whether ``step`` is due for a checkpoint: every ``train.checkpoint_every`` steps, or Young/Daly (auto), and
        at a step whose logged evaluation was a new best (those weights are the run's best: they must exist)."""
        if self.writer.waiting_on_store:  # a background write is retrying a store outage: train on
            return False
        return self.schedule.due(int(step)) or self._best_unsaved == int(step)

    # ------------------------------------------------------------------ stopping
    def should_stop(self) -> bool:
        """True once the script must save and stop: a spot notice (SIGTERM), the budget cap, early stopping, or the
        step limit (``train.max_steps``, the smoke test's). Ask after every step; save before stopping."""
        self._poll()
        if self.stop_reason is None:
            if self.stop.signum is not None:
                self.stop_reason = "signal"
            elif self.max_steps is not None and self.step >= self.max_steps:
                self.stop_reason = "step_limit"
            elif self.stopper.stopped:
                self.stop_reason = "early_stop"
            elif self.meter is not None:
                self.meter.beat()
                if self.meter.over_cap(max(self.schedule.save_s or 0.0, self.writer.stop_save_s),  # (a stop's save
                                       self.step_time_s() or 0.0):  # waits for the write in flight, then writes)
                    self.stop_reason = "budget"
            if self.stop_reason is not None:
                log.warning("session: stop requested (%s) at step %d", self.stop_reason, self.step)
        return self.stop_reason is not None

    @property
    def stopped(self) -> bool:
        """True once a stop left the run unfinished: a spot notice, the budget cap, the smoke test's step limit. The
        checkpoint is saved and the job resumes it: end the script (skip the test, the export: they need the end)."""
        return (self.stop_reason in INTERRUPTIONS or self.stop.signum is not None
                or (self.stop_reason == "step_limit" and self.step_limit is not None and self.step >= self.step_limit))

    # ------------------------------------------------------------------ metrics
    def log(self, step: int, **metrics: float) -> None:
        """Metrics of ``step``: ``loss`` and the like become the run's metric lines (every ``train.log_every``
        steps, averaged), ``val_*`` an evaluation (and early stopping on ``train.early_stopping.metric``);
        ``total_steps=N`` tells the run's length."""
        step = int(step)
        fault_point("step")  # crash tests: a kill -9 after a step, before it is logged or saved
        pace(self._last_log[1] if self._last_log else self._t0)  # tests: a fixed speed, a step since the last log
        self._start()
        self._poll(step)
        total = metrics.pop("total_steps", None)
        if total is not None:
            self.set_total_steps(int(total))
        if self.step_limit is not None and step > self.step_limit:
            raise ScriptError(f"the script went on to step {step} past the step limit {self.step_limit}: call "
                              "sess.should_stop() after every step and stop when it says so")
        values = {k: float(v) for k, v in metrics.items()}
        loss = values.get("loss")
        if loss is not None and not math.isfinite(loss):
            message = (f"the training loss became {loss} at step {step}: the run diverged. Lower the learning rate "
                       "or check the data; the last checkpoint (before it) is kept.")
            self.status = self.status.model_copy(update={"ended": "diverged", "exit_code": EXIT_BAD_INPUT,
                                                         "message": message})
            raise ScriptError(message)
        now = time.perf_counter()
        prev_step, prev_t = self._last_log or (self.step, self._t0)
        self._last_log = (step, now)
        self.step = max(self.step, step)
        self.status = self.status.logged(self.step, (now - prev_t) / (step - prev_step) if step > prev_step else None,
                                         loss, self.total_steps)
        evals = {k: v for k, v in values.items() if k.startswith("val_")}
        for k, v in values.items():
            if k not in evals:
                self._window.setdefault(k, []).append(v)
        if self._window and (step - self._window_start >= self.cfg.train.log_every or evals):
            line = {k: round(sum(v) / len(v), 6) for k, v in self._window.items()}
            st = self.step_time_s()
            self._emit({"step": step, **line, **({"step_time_s": round(st, 5)} if st else {})})
            self._window, self._window_start = {}, step
        if evals:
            self.last_eval = evals
            es = self.cfg.train.early_stopping
            best = None
            if es.metric in evals:
                best = self.stopper.update(evals[es.metric], step)
                if best:
                    self.ckpts.best_step = step
                    if self._saved_step != step:  # a script that saved before it evaluated: those weights are saved
                        self._best_unsaved = step
            self._emit({"event": "eval", "step": step, **evals, **({"best": best} if best is not None else {})})
        if self.step_limit is not None or self.status.logs == 1:
            self._write_status()
        # the local launcher's preemption lands here; should_stop() says so
        self._boundary.passed(step, self.stop, self.metrics.sync if self.metrics else None)

    def set_total_steps(self, total: int) -> None:
        """The run's length (optimizer steps), for progress and the budget projection; ``train.max_steps`` caps it."""
        cap = self.cfg.train.max_steps
        total = min(int(total), cap) if cap else int(total)
        if total != self.total_steps:
            self.total_steps = total
            self.status = self.status.model_copy(update={"total_steps": total})
            self._emit({"event": "total_steps", "step": self.step, "total_steps": total})
            self._write_status()

    def describe(self, parameters: int | None = None, examples_per_step: int | None = None) -> None:
        """What the smoke test reports of the script: its model's parameters, the examples one step trains on."""
        self.status = self.status.model_copy(update={"parameters": parameters, "examples_per_step": examples_per_step})
        self._write_status()

    def step_time_s(self) -> float | None:
        """The median seconds per step over the recent logged steps."""
        return statistics.median(self.status.step_times_s) if self.status.step_times_s else None

    # ------------------------------------------------------------------ helpers for bit-exact resume
    def seed(self, offset: int = 0) -> None:
        """Seed python, numpy and torch from ``train.seed`` (+ ``offset``); resumes restore the streams."""
        seed_everything(self.cfg.train.seed + offset)

    def batch_indices(self, step: int, n_examples: int, batch_size: int) -> np.ndarray:
        """The examples of (0-based) ``step``: epochs of a permutation that is a pure function of (seed, epoch), so
        a resumed run draws the same batches an uninterrupted one would."""
        per_epoch = n_examples // batch_size
        if per_epoch < 1:
            raise ScriptError(f"a batch of {batch_size} needs more than the {n_examples} examples given")
        epoch, pos = divmod(int(step), per_epoch)
        return epoch_permutation(n_examples, self.cfg.train.seed, epoch)[pos * batch_size:(pos + 1) * batch_size]

    @property
    def device(self) -> torch.device:
        want = self.cfg.train.device
        return torch.device("cuda" if want == "cuda" or (want == "auto" and torch.cuda.is_available()) else "cpu")

    # ------------------------------------------------------------------ the end
    def close(self) -> None:
        """End the session: its verdict (finished, interrupted, at the budget cap, or a script that lost work),
        ``summary.json`` for a finished run, the meter's final record, the lease released. Runs at exit too."""
        if self._closed:
            return
        self._closed = True
        atexit.unregister(self.close)
        try:
            try:
                self._report(self.writer.close())  # the write in flight: committed before the verdict
            except Exception as exc:  # a failed write is a failed job (restarted), never a quiet exit 0
                self._write_error = exc
            if self.stop_reason is None and self.stop.signum is not None:  # a script that exited on the notice
                self.stop_reason = "signal"  # without asking should_stop(): interrupted, never "completed"
            ended, code, message = verdict(self.status, self.stop_reason, self.step, self._crashed, self._write_error)
            if self.is_main:
                if ended in ("completed", "stopped_early"):
                    self._write_summary(ended)
                self._emit({"event": "end", "status": ended, "steps": self.step,
                            "weights_sha256": self.weights_sha256} if ended in ("completed", "stopped_early") else
                           {"event": "interrupted", "step": self.step, "reason": self.stop_reason or ended})
                if self.meter is not None:
                    self.meter.close(METER_END.get(ended, "error"))
                if self.metrics:
                    self.metrics.close()
            if message:
                (log.error if code in (EXIT_BAD_INPUT, EXIT_FAILED) else log.warning)("session: %s", message)
            self.status = self.status.model_copy(update={"closed": True, "ended": ended, "exit_code": code,
                                                         "message": message, "step": self.step})
            self._write_status()
        finally:
            self._lease.__exit__(None, None, None)

    def _write_summary(self, ended: str) -> None:
        es = self.cfg.train.early_stopping
        best = best_metric(es.metric, self.stopper, self.ckpts.committed())
        if best.step is not None and best.checkpoint_step is None:
            log.warning("session: the best %s (step %d) was not saved: the script did not call sess.save when "
                        "sess.should_save(step) said so; no checkpoint holds the best weights", es.metric, best.step)
        wall = self._train_time_s()
        summary = RunSummary(
            run_id=self.run_id, recipe=self.cfg.recipe, status=ended, steps=self.step, tags=self.cfg.tags,
            total_steps=self.total_steps or self.step, epochs=0.0, stopped_early=ended == "stopped_early",
            best_metric=best, final_metrics=self.last_eval, wall_time_s=round(wall, 3), data_wait_fraction=0.0,
            checkpoint_time_fraction=round(self.checkpoint_time_s / wall, 5) if wall else 0.0,
            checkpoints_written=self.checkpoints_written, resumes=self.resumes, precision="script",
            device=self.device.type, world_size=self.dist.world, cache_key="",
            training_fingerprint=self.cfg.training_fingerprint(), weights_sha256=self.weights_sha256)
        write_summary(self.store, summary)

    # ------------------------------------------------------------------ plumbing
    def _train_time_s(self) -> float:
        return self.base_train_time_s + (time.perf_counter() - self._t0)

    def _start(self) -> None:
        if self._started:
            return
        self._started = True
        self._window_start = self.step
        if self._last_log is None:  # step times count from here: not the script's start-up
            self._last_log = (self.step, time.perf_counter())
        self._emit({"event": "start", "step": self.step, "total_steps": self.total_steps, "resumes": self.resumes,
                    "precision": "script", "device": self.device.type, "world_size": self.dist.world,
                    "cache_key": "", "cache_hit": False, "speed_key": speed_key(self.cfg)})  # its history's key

    def _emit(self, record: dict[str, Any]) -> None:
        if self.metrics is not None:
            self.metrics.write(record)

    def _write_status(self) -> None:
        if self.status_path and self.is_main:
            self.status.write(self.status_path)

    def _on_uncaught(self, kind: type, value: BaseException, tb: Any) -> None:
        self._failed(value)
        self._excepthook(kind, value, tb)

    def _failed(self, exc: BaseException) -> None:
        """A ScriptError is a misuse with a fix to name (exit 2, never restarted), and so is a checkpoint the script's
        model cannot load (before it trained a step); anything else a crash."""
        unfit = load_failure(exc) if self.status.loaded_step is not None and self.step == self.status.loaded_step \
            else None
        if unfit is not None:
            exc = ScriptError(mismatch_message(self.run_id, self.status.loaded_step, [unfit], self._changed()))
        if isinstance(exc, ScriptError):
            if not self.status.exit_code:
                self.status = self.status.model_copy(update={"ended": "bad_input", "exit_code": EXIT_BAD_INPUT,
                                                             "message": str(exc)})
        else:
            self._crashed = True
            self.status = self.status.model_copy(update={"error": error_signature(exc)})

    def _changed(self) -> str:
        return changed_settings(self._saved_cfg or {}, self.cfg.model_dump(mode="json"))

    def __enter__(self) -> "Session":
        return self

    def __exit__(self, kind: Any, value: Any, tb: Any) -> None:
        if value is not None:
            self._failed(value)
        self.close()


def init(config: str | Path | RunConfig | None = None, *, total_steps: int | None = None) -> Session:
    """The session of this run (see ``thrifty.session``). A config or lease problem (exit 2, e.g. another trainer
    holds the run) is told to the wrapper too, so the job is not restarted for it."""
    try:
        return Session(script_config(config), total_steps=total_steps)
    except ConfigError as exc:
        if os.environ.get(ENV_STATUS):
            SessionStatus(pid=os.getpid(), closed=True, ended="bad_input", exit_code=EXIT_BAD_INPUT,
                          message=str(exc)).write(os.environ[ENV_STATUS])
        raise
