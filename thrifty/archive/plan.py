"""What an archival pass moves: a pure function of a store's listing, its runs' facts, the user's marks and a clock.

Also the pass's settings (the flow's parameters and the CLI's options) and the marks
(``archive-policy.json``: gold and pinned key prefixes).
"""

from __future__ import annotations

import datetime as dt
import json
import re
from dataclasses import dataclass, field
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from thrifty.runs import checkpoints, shards
from thrifty.runs.reuse import EXPORT_RECORD_NAMES
from thrifty.config import ConfigError, StoreUri, format_validation_error, store_scheme
from thrifty.config.echo import shown
from thrifty.storage import NotFound, ObjectInfo, Store, is_cold

LIVE_FLOOR = dt.timedelta(days=1)  # a run (or cache entry) touched this recently by the pass's own clock is never
# moved, whatever --active-window-days or --as-of say: a restart's first seconds look idle to the ledger
POLICY_KEY = "archive-policy.json"  # {"gold": [key prefix, ...], "pinned": [key prefix, ...]}
# what makes a checkpoint / a cache entry / a half-precision export complete: moved first, restored last
COMMIT_NAMES = (checkpoints.COMMIT, shards.MANIFEST, *EXPORT_RECORD_NAMES)
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

    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)

    store: StoreUri = Field(".thrifty/store", description="The store to scan: a path, file://, s3://, gs:// or az://.")
    older_than_days: float = Field(90.0, gt=0, le=36500, description="Stale = not modified for this many days "
                                   "before as_of (days, at most 100 years).")
    active_window_days: float = Field(
        14.0, ge=0, le=36500, description="A run active within this many days keeps its latest checkpoint hot (days).")
    tier: Literal["archive", "cold"] = Field(
        "archive", description="archive: S3 DEEP_ARCHIVE, GCS ARCHIVE, Azure Archive (cheapest, hours to restore); "
                               "cold: S3 GLACIER, GCS COLDLINE, Azure Cold.")
    as_of: dt.datetime | None = Field(None, description="The clock the plan is made at (default now; UTC if naive).")

    @field_validator("as_of")
    @classmethod
    def _aware(cls, v: dt.datetime | None) -> dt.datetime | None:
        if v is not None and not 1970 <= v.year <= 9000:  # days are counted back from it: year 1 has no past
            raise ValueError(f"as_of {v:%Y-%m-%d} is out of range; give a date between 1970 and 9000")
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


_RUN_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.\-]{0,62}")  # a resolved run_name (thrifty.config.RUN_NAME_PATTERN)


def check_run_id(run_id: str) -> str:
    """``run_id`` if it names a run as run_name does; else a ConfigError (``..`` or a '/' would leave ``runs/``)."""
    if not _RUN_ID.fullmatch(run_id):
        raise ConfigError(f"{shown(run_id)} is not a run id: a run id is the run's run_name, 1-63 letters, digits, "
                          "'.', '_' or '-' starting with a letter or digit (`thrifty report` lists a store's runs)")
    return run_id


def mark_prefix(target: str) -> str:
    """A RUN_ID means the whole run; anything with a '/' is a key prefix (a checkpoint, a cache entry) under runs/ or
    cache/, the only places archival moves anything."""
    target = target.strip().strip("/")
    if not target:
        raise ConfigError("give a run id (e.g. nightly-2026-11-20) or a key prefix (runs/<run>/ckpt/step-000000120)")
    if "/" not in target:
        return f"runs/{check_run_id(target)}/"
    parts = target.split("/")
    if parts[0] not in ("runs", "cache") or any(p in ("", ".", "..") for p in parts):
        raise ConfigError(f"{shown(target)} is not a key prefix of the store: give a run id, or a prefix under runs/ "
                          "or cache/ without '.' or '..' parts (e.g. runs/nightly-20261120/ckpt/step-000000120)")
    return f"{target}/"


