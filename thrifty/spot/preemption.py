"""How often spot instances are preempted: the store's own ledgers, the shipped trace statistics, or the config.

Three sources, best first: every attempt in the store's cost ledgers (``thrifty.money.ledger``) on the same
cloud and instance is an observation (one that ended ``preempted`` is an event; any other end, or one
still running, is time survived); the statistics shipped in ``thrifty/data/spot_stats.json`` (derived
from public spot traces, one row per trace: see ``bench/make_spot_stats.py``); and the config's
``train.mean_time_between_preemptions_s``. :func:`choose_mtbp` picks one and says which and why:
the training loop's ``checkpoint_every: auto`` and ``thrifty simulate`` both ask it.
"""

from __future__ import annotations

import functools
import json
import time
from dataclasses import dataclass
from importlib import resources
from typing import Literal

from thrifty.config import RunConfig
from thrifty.money.ledger import Attempt, read_attempts
from thrifty.money.meter import Price
from thrifty.storage import Store

MIN_LEDGER_PREEMPTIONS = 5  # fewer events than this and the ledgers' estimate is noisier than the traces' (+-45 %)
Source = Literal["ledger", "shipped", "config", "flag"]


@dataclass(frozen=True)
class TraceRow:
    """One public trace, as the shipped statistics summarise it (hours, events, run-length quantiles)."""

    cloud: str
    zone: str
    instances: tuple[str, ...]
    nodes: int
    kind: str  # preemption (a real instance kept alive) | availability (launch probes: a proxy)
    dataset: str
    hours: float
    alive_hours: float
    preemptions: int
    M_hours: float | None
    up_p50_h: float | None
    up_p90_h: float | None
    mean_outage_hours: float | None
    out_p50_h: float | None = None  # outage lengths (spot gone until it is back): median and 90th percentile
    out_p90_h: float | None = None


@functools.lru_cache(maxsize=1)
def _shipped() -> tuple[dict, tuple[TraceRow, ...]]:
    data = json.loads(resources.files("thrifty").joinpath("data/spot_stats.json").read_text())
    rows = tuple(TraceRow(**{**r, "instances": tuple(r["instances"])}) for r in data["rows"])
    return data["source"], rows


def shipped_source() -> dict:
    """Where the shipped statistics come from (repository, commit, paper, licence note)."""
    return dict(_shipped()[0])


def shipped_rows() -> tuple[TraceRow, ...]:
    return _shipped()[1]


def _same_instance(a: str, b: str) -> bool:  # GCP price rows name GPU VMs n1-standard-4+T4; traces and VMs do not
    return a.lower().split("+")[0] == b.lower().split("+")[0]


@dataclass(frozen=True)
class TraceStats:
    """The shipped rows that describe one instance (and zone), pooled."""

    cloud: str
    instance: str
    rows: tuple[TraceRow, ...]

    @property
    def alive_hours(self) -> float:
        return sum(r.alive_hours for r in self.rows)

    @property
    def preemptions(self) -> int:
        return sum(r.preemptions for r in self.rows)

    @property
    def mtbp_s(self) -> float | None:
        """Pooled maximum-likelihood mean (alive hours over events); None when no event was seen."""
        return self.alive_hours / self.preemptions * 3600.0 if self.preemptions else None

    def describe(self) -> str:
        zones = sorted({r.zone for r in self.rows})
        kinds = "/".join(sorted({r.kind for r in self.rows}))
        return (f"shipped spot-trace statistics: {self.cloud} {self.instance}, {kinds} traces, "
                f"{self.preemptions} preemptions in {self.alive_hours:.0f} alive h over "
                f"{len(zones)} zone(s) ({', '.join(zones)})")


def trace_stats(cloud: str, instance: str, nodes: int = 1, zone: str | None = None) -> TraceStats | None:
    """The shipped statistics of ``cloud``/``instance`` (optionally one ``zone``): real-preemption traces when any
    exist, else availability probes; gang rows when the job has that many nodes, else single-node rows."""
    rows = [r for r in shipped_rows() if r.cloud == cloud.lower() and any(_same_instance(i, instance) for i in r.instances)
            and (zone is None or r.zone == zone)]
    same_nodes = [r for r in rows if r.nodes == nodes]
    rows = same_nodes or [r for r in rows if r.nodes == 1]
    real = [r for r in rows if r.kind == "preemption"]
    rows = real or rows
    return TraceStats(cloud.lower(), instance, tuple(rows)) if rows else None


def traced_instances() -> list[str]:
    """``cloud:instance`` names the shipped statistics know, for error messages."""
    return sorted({f"{r.cloud}:{i}" for r in shipped_rows() for i in r.instances})


# ---------------------------------------------------------------- the store's own ledgers


@dataclass(frozen=True)
class LedgerObservations:
    """Spot attempts on one instance, from every run's ledger: time survived and preemptions."""

    alive_s: float
    preemptions: int
    attempts: int
    runs: int

    @property
    def mtbp_s(self) -> float | None:
        return self.alive_s / self.preemptions if self.preemptions else None

    def describe(self, cloud: str, instance: str) -> str:
        return (f"the store's ledgers: {self.preemptions} preemptions in {self.alive_s / 3600:.1f} h of {cloud} "
                f"{instance} spot over {self.attempts} attempt(s) of {self.runs} run(s)")


