"""Stale-artifact archival: old checkpoints and cache entries to a cold tier, gold weights kept hot.

``scan`` reads a store (listing, ledgers, checkpoint commit records, the user's marks in
``archive-policy.json``) and ``plan`` decides object by object, as a pure function of those and a
clock (``as_of``). Never archived: a run's best checkpoint and anything marked gold; the latest
complete checkpoint of a run that is running or was active within the window; cache entries
used within ``older_than_days``; anything pinned; run metadata (ledger, metrics, summary, logs),
which stays readable so every run can still be listed and reported.

A checkpoint or cache entry moves whole, its commit record (``COMMIT``, ``manifest.json``) first:
a reader sees it complete and hot, or archived, never torn. Each move is one storage-class change
of one object, and objects already cold are skipped, so a run killed half-way and started again
finishes the job without moving anything twice.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import re
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from typing import Any, Callable, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from thrifty import checkpoints, shards
from thrifty.config import ConfigError, format_validation_error, store_scheme
from thrifty.faults import fault_point
from thrifty.pricing import PricingError, StorageTierPrice, storage_cloud, storage_price
from thrifty.runs import read_attempts, read_summary, run_key
from thrifty.storage import (Archived, NotFound, ObjectInfo, RestoreStatus, Store, StoreError, check_store,
                             is_cold, open_store)

log = logging.getLogger("thrifty.archive")

POLICY_KEY = "archive-policy.json"  # {"gold": [key prefix, ...], "pinned": [key prefix, ...]}
COMMIT_NAMES = (checkpoints.COMMIT, shards.MANIFEST)  # what makes a checkpoint / a cache entry complete: moved first
GIB = 2**30  # the providers bill storage per GiB ("GB") and month

# the class each store's objects move to; "archive" is the cheapest (hours to restore), "cold" reads sooner
TIERS: dict[str, dict[str, str]] = {
    "archive": {"s3": "DEEP_ARCHIVE", "gs": "ARCHIVE", "az": "Archive", "file": "ARCHIVE"},
    "cold": {"s3": "GLACIER", "gs": "COLDLINE", "az": "Cold", "file": "ARCHIVE"},
}

_CACHE = re.compile(r"^cache/([^/]+)/")
_RUN = re.compile(r"^runs/([^/]+)/")


def utcnow() -> dt.datetime:
    return dt.datetime.now(dt.timezone.utc)


class ArchiveSettings(BaseModel):
    """What an archival pass does; the flow's parameters and the CLI's options."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    store: str = Field(".thrifty/store", description="The store to scan: a path, file://, s3://, gs:// or az://.")
    older_than_days: float = Field(90.0, gt=0, description="Stale = not modified for this many days before as_of.")
    active_window_days: float = Field(
        14.0, ge=0, description="A run active within this many days keeps its latest checkpoint hot (days).")
    tier: Literal["archive", "cold"] = Field(
        "archive", description="archive: S3 DEEP_ARCHIVE, GCS ARCHIVE, Azure Archive (cheapest, hours to restore); "
                               "cold: S3 GLACIER, GCS COLDLINE, Azure Cold.")
    as_of: dt.datetime | None = Field(None, description="The clock the plan is made at (default now; UTC if naive).")

    @field_validator("store")
    @classmethod
    def _store(cls, v: str) -> str:
        store_scheme(v)
        return v

    @field_validator("as_of")
    @classmethod
    def _aware(cls, v: dt.datetime | None) -> dt.datetime | None:
        return v.replace(tzinfo=dt.timezone.utc) if v is not None and v.tzinfo is None else v

    @property
    def target_class(self) -> str:
        return TIERS[self.tier][store_scheme(self.store)]


def build_settings(data: dict[str, Any], source: str = "input") -> ArchiveSettings:
    try:
        settings = ArchiveSettings.model_validate(data)
    except ValidationError as err:
        raise ConfigError(format_validation_error(err, source, "archive settings")) from None
    return settings


