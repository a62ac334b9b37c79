"""Flow-run hooks: post the projected cost when a run starts and the final spend when it ends.

Prefect runs hooks best-effort, so they only inform: the hard stop lives in the watch loop and on
the node, with a server-side automation as the backstop for a watch loop that is gone. A hook
never raises and never blocks for long (each notification has a timeout).
"""

from __future__ import annotations

import datetime as dt
import functools
import logging
from typing import Any, Callable

from pydantic import ValidationError

from tasks.alerts import notify
from tasks.report import is_published, publish
from thrifty.numbers import hours, money
from thrifty.money import savings
from thrifty.config import ConfigError, RunConfig
from thrifty.money.pricing import age_note, quote_emulated
from thrifty.report import ends
from thrifty.report.figures import run_spend_usd
from thrifty.storage import open_store

log = logging.getLogger("thrifty.hooks")


def _never_raises(hook: Callable[..., None]) -> Callable[..., None]:
    @functools.wraps(hook)
    def wrapper(flow: Any, flow_run: Any, state: Any) -> None:
        try:
            hook(flow, flow_run, state)
        except Exception:  # noqa: BLE001 - a hook must not change the run's outcome
            log.exception("thrifty hook %s failed (ignored)", hook.__name__)
    return wrapper


def _logger(flow: Any, flow_run: Any) -> logging.Logger | logging.LoggerAdapter:
    try:
        from prefect.logging.loggers import flow_run_logger

        return flow_run_logger(flow_run, flow)
    except Exception:  # noqa: BLE001
        return log


def _config(flow_run: Any) -> RunConfig | None:
    """The run's config as the flow resolves it, or None when its parameters do not validate (the run failed on
    them before anything was spent, and said why)."""
    raw = flow_run.parameters.get("config", {})
    try:
        cfg = raw if isinstance(raw, RunConfig) else RunConfig.model_validate(raw or {})
        when = flow_run.expected_start_time  # the flow resolves '{date}' from the same scheduled time
        return cfg.resolved(when.date() if when else dt.datetime.now(dt.timezone.utc).date())
    except (ValidationError, ConfigError):
        return None


def running_message(cfg: RunConfig) -> str:
    b = cfg.budget
    parts = [f"run {cfg.run_name} starting: budget ${b.max_usd:g}"]
    if cfg.compute.launcher == "local":
        q = quote_emulated(cfg.compute.emulate, cfg.compute.use_spot)
        rate = q.usd_per_hour * cfg.compute.num_nodes
        parts.append(f"burning {money(rate)}/h on {q.cloud} {q.instance} {'spot' if q.spot else 'on-demand'} "
                     f"({age_note()}), so the budget covers {hours(b.max_usd / rate)}")
    last = savings.read(open_store(cfg.store), cfg.run_name)
    if last is not None:
        parts.append(f"so far it has cost {money(last.actual_usd)}")
    return "; ".join(parts)


ENDS = {name: ends.WHAT[kind] for name, kind in ends.KIND_OF_STATE.items()}  # a final state's name, in words


def final_message(cfg: RunConfig, state_name: str, state_message: str | None) -> str:
    """The run's end in its one sentence (thrifty.report.ends): the state's message when the flow said it, else
    its report's, else made now from the ledger."""
    if ends.says_itself(state_message, cfg.run_name):
        return state_message or ""
    store = open_store(cfg.store)
    figures = savings.read(store, cfg.run_name)
    if state_name == "Completed" and figures is not None and figures.end:
        return figures.end
    kind = ends.KIND_OF_STATE.get(state_name, "failed")
    return ends.sentence(kind, cfg.run_name, run_spend_usd(store, cfg.run_name), cfg.budget.max_usd,
                         state_message or "")


@_never_raises
def announce_projection(flow: Any, flow_run: Any, state: Any) -> None:
    """on_running: what the run may cost."""
    cfg = _config(flow_run)
    if cfg is None:
        return
    message = running_message(cfg)
    _logger(flow, flow_run).info("budget: %s", message)
    notify(cfg.budget.notify, f"Thrifty: {cfg.run_name} started", message)


@_never_raises
def post_final_cost(flow: Any, flow_run: Any, state: Any) -> None:
    """on_completion / on_failure / on_crashed / on_cancellation: the end's sentence (its spend, what to do next),
    once, to the run's notification blocks; the report first when the flow never wrote it (it crashed)."""
    cfg = _config(flow_run)
    if cfg is None:
        return
    kind = ends.KIND_OF_STATE.get(state.name, "failed")
    if not is_published(flow_run.id) and kind != "completed":  # the flow died before its report: write it now
        try:
            message = publish(cfg, kind, state.message or "", flow_run_id=flow_run.id)[0]
        except Exception:  # noqa: BLE001 - the end is still said
            log.exception("could not write the report of run %s", cfg.run_name)
            message = final_message(cfg, state.name, state.message)
    else:
        message = final_message(cfg, state.name, state.message)
    _logger(flow, flow_run).info("budget: %s", message)
    notify(cfg.budget.notify, f"Thrifty: {cfg.run_name} {ends.WHAT[kind]}", message)


def sweep_message(flow_run: Any, state: Any) -> tuple[str, list[str]] | None:
    """A search's end in one sentence (its spend over every trial's ledger, its best, what next), and where to
    send it (the base config's ``budget.notify``)."""
    from thrifty.sweep import SweepConfig, best_trial, load_state

    raw = flow_run.parameters.get("config", {})
    try:
        cfg = raw if isinstance(raw, SweepConfig) else SweepConfig.model_validate(raw or {})
    except (ValidationError, ConfigError):
        return None
    store = open_store(cfg.base.store)
    spent = sum(run_spend_usd(store, cfg.run_name(i)) for i in range(cfg.max_trials))
    what = ENDS.get(state.name, state.name.lower())
    text = f"sweep {cfg.name} {what}: spent {money(spent)} of its ${cfg.max_usd:g} cap"
    if state.name == "Completed":
        best = best_trial(load_state(store, cfg).trials, cfg.rank_mode)
        text += (f"; best {best.run_name} {best.values}: {cfg.rank_metric} {best.ranking_value():.5g}. Next: train or "
                 "deploy its config (the flow's result; `thrifty sweep` prints it); its gold weights stay hot"
                 if best else "; no trial trained to its end. Next: start it again with larger caps (the same name "
                              "reruns nothing that finished)")
    else:
        text += (f"; {state.message}" if state.message else "") + (
            ". Next: start it again with the same name: it reruns nothing that finished, and a trial that was "
            "training resumes from its checkpoint")
    return text, cfg.base.budget.notify


@_never_raises
def post_sweep_end(flow: Any, flow_run: Any, state: Any) -> None:
    """The search's end, once, to its notification blocks."""
    said = sweep_message(flow_run, state)
    if said is None:
        return
    message, targets = said
    _logger(flow, flow_run).info("%s", message)
    notify(targets, f"Thrifty: {message.split(':', 1)[0]}", message)