def observations(attempts: list[Attempt], cloud: str, instance: str, now: float) -> tuple[float, int, int]:
    """(alive seconds, preemptions, attempts) of real spot attempts on ``cloud``/``instance`` (pure).

    An attempt that ended ``preempted`` is an event; any other end, or one still running, only adds time
    survived (a censored observation). The local launcher's emulated attempts (region ``local``) are not
    observations: their preemptions were injected.
    """
    alive, events, n = 0.0, 0, 0
    for a in attempts:
        if not a.spot or a.region == "local" or a.cloud != cloud.lower() or not _same_instance(a.instance, instance):
            continue
        alive += a.hours(now) * 3600.0
        events += a.end_reason == "preempted"
        n += 1
    return alive, events, n


def ledger_observations(store: Store, cloud: str, instance: str, now: float | None = None) -> LedgerObservations:
    """Every run's attempts on ``cloud``/``instance`` spot in ``store``, folded into one observation."""
    now = time.time() if now is None else now
    run_ids: dict[str, None] = {}
    for obj in store.list("runs/"):
        parts = obj.key.split("/")
        if len(parts) >= 3 and parts[2] in ("ledger", "meter", "ledger.jsonl"):
            run_ids.setdefault(parts[1])
    alive, events, attempts, runs = 0.0, 0, 0, 0
    for run_id in run_ids:
        a, e, n = observations(read_attempts(store, run_id, now), cloud, instance, now)
        alive, events, attempts, runs = alive + a, events + e, attempts + n, runs + (n > 0)
    return LedgerObservations(alive, events, attempts, runs)


# ---------------------------------------------------------------- the choice


@dataclass(frozen=True)
class MtbpChoice:
    """The mean time between preemptions to plan with, where it came from, and why that source."""

    mtbp_s: float
    source: Source
    detail: str

    def describe(self) -> str:
        return f"{self.mtbp_s:.0f} s ({self.mtbp_s / 3600:.2f} h) from {self.detail}"


def choose_mtbp(store: Store | None, cloud: str | None, instance: str | None, spot: bool, config_s: float,
                nodes: int = 1, min_preemptions: int = MIN_LEDGER_PREEMPTIONS, now: float | None = None,
                ledger: LedgerObservations | None = None, zone: str | None = None) -> MtbpChoice:
    """The store's ledgers when they hold at least ``min_preemptions`` preemptions of this instance, else the shipped
    statistics for it, else ``config_s`` (``train.mean_time_between_preemptions_s``). Never raises on a store
    error: a planning aid must not stop training."""
    fallback = "train.mean_time_between_preemptions_s"
    if not spot:
        return MtbpChoice(config_s, "config", f"{fallback} (on-demand: no spot preemption data applies)")
    if cloud is None or instance is None:
        return MtbpChoice(config_s, "config", f"{fallback} (the instance is not known)")
    notes = []
    if ledger is None and store is not None:
        try:
            ledger = ledger_observations(store, cloud, instance, now)
        except Exception as exc:  # noqa: BLE001 - a store hiccup: plan from the next source
            notes.append(f"the ledgers could not be read ({exc})")
    if ledger is not None:
        if ledger.preemptions >= min_preemptions and ledger.mtbp_s:
            return MtbpChoice(ledger.mtbp_s, "ledger", ledger.describe(cloud, instance))
        notes.append(f"the ledgers hold {ledger.preemptions} preemption(s) of {cloud} {instance} spot "
                     f"(fewer than {min_preemptions})")
    stats = trace_stats(cloud, instance, nodes, zone)
    if stats is not None and stats.mtbp_s:
        return MtbpChoice(stats.mtbp_s, "shipped", stats.describe() + (f"; {'; '.join(notes)}" if notes else ""))
    notes.append(f"no shipped statistics for {cloud} {instance}" if stats is None else
                 f"the shipped traces of {cloud} {instance} saw no preemption in {stats.alive_hours:.0f} h")
    return MtbpChoice(config_s, "config", f"{fallback}; {'; '.join(notes)}")


def config_mtbp(cfg: RunConfig) -> MtbpChoice:
    """The config's guess: what a fixed ``checkpoint_every`` carries along, and what ranks other than 0 start with."""
    return MtbpChoice(cfg.train.mean_time_between_preemptions_s, "config", "train.mean_time_between_preemptions_s")


def node_mtbp(store: Store, cfg: RunConfig, price: Price | None) -> MtbpChoice:
    """What ``checkpoint_every: auto`` plans with on a node: the choice for the instance its meter matched (``price``,
    None when no launcher named one: a machine of one's own, nothing to preempt it but the config's guess); the
    config's value when the interval is fixed (nothing is read)."""
    config_s = cfg.train.mean_time_between_preemptions_s
    if cfg.train.checkpoint_every != "auto":
        return config_mtbp(cfg)
    if price is None:
        return MtbpChoice(config_s, "config", "train.mean_time_between_preemptions_s (no launcher named this "
                                              "node's instance)")
    return choose_mtbp(store, price.cloud, price.instance, price.spot, config_s, cfg.compute.num_nodes)
