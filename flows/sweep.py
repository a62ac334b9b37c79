"""The thrifty-sweep flow: a hyperparameter search under hard caps, each trial a thrifty-train child flow run.

Successive halving (thrifty.sweep.scheduler): every trial trains to the first milestone, the best 1/eta go on.
A trial is a normal run named ``<sweep>-tNNN`` (cache shared, spot launch, ledger, resume); a promotion
relaunches it with a larger ``train.stop_at_epoch`` and it continues from its checkpoint on the same LR
schedule. Each launch gets ``budget.max_usd`` = its run's spend + an allowance the search's remaining money
covers (thrifty.sweep.caps), so the search's spend stays under ``max_usd`` by construction. A killed search
started again reruns nothing finished: the store says what each trial reached.
"""

from __future__ import annotations

import contextvars
import math
import time
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from typing import Any

from prefect import flow, get_run_logger
from prefect.states import Failed, State

from flows.hooks import post_sweep_end
from flows.train_pipeline import StepFailed, outcome_of, step, train_trial
from tasks.budget import estimate_for
from tasks.launch import request_stop
from tasks.errors import BAD_INPUT, USER_ERRORS, bad_input
from tasks.preprocess import preprocess
from tasks.smoke import smoke
from tasks.sweep_report import mark_gold, sweep_report
from thrifty.runs import checkpoints, lease
from thrifty.money.estimate import smallest_budget_usd
from thrifty.money.budget import gpus_per_node, stop_reserve_s
from thrifty.config import ConfigError, RunConfig
from thrifty.money.ledger import read_meters
from thrifty.launchers.preflight import check_before_spending
from thrifty.results import PrepResult, SmokeResult
from thrifty.storage import Store, open_store
from thrifty.numbers import metric, money, pairs
from thrifty.sweep import (Need, SweepConfig, SweepState, TrialState, best_trial, leader, load_state, measured_per_epoch,
                           need_for, next_job, observe, refusal, save_state, settle)
from thrifty.sweep.report import SweepResult
from training.validate import check_config

LEASE_TTL_S = 60.0  # one search per name: a second start while this one lives is refused
MAX_CAP_STOPS = 2  # a milestone's jobs its own cap may stop before the trial counts as failed
ORPHAN_WAIT_S = 120.0  # a killed search's local job ends by itself at its milestone or cap; wait this long for it


def sweep_run_name() -> str:
    from prefect.runtime import flow_run

    raw = (flow_run.parameters or {}).get("config")
    name = raw.name if isinstance(raw, SweepConfig) else (raw or {}).get("name") if isinstance(raw, dict) else None
    return f"sweep-{name or 'digits-sweep'}"


@flow(name="thrifty-sweep", flow_run_name=sweep_run_name, log_prints=True, on_completion=[post_sweep_end],
      on_failure=[post_sweep_end], on_crashed=[post_sweep_end], on_cancellation=[post_sweep_end])
def sweep(config: SweepConfig = SweepConfig(), poll_s: float = 1.0) -> SweepResult:
    """Search RunConfig fields by successive halving without spending past the caps: dollars, GPU-hours, wall
    clock, trials. Each trial is a thrifty-train child flow run; the best trial's weights are marked gold.

    Args:
        config: The SweepConfig: the base RunConfig, the space, the rungs (min_epochs, eta, max_epochs), the caps.
        poll_s: Seconds between each trial's looks at its job (s); each trial keeps this much burn in reserve.
    """
    try:
        return search(config, poll_s)
    except StepFailed as failed:
        name = BAD_INPUT if failed.state.name == BAD_INPUT else "Failed"
        return Failed(name=name, message=failed.state.message)  # type: ignore[return-value]
    except USER_ERRORS as exc:
        return bad_input(exc)  # type: ignore[return-value]


