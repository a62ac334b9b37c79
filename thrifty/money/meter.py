"""The node's own meter: the budget cap enforced where the money is spent, even when the flow is gone.

A launcher gives its job the prices of the candidates it may land on (``$THRIFTY_PRICES``); the
node matches the instance it landed on (``thrifty.launchers.identity``, handed in by the node program), knows when it began to
bill (the launcher's start locally, the boot time on a cloud VM), reads what the run spent
before (``thrifty.money.ledger``) and, every step, asks :meth:`NodeMeter.over_cap`. At the cap the
training program checkpoints and exits ``EXIT_BUDGET``, which no launcher restarts. Its record in
the store (``runs/<run>/meter/...``) lets reports count every dollar of a job whose watcher died; it is kept on the
node's disk first and put in the store from a background thread (``thrifty.money.meter_local``), so a store that
hangs holds up neither training nor the cap, and what was billed while it hung reaches the store when it answers.

With live prices (``budget.prices``) the node reads its own instance's price in its zone at boot and again every
``budget.spot_price_max_age_s`` (``thrifty.money.prices``): each interval is metered at the price then in force
(price segments in its record), so a price that rises mid-run moves the stop earlier.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import time
from dataclasses import dataclass, replace
from typing import Callable, Mapping

from thrifty.money.budget import TEARDOWN_S, over_cap, spend_usd, stop_margin_s
from thrifty.config import ConfigError, RunConfig
from thrifty.money.ledger import METER_BEAT_S, MeterRecord, read_attempts, segments_cost_usd
from thrifty.money.meter_local import RecordSync
from thrifty.money.prices import LivePrices, PriceKey, PricePoint
from thrifty.money.prices.repricing import Repricer, change_from
from thrifty.procs import process_started
from thrifty.protocol import ENV_BILLING_START, ENV_JOB_ID, ENV_PRICES, SKYPILOT_JOB_PREFIX
from thrifty.storage import Store
from thrifty.numbers import money

log = logging.getLogger("thrifty.money.meter")


@dataclass(frozen=True)
class NodeIdentity:
    """What a node could learn about itself (``thrifty.launchers.identity``); None where it could not."""

    cloud: str | None
    instance: str | None = None  # as the price table names it: g5.xlarge, g2-standard-4, Standard_NC4as_T4_v3
    spot: bool | None = None
    region: str | None = None
    zone: str | None = None


@dataclass(frozen=True)
class Price:
    """One candidate the job may land on, and its $/hour per node."""

    cloud: str
    instance: str
    spot: bool
    usd_per_hour: float
    accelerator: str = ""
    source: str = ""
    region: str = ""  # where the launcher priced it ("" = unknown)
    fetched_unix: float = 0.0  # when a cloud's source was read for it; 0 = a catalog file or the dated table

    def point(self) -> PricePoint:
        return PricePoint(self.usd_per_hour, self.source, self.fetched_unix, self.region or None, None,
                          live=self.fetched_unix > 0)


def prices_env(prices: list[Price]) -> str:
    return json.dumps([p.__dict__ for p in prices])


def parse_prices(raw: str) -> list[Price]:
    try:
        return [Price(**p) for p in json.loads(raw)]
    except (json.JSONDecodeError, TypeError) as exc:
        raise ConfigError(f"${ENV_PRICES} is not a list of prices ({exc})") from None


def match_price(prices: list[Price], node: NodeIdentity) -> tuple[Price, str]:
    """The candidate this node is (see :func:`match`), and how it was told."""
    pick, note, _ = match(prices, node)
    return pick, note


def match(prices: list[Price], node: NodeIdentity) -> tuple[Price, str, bool]:
    """The price of the candidate this node is, or the dearest that could be it (never less than what is billed)."""
    def same_instance(p: Price) -> bool:  # GCP rows name GPU VMs n1-standard-4+T4; the VM reports n1-standard-4
        return node.instance is not None and p.instance.lower().split("+")[0] == node.instance.lower()

    pool = [p for p in prices if node.cloud is None or p.cloud == node.cloud] or prices
    exact = [p for p in pool if same_instance(p) and (node.spot is None or p.spot == node.spot)]
    if exact and node.spot is not None:
        pick = max(exact, key=lambda p: p.usd_per_hour)
        return pick, f"{pick.cloud} {pick.instance} {'spot' if pick.spot else 'on-demand'}, as this node reports", True
    narrowed = exact or [p for p in pool if node.spot is None or p.spot == node.spot] or pool
    pick = max(narrowed, key=lambda p: p.usd_per_hour)
    return pick, (f"the dearest of {len(narrowed)} candidate(s) it may be ({pick.cloud} {pick.instance} "
                  f"{'spot' if pick.spot else 'on-demand'}): the node did not say enough to tell"), False


def node_repricer(store: Store, cfg: RunConfig, price: Price, node: NodeIdentity, exact: bool,
                  clock: Callable[[], float]) -> Repricer | None:
    """The node's own price in its own zone, read at boot and again while it trains: the candidate it is, or (AWS,
    Azure: the type names the GPUs) the instance it reports when SkyPilot picked one no candidate named, the
    dearest candidate its fallback. None with table prices, on a Kubernetes pod (its rate is the user's) or when
    the node could not tell what it is."""
    live = LivePrices.for_config(cfg, store, clock=clock)
    if not live.live or price.cloud == "kubernetes":
        return None
    if exact:
        key = PriceKey(price.cloud, price.instance, price.spot, node.region or price.region or None, node.zone,
                       price.accelerator)
    elif node.cloud in ("aws", "azure") and node.instance and node.spot is not None and node.region:
        key = PriceKey(node.cloud, node.instance, node.spot, node.region, node.zone)
    else:
        return None
    return Repricer(live, key, price.point(), clock)


def node_job_id(environ: Mapping[str, str]) -> str | None:
    """The launcher's id of the job this node runs: given by the local launcher, derived on a SkyPilot node."""
    managed = environ.get("SKYPILOT_MANAGED_JOB_ID")
    return environ.get(ENV_JOB_ID) or (f"{SKYPILOT_JOB_PREFIX}{managed}" if managed else None)


def boot_time_unix() -> float | None:
    """When this machine booted (Linux), which is when a cloud VM began to bill."""
    try:
        with open("/proc/stat") as f:
            for line in f:
                if line.startswith("btime "):
                    return float(line.split()[1])
    except OSError:
        pass
    return None


class NodeMeter:
    """What this job has cost the run so far, and whether it must stop to stay under the cap."""

    def __init__(self, store: Store, cfg: RunConfig, job_id: str, price: Price, price_note: str, nodes: int,
                 started_unix: float, clock: Callable[[], float] = time.time, repricer: Repricer | None = None,
                 node: NodeIdentity | None = None):
        self.store, self.cfg, self.job_id, self.price, self.nodes = store, cfg, job_id, price, nodes
        self.started_unix, self.clock, self.price_note = started_unix, clock, price_note
        self.repricer, self.node = repricer, node or NodeIdentity(price.cloud)
        # the prices in force, [from_unix, $/h of one node, source]: the first from the billing start
        self.segments: list[list] = [[started_unix, price.usd_per_hour, price.source]]
        self.rate = price.usd_per_hour * nodes  # $/hour of this job now, every node
        self._others_usd, self._others_burn, self._others_at = 0.0, 0.0, started_unix
        self._ledger_open_start: float | None = None
        self._sync = RecordSync(store, cfg.run_name, lambda: self._refresh(self.clock()))
        self.end: str | None = None  # how this attempt ended, once closed
        if repricer is not None:
            self._reprice(boot=True)
        self._last_write = clock()
        self._sync.put_now(self._record(self._last_write))  # on this thread: the run's spend is known before training

    @classmethod
    def from_env(cls, store: Store, cfg: RunConfig, environ: Mapping[str, str] | None = None,
                 clock: Callable[[], float] = time.time,
                 identify: Callable[[Mapping[str, str]], NodeIdentity] | None = None) -> "NodeMeter | None":
        """The meter a launcher asked for, or None when none did (a person running `thrifty train` on a machine
        of their own: nothing is billed). ``identify`` asks a cloud VM what it is (the node program passes
        ``thrifty.launchers.identity.identify``); without it the meter charges the dearest candidate."""
        env = os.environ if environ is None else environ
        raw = env.get(ENV_PRICES)
        if not raw:
            return None
        prices = parse_prices(raw)
        if not prices:
            raise ConfigError(f"${ENV_PRICES} names no candidate; the launcher must give the job its prices")
        job_id = node_job_id(env) or f"node-{os.getpid()}"
        if env.get(ENV_BILLING_START):
            started = float(env[ENV_BILLING_START])
            node = NodeIdentity(prices[0].cloud, prices[0].instance, prices[0].spot) if len(prices) == 1 else \
                NodeIdentity(None)
        else:  # a cloud VM: billing began when it booted; ask it what it is
            started = boot_time_unix() or clock()
            node = identify(env) if identify is not None else NodeIdentity(None)
        price, note, exact = match(prices, node)
        nodes = int(env.get("SKYPILOT_NUM_NODES") or cfg.compute.num_nodes)
        repricer = node_repricer(store, cfg, price, node, exact, clock)
        if repricer is not None and not exact:  # an instance no candidate named: metered as what it is
            key = repricer.key
            note = (f"{key.cloud} {key.instance} {'spot' if key.spot else 'on-demand'}, as this node reports (no "
                    f"candidate named it; {money(price.usd_per_hour)}/h, the dearest, if its price cannot be read)")
            price = replace(price, cloud=key.cloud, instance=key.instance, spot=key.spot, accelerator="")
        return cls(store, cfg, job_id, price, note, nodes, started, clock, repricer, node)

    # ------------------------------------------------------------ the price in force
    def _reprice(self, boot: bool = False) -> bool:
        """Read this node's price again. At boot it holds from the start; later a change starts a new segment, a
        rise from the read before it (it may have begun any time since), a fall from now."""
        assert self.repricer is not None
        point = self.repricer.read()
        if point is None:
            return False
        now, usd = self.clock(), point.usd_per_hour
        if boot:
            self.segments = [[self.started_unix, usd, point.describe(now)]]
        elif abs(usd - self.segments[-1][1]) < 1e-12:
            return False
        else:
            since = max(self.segments[-1][0],
                        change_from(self.segments[-1][1], usd, self.repricer.previous_seen_unix, now))
            log.warning("budget: this node's price moved from $%.4f/h to $%.4f/h (%s); the cap meters at it from %.0f s "
                        "ago", self.segments[-1][1], usd, point.describe(now), now - since)
            self.segments.append([since, usd, point.describe(now)])
        self.price = replace(self.price, usd_per_hour=usd, source=point.describe(now))
        self.rate = usd * self.nodes
        return True

    # ------------------------------------------------------------ the run's spend
    def _refresh(self, now: float) -> None:
        """What the run's other attempts cost, from the ledger (read at most once a beat)."""
        attempts = read_attempts(self.store, self.cfg.run_name, now)
        # this attempt's own rows (the watcher's, or the ledger's view of this record once it is closed: the
        # background sync re-reads after the final put) are metered here, never counted again as another's
        mine_open = [a for a in attempts if a.job_id == self.job_id
                     and (a.ended_unix is None or a.ended_unix > self.started_unix)]
        others = [a for a in attempts if a not in mine_open]
        self._others_usd = spend_usd(others, now)
        self._others_burn = sum(a.usd_per_hour * a.nodes for a in others if a.ended_unix is None)
        self._others_at = now
        self._ledger_open_start = min((a.started_unix for a in mine_open), default=None)

    def spend_usd(self, now: float | None = None) -> float:
        now = self.clock() if now is None else now
        mine_from = min(self.started_unix, self._ledger_open_start or self.started_unix)  # whichever counts more
        mine = segments_cost_usd(self.segments, mine_from, now) * self.nodes
        return self._others_usd + self._others_burn * max(0.0, now - self._others_at) / 3600.0 + mine

    def burn_usd_per_hour(self) -> float:
        return self.rate + self._others_burn

    def reserve_s(self, save_s: float, step_s: float) -> float:
        """Billed after a stop decision on the node: the stop margin the run was planned with, or more when the
        node has measured a stop to cost more (the step in flight, a checkpoint, exit and teardown). The watch loop
        holds back a poll interval on top, so while it lives it stops the job first."""
        return max(stop_margin_s(self.cfg), 2 * step_s + 2 * save_s + TEARDOWN_S[self.cfg.compute.launcher])

    def over_cap(self, save_s: float, step_s: float, now: float | None = None) -> bool:
        now = self.clock() if now is None else now
        return over_cap(self.spend_usd(now), self.burn_usd_per_hour(), self.reserve_s(save_s, step_s),
                        self.cfg.budget.max_usd)

    # ------------------------------------------------------------ the node's record
    def _record(self, now: float, end: str | None = None) -> MeterRecord:
        p = self.price
        ended = now + TEARDOWN_S[self.cfg.compute.launcher] if end else None  # billed until the nodes are gone
        return MeterRecord(job_id=self.job_id, started_unix=self.started_unix, last_unix=now,
                           ended_unix=ended, end=end, usd_per_hour=p.usd_per_hour, nodes=self.nodes,
                           cloud=p.cloud, instance=p.instance, spot=p.spot,
                           price_source=f"{self.price_note}; {p.source}",
                           segments=self.segments if len(self.segments) > 1 or self.repricer else [],
                           region=self.node.region or p.region, zone=self.node.zone or "",
                           host=socket.gethostname(), pid=os.getpid(), pid_started=process_started(os.getpid()))

    def beat(self, force: bool = False) -> None:
        """Rewrite this attempt's record (here at once; in the store, then a re-read of the ledger, from the background
        thread), at most once per ``METER_BEAT_S`` unless forced. Never waits on the store."""
        now = self.clock()
        if self.repricer is not None and self.repricer.due(now) and self._reprice():
            force = True  # a new price is in the record at once
        if not force and now - self._last_write < METER_BEAT_S:
            return
        self._last_write = now
        self._sync.offer(self._record(now))

    def close(self, end: str, wait_s: float | None = None) -> bool:
        """The final record: how and when this attempt stops billing, ``wait_s`` from now at the latest (the process
        exits then). Waits that long for the store to take it (None: the store's retry window); False when it is
        kept on this machine only, for the next look from here to write. A second close keeps the first's word."""
        self.end = self.end or end
        ok = self._sync.close(self._record(self.clock() + (wait_s or 0.0), self.end), wait_s)
        if not ok:
            self._sync.keep(self._record(self.clock(), self.end))  # here, the end as of now: the process ends now
            log.warning("budget meter: the store did not take the final record; it is kept on this machine and written "
                        "to the store at the next look from here (the next attempt, `thrifty report`)")
        return ok