@dataclass
class Policy:
    """The user's marks: key prefixes kept hot whatever their age."""

    gold: list[str] = field(default_factory=list)
    pinned: list[str] = field(default_factory=list)

    @classmethod
    def load(cls, store: Store) -> "Policy":
        try:
            data = json.loads(store.get_bytes(POLICY_KEY))
        except NotFound:
            return cls()
        return cls(list(data.get("gold", [])), list(data.get("pinned", [])))

    def save(self, store: Store) -> None:
        store.put_bytes(POLICY_KEY, json.dumps({"gold": sorted(set(self.gold)), "pinned": sorted(set(self.pinned))},
                                               indent=1).encode())

    def protects(self, key: str) -> str | None:
        if any(key.startswith(p) for p in self.gold):
            return "marked gold"
        if any(key.startswith(p) for p in self.pinned):
            return "pinned"
        return None


def mark_prefix(target: str) -> str:
    """A RUN_ID means the whole run; anything with a '/' is a key prefix (a checkpoint, a cache entry)."""
    target = target.strip().strip("/")
    if not target:
        raise ConfigError("give a run id (e.g. nightly-2026-11-20) or a key prefix (runs/<run>/ckpt/step-000000120)")
    return f"runs/{target}/" if "/" not in target else f"{target}/"


@dataclass
class RunFacts:
    """What the planner needs to know about one run."""

    running: bool  # a ledger row without an end: a job may still be writing
    last_activity: dt.datetime | None  # newest hot object of the run
    latest_step: int | None  # newest complete checkpoint
    best_steps: frozenset[int] = frozenset()  # its gold weights: the best by the commit records' metrics, and the
    # summary's best checkpoint (which also covers commits written before they recorded min or max)

    def fingerprint(self) -> tuple:
        """What must not change between plan and move (a run that woke up in between is left alone)."""
        return self.running, self.latest_step


@dataclass(frozen=True)
class Item:
    key: str
    group: str  # the checkpoint directory or cache entry the object moves with, or its run (metadata)
    size: int
    storage_class: str
    last_modified: dt.datetime
    action: Literal["archive", "keep", "skip"]  # skip: already cold
    reason: str


@dataclass
class Plan:
    settings: ArchiveSettings
    as_of: dt.datetime
    items: list[Item]
    runs: dict[str, RunFacts]

    @property
    def target_class(self) -> str:
        return self.settings.target_class

    @property
    def to_archive(self) -> list[Item]:
        """Objects to move, in a safe order: each group's commit record first."""
        todo = [i for i in self.items if i.action == "archive"]
        return sorted(todo, key=lambda i: (i.group, i.key.rpartition("/")[2] not in COMMIT_NAMES, i.key))


def _group(key: str) -> str:
    """A checkpoint directory or a cache entry (they move whole); a run's other objects are its metadata."""
    ckpt = checkpoints.parse_key(key)
    if ckpt:
        return ckpt[2]
    m = _CACHE.match(key) or _RUN.match(key)
    return m.group(0) if m else key