class Search:
    """One search's moving parts: the store, its state, the smoke test per model shape, the caps."""

    def __init__(self, config: SweepConfig, poll_s: float, store: Store, state: SweepState, logger: Any):
        self.config, self.poll_s, self.store, self.state, self.logger = config, poll_s, store, state, logger
        self.rungs = config.rungs()
        self.ready: dict[str, tuple[PrepResult, SmokeResult]] = {}
        self.deadline = state.started_unix + config.max_wall_h * 3600.0 if config.max_wall_h else None
        self.deadline_hit = False

    @property
    def trials(self) -> list[TrialState]:
        return self.state.trials

    def decide(self, text: str, warn: bool = False) -> None:
        (self.logger.warning if warn else self.logger.info)("%s", text)
        self.state.decisions.append(f"{time.strftime('%H:%M:%S')} {text}")

    def save(self) -> None:
        save_state(self.store, self.state)

    def prepared(self, index: int) -> tuple[PrepResult, SmokeResult]:
        """The cache entry and the smoke test of this trial's model shape: once per distinct shape."""
        key = self.config.shape_key(index)
        if key not in self.ready:
            cfg = self.config.trial(index, stop_at_epoch=self.rungs[0])
            prep = outcome_of(preprocess(cfg, return_state=True))
            result = step(smoke, cfg)
            self.ready[key] = (prep, result)
        return self.ready[key]

    def plan(self, t: TrialState, target: int) -> tuple[RunConfig, Need, SmokeResult]:
        """The job's config (without its caps yet) and what it needs from the caps."""
        prep, smoke_result = self.prepared(t.index)
        cfg = self.config.trial(t.index, stop_at_epoch=target)
        est = estimate_for(cfg, prep, smoke_result)  # from the run's newest checkpoint to the milestone
        reserve_s = stop_reserve_s(cfg, self.poll_s)
        reserve_usd = reserve_s / 3600.0 * est.usd_per_hour
        shape = self.config.shape_key(t.index)  # speeds measured by trials of this model shape only
        usd_epoch, hours_epoch = measured_per_epoch([x for x in self.trials if self.config.shape_key(x.index) == shape])
        high = est.high_usd / est.usd if est.usd > 0 and math.isfinite(est.high_usd) else 3.0
        first, _ = smallest_budget_usd(est, reserve_s, cfg.train.checkpoint_every)
        first_high = (first - reserve_usd) * high + reserve_usd  # to its first checkpoint, at the range's high end
        # each time its own cap stopped this milestone's job, the headroom doubles, and the next job is given at
        # least twice what those jobs spent: the estimate was short
        need = need_for(est.usd, est.hours, reserve_usd, gpus_per_node(cfg) * cfg.compute.num_nodes,
                        self.config.reserve_factor * 2 ** t.cap_stops, target - t.reached, usd_epoch, hours_epoch,
                        first_high, stopped_usd=t.spent_usd - t.milestone_usd if t.cap_stops else 0.0)
        return cfg, need, smoke_result

    def stop_at_deadline(self, in_flight: list[TrialState]) -> None:
        """The wall clock ran out: each job in flight is stopped the graceful way its launcher has (a checkpoint,
        then the end: a local job's SIGTERM, a SkyPilot job's stop request and cancel); it keeps its checkpoint
        and the trial is launched no more."""
        self.deadline_hit = True
        for t in in_flight:
            request_stop(t.run_name, f"the search {self.config.name}'s max_wall_h is up")
            self.decide(f"{t.run_name}: the search's max_wall_h is up; its job is told to checkpoint and stop",
                        warn=True)

    def wait_for_orphan(self, t: TrialState) -> bool:
        """A job a killed search left running trains on its own until its milestone or cap; let it end first.
        True once no job of the trial is alive."""
        give_up = time.time() + ORPHAN_WAIT_S
        said = False
        while time.time() < give_up and any(not m.gone(time.time()) for m in read_meters(self.store, t.run_name)):
            if not said:
                self.logger.info("%s: a job the stopped search started is still training; waiting for it to end "
                                 "(at its milestone or cap, up to %.0f s)", t.run_name, ORPHAN_WAIT_S)
                said = True
            time.sleep(1.0)
        return not any(not m.gone(time.time()) for m in read_meters(self.store, t.run_name))


