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
from thrifty.money import savings
from thrifty.money.budget import spend_usd
from thrifty.config import ConfigError, RunConfig
from thrifty.money.ledger import read_attempts
from thrifty.money.pricing import age_note, quote_emulated
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


def _duration(hours: float) -> str:
    """A readable span that never rounds a real one to nothing ('0.0 h', '0 s')."""
    seconds = hours * 3600
    if hours >= 1:
        return f"{hours:.1f} h"
    if seconds >= 60:
        return f"{seconds / 60:.1f} min"
    return f"{seconds:.0f} s" if seconds >= 10 else f"{seconds:.2g} s"


def running_message(cfg: RunConfig) -> str:
    b = cfg.budget
    parts = [f"run {cfg.run_name} starting: budget ${b.max_usd:g}"]
    if cfg.compute.launcher == "local":
        q = quote_emulated(cfg.compute.emulate, cfg.compute.use_spot)
        rate = q.usd_per_hour * cfg.compute.num_nodes
        parts.append(f"burning ${rate:.3f}/h on {q.cloud} {q.instance} {'spot' if q.spot else 'on-demand'} "
                     f"({age_note()}), so the budget covers {_duration(b.max_usd / rate)}")
    last = savings.read(open_store(cfg.store), cfg.run_name)
    if last is not None:
        parts.append(f"so far it has cost ${last.actual_usd:.4f}")
    return "; ".join(parts)


ENDS = {"StoppedAtCap": "stopped at its budget cap", "BadInput": "refused its input", "Completed": "completed"}


def final_message(cfg: RunConfig, state_name: str, state_message: str | None) -> str:
    store = open_store(cfg.store)
    attempts = read_attempts(store, cfg.run_name)
    spent = spend_usd(attempts)
    text = (f"run {cfg.run_name} {ENDS.get(state_name, state_name.lower())}: spent ${spent:.4f} of its "
            f"${cfg.budget.max_usd:g} budget ({spent / cfg.budget.max_usd:.0%}) over {len(attempts)} attempt(s)")
    figures = savings.read(store, cfg.run_name)
    if figures is not None and state_name == "Completed":
        text += f"; saved ${figures.saved_usd:.4f} ({figures.saved_fraction:.0%}) against the naive way"
    if state_message and state_name != "Completed":
        text += f". {state_message}"
    return text


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
    """on_completion / on_failure / on_crashed / on_cancellation: final spend, budget use and savings."""
    cfg = _config(flow_run)
    if cfg is None:
        return
    message = final_message(cfg, state.name, state.message)
    _logger(flow, flow_run).info("budget: %s", message)
    notify(cfg.budget.notify, f"Thrifty: {cfg.run_name} {ENDS.get(state.name, state.name.lower())}", message)