def plan(objects: list[ObjectInfo], runs: dict[str, RunFacts], policy: Policy, settings: ArchiveSettings,
         as_of: dt.datetime) -> Plan:
    """Decide, object by object, what moves to the cold tier. Pure: no store access."""
    stale_before = as_of - dt.timedelta(days=settings.older_than_days)
    active_after = as_of - dt.timedelta(days=settings.active_window_days)
    # a group moves whole and its age is its newest hot object's: a cache hit rewrites LAST_USED, and a
    # class change rewrites an object's timestamp on S3/GCS, so cold objects say nothing about use
    group_age: dict[str, dt.datetime] = {}
    for o in objects:
        if not is_cold(o.storage_class):
            g = _group(o.key)
            group_age[g] = max(group_age.get(g, o.last_modified), o.last_modified)
    items = []
    for o in objects:
        if not (o.key.startswith("runs/") or o.key.startswith("cache/")):
            continue
        group = _group(o.key)
        modified = group_age.get(group, o.last_modified)
        action, reason = "archive", f"not modified since {modified:%Y-%m-%d}"
        ckpt = checkpoints.parse_key(o.key)
        protected = policy.protects(o.key)
        if is_cold(o.storage_class):
            action, reason = "skip", f"already {o.storage_class}"
        elif protected:
            action, reason = "keep", protected
        elif ckpt:
            run_id, step, _ = ckpt
            facts = runs.get(run_id)
            live = facts is not None and (facts.running or (facts.last_activity is not None
                                                            and facts.last_activity >= active_after))
            if facts is not None and step in facts.best_steps:
                action, reason = "keep", "best checkpoint (gold weights)"
            elif live and step == facts.latest_step:
                action, reason = "keep", ("latest checkpoint of a running run" if facts.running else
                                          f"latest checkpoint of a run active within "
                                          f"{settings.active_window_days:g} days")
            elif modified >= stale_before:
                action, reason = "keep", f"modified within {settings.older_than_days:g} days"
        elif o.key.startswith("runs/"):
            action, reason = "keep", "run metadata (ledger, metrics, summary, logs) stays readable"
        elif modified >= stale_before:
            action, reason = "keep", f"cache entry used within {settings.older_than_days:g} days"
        items.append(Item(o.key, group, o.size, o.storage_class, o.last_modified, action, reason))
    return Plan(settings, as_of, items, runs)


# ------------------------------------------------------------------------------------------- reading a store


def run_facts(store: Store, run_id: str, objects: list[ObjectInfo]) -> RunFacts:
    try:
        running = any(a.ended_unix is None for a in read_attempts(store, run_id))
    except (Archived, json.JSONDecodeError, TypeError):  # unreadable: assume the worst
        running = True
    infos = checkpoints.committed(store, run_id)
    hot = [c for c in infos if not c.archived]
    best = checkpoints.best(hot, checkpoints.mode_of(hot))
    try:
        summary = read_summary(store, run_id) or {}
    except (Archived, json.JSONDecodeError):
        summary = {}
    steps = {best.step} if best else set()
    if isinstance(summary.get("best_metric"), dict) and summary["best_metric"].get("checkpoint_step") is not None:
        steps.add(int(summary["best_metric"]["checkpoint_step"]))
    last = max((o.last_modified for o in objects if not is_cold(o.storage_class)), default=None)
    return RunFacts(running, last, infos[-1].step if infos else None, frozenset(steps))


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


def scan(store: Store, settings: ArchiveSettings) -> Plan:
    """List the store's runs and cache and plan the pass."""
    as_of = settings.as_of or utcnow()
    objects = store.list("runs/") + store.list("cache/")
    runs = {run_id: run_facts(store, run_id, objs) for run_id, objs in _runs_of(objects).items()}
    return plan(objects, runs, Policy.load(store), settings, as_of)


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
                now = run_facts(store, run_id, store.list(run_key(run_id) + "/"))
                rechecked[run_id] = run_id not in p.runs or now.fingerprint() == p.runs[run_id].fingerprint()
            if not rechecked[run_id]:
                out.left_alone.append((item, f"run {run_id} changed since the scan"))
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


# ------------------------------------------------------------------------------------------- money and text


@dataclass(frozen=True)
class Savings:
    usd_per_month: float | None  # None on a local store (no tier prices)
    target: StorageTierPrice | None
    note: str