def check_sweep(config: SweepConfig) -> None:
    """Everything a search could fail on before it launches anything (ConfigError, exit 2): every trial built, the
    launcher, prices and store, each model shape's recipe options, and the ranking metric."""
    config.check_trials()  # the UI's form skips build_sweep: every trial is built again here
    first = config.trial(0, stop_at_epoch=config.rungs()[0])
    check_before_spending(first)
    for index in {config.shape_key(i): i for i in range(config.max_trials)}.values():
        recipe, _ = check_config(config.trial(index, stop_at_epoch=config.rungs()[0]))
        if recipe is not None and config.rank_metric not in recipe.metric_names():
            raise ConfigError(f"'metric': recipe {recipe.name!r} reports {', '.join(recipe.metric_names())}, not "
                              f"{config.rank_metric!r}. Pick one of those.")


def search(config: SweepConfig, poll_s: float) -> SweepResult:
    logger = get_run_logger()
    check_sweep(config)
    store = open_store(config.base.store)
    held = lease.acquire(store, f"sweep.{config.name}", f"sweep flow of {config.name}", ttl_s=LEASE_TTL_S)
    beat = lease.Heartbeat(held, 10.0)
    try:
        state = load_state(store, config)
        s = Search(config, poll_s, store, state, logger)
        resumed = [t for t in state.trials if t.cap_usd is not None]
        for t in resumed:  # it was running when the search stopped
            if s.wait_for_orphan(t):
                t.cap_usd = t.cap_gpu_hours = None  # its job is over: all it spent is in its ledger
            else:  # a job elsewhere trains on under the cap it was given: that cap stays committed (caps.py)
                s.decide(f"{t.run_name}: its job from the stopped search is still training; its cap "
                         f"{money(t.cap_usd)} stays reserved until the trial's relaunch re-attaches to it", warn=True)
        for t in state.trials:
            observe(store, config, t)
        logger.info("sweep %s: %d trial(s), rungs %s epochs, eta %d, up to %d at once; caps $%g%s%s%s", config.name,
                    config.max_trials, s.rungs, config.eta, config.concurrency, config.max_usd,
                    f", {config.max_gpu_hours:g} GPU-h" if config.max_gpu_hours else "",
                    f", {config.max_wall_h:g} h" if config.max_wall_h else "",
                    f"; resumed ({sum(t.reached > 0 for t in state.trials)} trial(s) with results)"
                    if any(t.reached for t in state.trials) else "")
        s.save()
        run_trials(s)
        best = best_trial(state.trials, config.rank_mode)
        state.best = best.index if best else None
        state.ended = True
        gold = mark_gold(store, config, best) if best else None
        if best:
            s.decide(f"best: {best.run_name} ({pairs(best.values)}) {config.rank_metric}={metric(best.ranking_value())} "
                     f"(trained to its end, epoch {best.reached}); gold: {gold or 'no checkpoint'}")
        elif (ahead := leader(state.trials, config.rank_mode)) is not None:
            s.decide(f"no best: no trial trained to its end; {ahead.run_name} ({pairs(ahead.values)}) leads at epoch "
                     f"{ahead.reached} ({config.rank_metric}={metric(ahead.ranking_value())}). Start the search again "
                     "with larger caps to train it on", warn=True)
        s.save()
        return sweep_report(config, state, gold)
    finally:
        beat.stop()
        held.release()


