"""Runs that follow runs: the previous run of a schedule (``init_from: previous``) and the from-scratch run a warm
start's weights descend from (the savings reference). Pure reads of summaries and metric lines; no torch.

A schedule is a ``run_name`` with ``{date}`` (``nightly-{date}``): its runs are the names that template matches,
ordered by their date.
"""

from __future__ import annotations

import datetime as dt
import re
from dataclasses import dataclass

from thrifty.config import ConfigError, RunConfig
from thrifty.runs.records import read_metrics, read_summary
from thrifty.runs.reuse import WarmStart
from thrifty.storage import Store

FINISHED = ("completed", "stopped_early")
_DATE = re.compile(r"\d{8}")


def schedule_pattern(template: str) -> re.Pattern[str]:
    """``nightly-{date}`` -> a pattern whose one group is the date of a run of that schedule."""
    return re.compile("^" + re.escape(template).replace(re.escape("{date}"), r"(\d{8})", 1) + "$")


def template_of(run_name: str) -> str | None:
    """The schedule a resolved name belongs to: its last 8-digit date replaced by ``{date}``, or None without one."""
    for m in reversed(list(_DATE.finditer(run_name))):
        try:
            dt.datetime.strptime(m.group(0), "%Y%m%d")
        except ValueError:
            continue
        return run_name[: m.start()] + "{date}" + run_name[m.end():]
    return None


def run_ids(store: Store) -> list[str]:
    """Every run with a summary (a finished one) in the store."""
    return sorted({o.key.split("/")[1] for o in store.list("runs/") if o.key.count("/") == 2
                   and o.key.endswith("/summary.json")})


def previous_run(store: Store, template: str, this_run: str) -> str | None:
    """The newest finished run of the schedule ``template`` dated before ``this_run`` (None when there is none)."""
    pattern = schedule_pattern(template)
    mine = pattern.match(this_run)
    if mine is None:
        return None
    earlier = sorted(((m.group(1), name) for name in run_ids(store) if (m := pattern.match(name))
                      and m.group(1) < mine.group(1)), reverse=True)
    for _, name in earlier:
        summary = read_summary(store, name)
        if summary is not None and summary.status in FINISHED:
            return name
    return None


def resolve_previous(store: Store, cfg: RunConfig, template: str | None = None) -> tuple[RunConfig, str]:
    """``cfg`` with ``train.init_from: previous`` replaced by the previous run's gold weights (``run:NAME:gold``), or
    by nothing on a schedule's first night; and a sentence saying which. ``template``: the run_name before its
    ``{date}`` was resolved (the flow knows it); else it is read off the resolved name."""
    if cfg.train.init_from != "previous":
        return cfg, ""
    template = template if template and "{date}" in template else template_of(cfg.run_name)
    if template is None:
        raise ConfigError(f"'train.init_from': 'previous' means the newest finished run of the same schedule, but "
                          f"run_name {cfg.run_name!r} is not one (give it '{{date}}', e.g. nightly-{{date}}), or name "
                          "the source: init_from: run:NAME")
    before = previous_run(store, template, cfg.run_name)
    train = cfg.train.model_dump(mode="json")
    if before is None:
        train.update(init_from=None, init_prefixes=[])
        return (cfg.updated({"train": train}, "init_from: previous resolved"),
                f"no earlier finished run of schedule {template!r} in {store.uri}: {cfg.run_name} trains from scratch")
    train["init_from"] = f"run:{before}:gold"
    return (cfg.updated({"train": train}, "init_from: previous resolved"),
            f"{cfg.run_name} starts from the gold weights of {before}, the newest finished run of schedule {template!r}")


@dataclass(frozen=True)
class Reference:
    run: str  # the from-scratch run
    steps: int  # its steps to reach the metric (all it trained, when it never did)
    reached: bool


def scratch_root(store: Store, run: str | None) -> str | None:
    """Follow warm starts back from ``run`` to the run that trained from scratch (None: the chain leaves the store
    or is unfinished)."""
    seen: set[str] = set()
    while run is not None and run not in seen:
        seen.add(run)
        summary = read_summary(store, run)
        if summary is None:
            return None
        if summary.init_from is None:
            return run
        run = summary.init_from.run
    return None


def steps_to_reach(store: Store, run: str, metric: str, mode: str, value: float) -> Reference | None:
    """The first evaluated step at which ``run`` reached ``value`` of ``metric`` (or all its steps, when it never
    did); None without a summary."""
    summary = read_summary(store, run)
    if summary is None:
        return None
    for rec in sorted((r for r in read_metrics(store, run) if r.get("event") == "eval" and metric in r),
                      key=lambda r: r["step"]):
        v = rec[metric]
        if isinstance(v, (int, float)) and (v <= value if mode == "min" else v >= value):
            return Reference(run, int(rec["step"]), True)
    return Reference(run, summary.steps, False)


def with_reference(store: Store, warm: WarmStart, steps: int, metric: str, mode: str,
                   value: float | None) -> WarmStart:
    """``warm`` with its savings reference: the steps the from-scratch run it descends from needed to reach
    ``value`` against the ``steps`` this run trained."""
    root = scratch_root(store, warm.run)
    ref = steps_to_reach(store, root, metric, mode, value) if root is not None and value is not None else None
    if ref is None:
        return warm
    return warm.model_copy(update={"reference_run": ref.run, "reference_steps": ref.steps,
                                   "reference_reached": ref.reached,
                                   "steps_not_trained": max(0, ref.steps - steps)})