def monthly_savings(items: list[Item], store_uri: str, target_class: str) -> Savings:
    """Dollars a month saved by moving ``items`` from their class to ``target_class``, from the price table."""
    try:
        cloud = storage_cloud(store_uri)
    except PricingError:
        return Savings(None, None, "local store: disk has no tier prices (moving frees hot disk only)")
    target = storage_price(cloud, target_class)
    usd = 0.0
    for i in items:
        try:
            now = storage_price(cloud, i.storage_class)
        except PricingError:
            now = storage_price(cloud, "STANDARD" if cloud != "azure" else "Hot")
        usd += i.size / GIB * max(0.0, now.usd_per_gb_month - target.usd_per_gb_month)
    note = (f"{target.tier} on {cloud}: ${target.usd_per_gb_month}/GB-month, billed for at least "
            f"{target.min_storage_days} days, retrieval ${target.retrieval_usd_per_gb}/GB ({target.source}, "
            f"{target.as_of})")
    return Savings(usd, target, note)


def human_bytes(n: float) -> str:
    if n < 1024:
        return f"{n:.0f} B"
    for unit in ("KiB", "MiB", "GiB"):
        n /= 1024
        if n < 1024:
            return f"{n:.1f} {unit}"
    return f"{n / 1024:.1f} TiB"


def summary(p: Plan, outcome: Outcome | None = None) -> dict[str, Any]:
    todo = p.to_archive
    savings = monthly_savings(todo, p.settings.store, p.target_class)
    kept = Counter(i.reason for i in p.items if i.action == "keep")
    out: dict[str, Any] = {
        "store": p.settings.store, "as_of": p.as_of.isoformat(), "older_than_days": p.settings.older_than_days,
        "target_class": p.target_class, "dry_run": outcome is None,
        "objects_to_archive": len(todo), "bytes_to_archive": sum(i.size for i in todo),
        "groups_to_archive": len({i.group for i in todo}),
        "usd_per_month_saved": None if savings.usd_per_month is None else round(savings.usd_per_month, 6),
        "price_note": savings.note,
        "kept": dict(kept), "already_cold": sum(1 for i in p.items if i.action == "skip"),
    }
    if outcome is not None:
        out.update(moved=len(outcome.moved), bytes_moved=outcome.bytes_moved, failed=len(outcome.failed),
                   left_alone=len(outcome.left_alone))
    return out


def markdown(p: Plan, outcome: Outcome | None = None, max_rows: int | None = None) -> str:
    """The pass as a report: totals, then each group to archive and each kept group with its reason
    (the first ``max_rows`` of them, archive rows first, when given)."""
    s = summary(p, outcome)
    usd = "n/a" if s["usd_per_month_saved"] is None else f"${s['usd_per_month_saved']:.2f}"
    head = "Dry run: nothing moved" if outcome is None else (
        f"Moved {s['moved']} objects ({human_bytes(s['bytes_moved'])}); {s['failed']} failed, "
        f"{s['left_alone']} left alone")
    lines = [
        f"# Archive {s['store']}", "",
        f"{head}. As of {p.as_of:%Y-%m-%d %H:%M} UTC, stale = not modified for {s['older_than_days']:g} days; "
        f"target class **{s['target_class']}**.", "",
        "| | |", "|---|---|",
        f"| to archive | {s['objects_to_archive']} objects in {s['groups_to_archive']} checkpoints / cache entries |",
        f"| bytes | {human_bytes(s['bytes_to_archive'])} ({s['bytes_to_archive']} B) |",
        f"| saved per month | {usd} |",
        f"| already cold | {s['already_cold']} objects |",
        f"| prices | {s['price_note']} |", "",
    ]
    groups: dict[tuple[str, str, str], list[Item]] = defaultdict(list)
    for i in p.items:
        if i.action != "skip":
            groups[(i.action, i.group, i.reason)].append(i)
    lines += ["| action | checkpoint / cache entry / run | objects | bytes | why |", "|---|---|---|---|---|"]
    rows = sorted(groups.items())
    for (action, group, reason), members in rows[:max_rows]:
        lines.append(f"| {action} | `{group}` | {len(members)} | {human_bytes(sum(m.size for m in members))} | "
                     f"{reason} |")
    if max_rows is not None and len(rows) > max_rows:
        lines.append(f"\n{len(rows) - max_rows} more rows; `thrifty archive` (a dry run) lists them all.")
    if outcome is not None and outcome.failed:
        lines += ["", "## Failed", ""] + [f"- `{i.key}`: {why}" for i, why in outcome.failed]
    return "\n".join(lines) + "\n"