def run_trials(s: Search) -> None:
    """Launch what the scheduler asks for, as far as the caps allow, up to ``concurrency`` at once."""
    config, trials = s.config, s.trials
    in_flight: dict[Future, tuple[TrialState, int]] = {}
    with ThreadPoolExecutor(max_workers=config.concurrency, thread_name_prefix="trial") as pool:
        while True:
            for t, _ in in_flight.values():
                observe(s.store, config, t)  # its spend so far (its cap bounds what it may add)
            for said in settle(trials, s.rungs, config.eta, config.rank_mode):
                s.decide(said)
            while len(in_flight) < config.concurrency:
                job = next_job(trials, s.rungs, config.eta, config.rank_mode)
                if job is None:
                    break
                t, target = trials[job[0]], job[1]
                try:
                    cfg, need, smoke_result = s.plan(t, target)
                except StepFailed as failed:  # this shape's smoke test failed: its trials cannot run
                    t.status, t.note = "failed", f"smoke test failed: {failed.state.message}"
                    s.decide(f"{t.run_name}: {t.note}", warn=True)
                    continue
                why = refusal(need, trials, config.max_usd, config.max_gpu_hours, s.deadline, time.time())
                if why and in_flight:
                    break  # what a job in flight leaves unspent comes back when it ends
                if why:
                    t.status, t.note = "out_of_budget", f"not launched to epoch {target}: {why}"
                    s.decide(f"{t.run_name}: {t.note}", warn=True)
                    continue
                caps = {"max_usd": round(t.spent_usd + need.usd, 8)}
                if config.max_gpu_hours is not None:
                    caps["max_gpu_hours"] = round(t.gpu_hours + need.gpu_hours, 8)
                job_cfg = cfg.updated({"budget": {**cfg.budget.model_dump(mode="json"), **caps}},
                                      f"sweep {config.name} trial {t.index}")
                t.status, t.target, t.launches = "running", target, t.launches + 1
                t.cap_usd, t.cap_gpu_hours = job_cfg.budget.max_usd, job_cfg.budget.max_gpu_hours
                s.decide(f"{t.run_name} ({pairs(t.values)}): to epoch {target} (from {t.reached}), budget.max_usd "
                         f"{money(t.cap_usd)} ({need.why}; {money(t.spent_usd)} spent before)")
                s.save()  # the cap is on record before the job exists: a killed search still counts it
                context = contextvars.copy_context()  # each child flow run sees this flow run as its parent
                in_flight[pool.submit(context.run, train_trial, config=job_cfg, poll_s=s.poll_s,
                                      smoke_result=smoke_result, return_state=True)] = (t, target)
            s.save()
            if not in_flight:
                return
            timeout = None if s.deadline is None or s.deadline_hit else max(0.0, s.deadline - time.time())
            done, _ = wait(list(in_flight), timeout=timeout, return_when=FIRST_COMPLETED)
            if not done:  # the deadline came with jobs in flight
                s.stop_at_deadline([t for t, _ in in_flight.values()])
            for future in done:
                t, target = in_flight.pop(future)
                settled(s, t, target, future)


def settled(s: Search, t: TrialState, target: int, future: Future) -> None:
    """A trial's job ended: what it reached, from the store, and what becomes of it."""
    try:
        state: State = future.result()
        message, name = state.message or "", state.name
    except Exception as exc:  # noqa: BLE001 - one trial's crash must not stop the search (its cap still held)
        message, name = f"{type(exc).__name__}: {exc}", "Crashed"
    t.status, t.cap_usd, t.cap_gpu_hours = "paused", None, None
    observe(s.store, s.config, t)
    if t.status == "finished":
        s.decide(f"{t.run_name}: finished, {s.config.rank_metric}={metric(t.ranking_value())} ({t.note}); "
                 f"{money(t.spent_usd)} in all")
    elif t.reached >= target:  # (observe cleared its target and cap stops)
        t.note = f"epoch {target}: {s.config.rank_metric}={metric(t.score(target))}"
        s.decide(f"{t.run_name}: reached {t.note}; {money(t.spent_usd)} in all")
    elif s.deadline_hit:  # stopped at the search's deadline: paused with its checkpoint, never launched again
        t.note = f"stopped at the search's deadline before epoch {target}; its checkpoint is kept"
        s.decide(f"{t.run_name}: {t.note}", warn=True)
    elif name == "StoppedAtCap" and t.cap_stops < MAX_CAP_STOPS:
        # the estimate was short (a loaded machine): its checkpoint (if any) is kept, and it goes again first with
        # twice the headroom and what it measured, if the search's caps can cover that
        t.cap_stops += 1
        saved = checkpoints.committed(s.store, t.run_name)
        where = (f"from its checkpoint at step {saved[-1].step}" if saved else
                 "from the start: it had no checkpoint yet")
        t.note = f"its cap stopped it before epoch {target}; relaunched {where}, with twice the headroom"
        s.decide(f"{t.run_name}: {t.note}", warn=True)
    else:
        t.status, t.target = "failed", None
        t.note = (f"stopped at its budget cap before epoch {target} {t.cap_stops + 1} times" if name == "StoppedAtCap"
                  else f"ended {name} before epoch {target}: {message}")
        s.decide(f"{t.run_name}: {t.note}", warn=True)