@dataclass
class RunFacts:
    """What the planner needs to know about one run."""

    running: bool  # a ledger row without an end: a job may still be writing
    last_activity: dt.datetime | None  # newest hot object of the run
    latest_step: int | None  # newest complete checkpoint
    best_steps: frozenset[int] = frozenset()  # its gold weights: the best by the commit records' metrics, and the
    # summary's best checkpoint (which also covers commits written before they recorded min or max)
    leased: bool = False  # its lease is live when read: a job, its flow, or a `thrifty train` holds the run now
    # (thrifty.runs.lease; also between a preemption and the restart, and for runs that write no ledger)
    cache_keys: frozenset[str] = frozenset()  # the cache entries its newest attempt trains from (read when live)

    def fingerprint(self) -> tuple:
        """What must not change between plan and move (a run that woke up in between is left alone)."""
        return self.running, self.latest_step, self.leased

    def live(self, now: dt.datetime | None) -> str | None:
        """Why no object of this run may move at all, or None: it holds a live lease, or it wrote something within
        LIVE_FLOOR of ``now`` (the real clock of the pass, never ``as_of``)."""
        if self.leased:
            return "run holds a live lease (training now)"
        if now is not None and self.last_activity is not None and self.last_activity >= now - LIVE_FLOOR:
            return f"run active within the last {LIVE_FLOOR.total_seconds() / 3600:g} hours"
        return None


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
    now: dt.datetime | None = None  # the real clock when it was planned (as_of may be any date)

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
         as_of: dt.datetime, now: dt.datetime | None = None) -> Plan:
    """Decide, object by object, what moves to the cold tier. Pure: no store access.

    ``as_of`` is the date ages are measured from (any date, to preview a pass); ``now`` is the real clock, which
    no option moves: a live run (a live lease, or anything written within LIVE_FLOOR of ``now``) keeps every
    object, a run active within the window before ``as_of`` or before ``now`` keeps its latest checkpoint, and a
    cache entry used within LIVE_FLOOR of ``now`` stays. ``now`` None (unit tests of the windows) skips the clock.
    """
    stale_before = as_of - dt.timedelta(days=settings.older_than_days)
    window = dt.timedelta(days=settings.active_window_days)
    active_after = min(as_of, now or as_of) - window
    # a group moves whole and its age is its newest hot object's: a cache hit rewrites LAST_USED, and a
    # class change rewrites an object's timestamp on S3/GCS, so cold objects say nothing about use
    group_age: dict[str, dt.datetime] = {}
    for o in objects:
        if not is_cold(o.storage_class):
            g = _group(o.key)
            group_age[g] = max(group_age.get(g, o.last_modified), o.last_modified)
    in_use = {key: run_id for run_id, facts in runs.items() if facts.live(now) for key in facts.cache_keys}
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
            untouchable = facts.live(now) if facts is not None else None
            live = facts is not None and (facts.running or (facts.last_activity is not None
                                                            and facts.last_activity >= active_after))
            if untouchable:
                action, reason = "keep", untouchable
            elif facts is not None and step in facts.best_steps:
                action, reason = "keep", "best checkpoint (gold weights)"
            elif live and step == facts.latest_step:
                action, reason = "keep", ("latest checkpoint of a running run" if facts.running else
                                          f"latest checkpoint of a run active within "
                                          f"{settings.active_window_days:g} days")
            elif modified >= stale_before:
                action, reason = "keep", f"modified within {settings.older_than_days:g} days"
        elif o.key.startswith("runs/"):
            action, reason = "keep", "run metadata (ledger, metrics, summary, logs) stays readable"
        elif (m := _CACHE.match(o.key)) and m.group(1) in in_use:
            action, reason = "keep", f"cache entry of live run {in_use[m.group(1)]}"
        elif now is not None and modified >= now - LIVE_FLOOR:
            action, reason = "keep", f"cache entry used within the last {LIVE_FLOOR.total_seconds() / 3600:g} hours"
        elif modified >= stale_before:
            action, reason = "keep", f"cache entry used within {settings.older_than_days:g} days"
        items.append(Item(o.key, group, o.size, o.storage_class, o.last_modified, action, reason))
    return Plan(settings, as_of, items, runs, now)
