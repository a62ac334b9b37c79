"""An archival pass against a real store: read its runs, plan, move objects to the cold tier, restore them."""

from __future__ import annotations

import datetime as dt
import json
import logging
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Callable

from thrifty.runs import checkpoints, lease
from thrifty.archive.plan import (_RUN, COMMIT_NAMES, ArchiveSettings, Item, Plan, Policy, RunFacts, check_run_id, plan,
                                  utcnow)
from thrifty.config import ConfigError
from thrifty.faults import fault_point
from thrifty.money.ledger import read_attempts
from thrifty.runs import read_jsonl, run_key, summary_best_step
from thrifty.storage import Archived, NotFound, ObjectInfo, RestoreStatus, Store, StoreError, check_store, is_cold, open_store

log = logging.getLogger("thrifty.archive")

# ------------------------------------------------------------------------------------------- reading a store


def run_facts(store: Store, run_id: str, objects: list[ObjectInfo], now: dt.datetime | None = None) -> RunFacts:
    """What the planner needs about one run; ``now`` (default: the real clock) judges whether its lease is live."""
    try:
        running = any(a.ended_unix is None for a in read_attempts(store, run_id))
    except (Archived, json.JSONDecodeError, TypeError):  # unreadable: assume the worst
        running = True
    try:
        held = lease.read(store, run_id)
    except Archived:  # an archived lease.json (archival never moves one): held, to be safe
        leased = True
    else:
        leased = held is not None and held.live((now or utcnow()).timestamp())
    infos = checkpoints.committed(store, run_id)
    hot = [c for c in infos if not c.archived]
    best = checkpoints.best(hot, checkpoints.mode_of(hot))
    steps = {best.step} if best else set()
    summary_best = summary_best_step(store, run_id)
    if summary_best is not None:
        steps.add(summary_best)
    last = max((o.last_modified for o in objects if not is_cold(o.storage_class)), default=None)
    facts = RunFacts(running, last, infos[-1].step if infos else None, frozenset(steps), leased)
    if facts.live(now or utcnow()):  # a live run's shards stay where it reads them
        facts.cache_keys = _cache_keys(store, objects)
    return facts


def _cache_keys(store: Store, objects: list[ObjectInfo]) -> frozenset[str]:
    """The cache entries named by the start records of the run's newest metrics file."""
    metrics = [o for o in objects if "/metrics/" in o.key and o.key.endswith(".jsonl") and not is_cold(o.storage_class)]
    if not metrics:
        return frozenset()
    newest = max(metrics, key=lambda o: o.last_modified)
    return frozenset(str(r["cache_key"]) for r in read_jsonl(store, newest.key)
                     if r.get("event") == "start" and r.get("cache_key"))


def _runs_of(objects: list[ObjectInfo]) -> dict[str, list[ObjectInfo]]:
    runs: dict[str, list[ObjectInfo]] = defaultdict(list)
    for o in objects:
        if m := _RUN.match(o.key):
            runs[m.group(1)].append(o)
    return runs


def open_checked(settings: ArchiveSettings, writable: bool = True) -> Store:
    """The store; ``writable`` checks it first with a probe write, so a credential that may not write fails
    before anything moves. A dry run needs only list and read (read-only credentials do), and a listing
    error names the store and the fix just the same."""
    try:
        if writable:
            check_store(settings.store)
        return open_store(settings.store)
    except StoreError as exc:
        raise ConfigError(str(exc)) from None


def scan(store: Store, settings: ArchiveSettings, now: dt.datetime | None = None) -> Plan:
    """List the store's runs and cache and plan the pass. ``now`` is the real clock (tests move it; no option does):
    live runs and fresh cache entries are judged by it whatever ``settings.as_of`` says."""
    now = now or utcnow()
    as_of = settings.as_of or now
    objects = store.list("runs/") + store.list("cache/")
    runs = {run_id: run_facts(store, run_id, objs, now) for run_id, objs in _runs_of(objects).items()}
    return plan(objects, runs, Policy.load(store), settings, as_of, now)


# ------------------------------------------------------------------------------------------- moving


@dataclass
class Outcome:
    moved: list[Item] = field(default_factory=list)
    left_alone: list[tuple[Item, str]] = field(default_factory=list)  # changed since the scan: not touched
    failed: list[tuple[Item, str]] = field(default_factory=list)

    @property
    def bytes_moved(self) -> int:
        return sum(i.size for i in self.moved)


def apply(store: Store, p: Plan, progress: Callable[[int, int, Item], None] | None = None) -> Outcome:
    """Move the plan's objects to its target class, group by group, commit records first.

    Before a run's checkpoints move, its ledger and checkpoints are read again: a run that started
    or wrote a checkpoint since the scan is left alone (the next pass will see it as it is).
    """
    out = Outcome()
    todo = p.to_archive
    rechecked: dict[str, bool] = {}
    failed_groups: set[str] = set()
    for n, item in enumerate(todo, 1):
        if progress:
            progress(n, len(todo), item)
        ckpt = checkpoints.parse_key(item.key)
        if ckpt:
            run_id = ckpt[0]
            if run_id not in rechecked:
                now = max(p.now or utcnow(), utcnow())  # a plan made with a moved clock keeps it
                fresh = run_facts(store, run_id, store.list(run_key(run_id) + "/"), now)
                rechecked[run_id] = (run_id not in p.runs or fresh.fingerprint() == p.runs[run_id].fingerprint()) \
                    and not fresh.live(now)
            if not rechecked[run_id]:
                out.left_alone.append((item, f"run {run_id} changed since the scan, or is live"))
                continue
        if item.group in failed_groups:  # its commit record did not move: leave the rest of it hot too
            out.left_alone.append((item, "an earlier object of its group failed"))
            continue
        try:
            store.set_storage_class(item.key, p.target_class)
        except NotFound:
            out.left_alone.append((item, "gone since the scan"))
        except Exception as exc:  # keep going; every failure is reported and the pass ends failed
            log.warning("could not archive %s: %s", item.key, exc)
            out.failed.append((item, f"{type(exc).__name__}: {exc}"))
            failed_groups.add(item.group)
        else:
            out.moved.append(item)
            fault_point("archive_move")  # crash tests: THRIFTY_FAULT=archive_move:<n> kills the pass here
    return out


# ------------------------------------------------------------------------------------------- restore


def restore_run(store: Store, run_id: str, *, priority: str = "standard", days: int = 7) -> list[RestoreStatus]:
    """Start (or finish) restoring every cold object of a run: data first, commit records last."""
    objects = store.list(f"runs/{check_run_id(run_id)}/")
    if not objects:
        raise ConfigError(f"no run {run_id!r} in {store.uri}; `thrifty report` lists the runs of a store")
    cold = sorted((o for o in objects if is_cold(o.storage_class)),
                  key=lambda o: (o.key.rpartition("/")[2] in COMMIT_NAMES, o.key))
    return [store.restore(o.key, priority=priority, days=days) for o in cold]