# ------------------------------------------------------------------------------------------- restore


def restore_run(store: Store, run_id: str, *, priority: str = "standard", days: int = 7) -> list[RestoreStatus]:
    """Start (or finish) restoring every cold object of a run: data first, commit records last."""
    objects = store.list(f"runs/{run_id}/")
    if not objects:
        raise ConfigError(f"no run {run_id!r} in {store.uri}; `thrifty report` lists the runs of a store")
    cold = sorted((o for o in objects if is_cold(o.storage_class)),
                  key=lambda o: (o.key.rpartition("/")[2] in COMMIT_NAMES, o.key))
    return [store.restore(o.key, priority=priority, days=days) for o in cold]


# ------------------------------------------------------------------------------------------- provider lifecycle

LIFECYCLE_CAVEAT = (
    "Provider lifecycle rules see only an object's age (and size or name), not Thrifty's marks: gold weights, "
    "best checkpoints and a live run's latest checkpoint move too once old enough (a run whose newest checkpoint "
    "moved stops with 'restore first'). The weekly-archive deployment applies every rule; prefer it.")
LARGE_OBJECT_BYTES = 1 << 20  # S3 rules move only objects above this: checkpoint data and shards, not metadata
DATA_SUFFIXES = [".pt", ".npy"]  # GCS rules: checkpoint data and shards, not commit records or metadata


def lifecycle_rules(store: Store, settings: ArchiveSettings) -> list[dict[str, Any]]:
    """Bucket lifecycle rules that move old checkpoint data and shards to the target class (S3 and GCS)."""
    days = max(1, round(settings.older_than_days))
    scheme = store_scheme(store.uri)
    root = getattr(store, "root", "")
    prefixes = [f"{root}/{top}/" if root else f"{top}/" for top in ("runs", "cache")]
    if scheme == "s3":
        rid = f"thrifty-{root or 'bucket'}".replace("/", "-")
        rules: list[dict[str, Any]] = [
            {"ID": f"{rid}-{top}-to-{settings.target_class.lower()}", "Status": "Enabled",
             "Filter": {"And": {"Prefix": prefix, "ObjectSizeGreaterThan": LARGE_OBJECT_BYTES}},
             "Transitions": [{"Days": days, "StorageClass": settings.target_class}]}
            for top, prefix in zip(("runs", "cache"), prefixes)]
        rules.append({"ID": f"{rid}-abort-incomplete-uploads", "Status": "Enabled",
                      "Filter": {"Prefix": f"{root}/" if root else ""},
                      "AbortIncompleteMultipartUpload": {"DaysAfterInitiation": 7}})
        return rules
    if scheme == "gs":
        return [{"action": {"type": "SetStorageClass", "storageClass": settings.target_class},
                 "condition": {"age": days, "matchesPrefix": prefixes, "matchesSuffix": DATA_SUFFIXES}}]
    raise ConfigError(f"store {store.uri!r}: lifecycle rules are installed on s3:// and gs:// buckets; for Azure, "
                      "add a lifecycle management policy to the storage account (az storage account "
                      "management-policy create), for a local store use the weekly-archive deployment")


def install_lifecycle(store: Store, rules: list[dict[str, Any]]) -> None:
    """Add ``rules`` to the bucket's lifecycle configuration, replacing earlier Thrifty rules for the same prefixes
    and keeping everyone else's."""
    install = getattr(store, "merge_lifecycle_rules", None)
    if install is None:
        raise ConfigError(f"store {store.uri!r} has no bucket lifecycle rules")
    install(rules)
