"""Today's prices (issue 28): the clouds' own sources on wire-protocol stand-ins (EC2 spot price history on moto's
server, the Azure Retail Prices API on loopback, SkyPilot's catalog files in the test HOME), the store's cache with
its time and source, the dated table last; the node's meter and the watchers pricing each interval at the price in
force; the gate, the ranking, `thrifty plan` and `thrifty prices` at the freshest price, saying where it came from.
No test reaches the internet: tests/conftest.py points every live source at a closed loopback port by default.
"""

from __future__ import annotations

import ast
import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from conftest import REPO
from tasks.budget import estimate_for  # imports Prefect: here, not under a test's captured output
from thrifty.config import build_config
from thrifty.money.ledger import Attempt, read_attempts, read_meters, reconcile, write_job_attempts
from thrifty.money.meter import NodeIdentity, NodeMeter, Price, prices_env
from thrifty.money.prices import LivePrices, PriceKey, price_mode
from thrifty.money.prices.aws import Ec2SpotPrices
from thrifty.money.prices.azure import AzureRetailPrices
from thrifty.money.prices.cache import cache_key
from thrifty.money.prices.skypilot import SkyCatalogPrices
from thrifty.protocol import ENV_BILLING_START, ENV_JOB_ID, ENV_PRICES
from thrifty.storage import open_store

T4 = "Standard_NC4as_T4_v3"  # in the table: azure eastus, spot $0.158/h, on-demand $0.526/h


class Clock:
    def __init__(self, t: float = 1_800_000_000.0):
        self.t = t

    def __call__(self) -> float:
        return self.t


# ---------------------------------------------------------------- the sources, each on its stand-in


def test_aws_spot_price_is_the_newest_entry_of_its_zone_or_the_dearest_zone(ec2_spot):
    now = time.time()
    ec2_spot.set("g5.xlarge", "us-east-1a", 0.40, since=now - 7200)
    ec2_spot.set("g5.xlarge", "us-east-1a", 0.55, since=now - 600)  # the newest entry is the price in force
    ec2_spot.set("g5.xlarge", "us-east-1b", 0.31, since=now - 300)
    source = Ec2SpotPrices()
    zone = source.lookup(PriceKey("aws", "g5.xlarge", True, "us-east-1", "us-east-1b"), now)
    assert (zone.usd_per_hour, zone.zone, zone.region) == (0.31, "us-east-1b", "us-east-1")
    assert zone.source == "AWS EC2 spot price history (us-east-1b)" and zone.as_of.startswith("20")
    region = source.lookup(PriceKey("aws", "g5.xlarge", True, None, "us-east-1a"), now)  # the region from the zone
    assert region.usd_per_hour == 0.55
    dearest = source.lookup(PriceKey("aws", "g5.xlarge", True, "us-east-1"), now)  # no zone: never count low
    assert dearest.usd_per_hour == 0.55 and "the dearest of" in dearest.source and dearest.zone == "us-east-1a"
    assert source.lookup(PriceKey("aws", "g5.xlarge", False, "us-east-1"), now) is None  # on-demand: not its job
    assert source.lookup(PriceKey("aws", "p9.huge", True, "us-east-1"), now) is None  # no such type


def test_azure_retail_prices_follow_next_page_and_take_the_linux_meter(azure_prices):
    azure_prices.set(T4, "eastus", spot=True, usd=0.21)
    azure_prices.set(T4, "eastus", spot=False, usd=0.60)
    source = AzureRetailPrices()
    assert source.endpoint == azure_prices.url
    spot = source.lookup(PriceKey("azure", T4, True, "eastus"), time.time())
    assert spot.usd_per_hour == 0.21 and "Azure Retail Prices API (eastus, meter 'NC4as T4 v3 Spot')" == spot.source
    assert len(azure_prices.requests) >= 3, "one item a page: the reader follows NextPageLink"
    assert source.lookup(PriceKey("azure", T4, False, "eastus"), time.time()).usd_per_hour == 0.60
    assert source.lookup(PriceKey("azure", T4, True, "westus2"), time.time()) is None
    assert source.lookup(PriceKey("azure", "Standard_X' or 1 eq 1", True, "eastus"), time.time()) is None


def test_skypilot_catalog_through_its_public_functions(sky_catalog):
    catalog = SkyCatalogPrices()
    # GCP bills the GPU and its host apart: the price is both, in the zone
    t4 = catalog.lookup(PriceKey("gcp", "n1-highmem-4+T4", True, "us-central1", "us-central1-a", "T4:1"), time.time())
    assert t4.usd_per_hour == pytest.approx(0.14 + 0.05) and "SkyPilot catalog gcp/vms.csv" in t4.source
    # AWS's catalog names zones by id (use1-az1): a zone name falls back to the region's dearest zone
    g5 = catalog.lookup(PriceKey("aws", "g5.xlarge", True, "us-west-2", "us-west-2a"), time.time())
    assert g5.usd_per_hour == 0.29 and "the dearest of 1 zone(s)" in g5.source
    assert catalog.lookup(PriceKey("aws", "g5.xlarge", False, "us-east-1"), time.time()).usd_per_hour == 1.006
    assert catalog.lookup(PriceKey("azure", T4, True, "eastus"), time.time()) is None  # no azure catalog here


def test_skypilot_is_read_through_public_names_only():
    """No private SkyPilot name (``_ACC_INSTANCE_TYPE_DICTS`` and the like) anywhere in the library."""
    private = []
    for path in (REPO / "thrifty").rglob("*.py"):
        tree = ast.parse(path.read_text())
        sky_names = {a.asname or a.name for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)
                     and (n.module or "").startswith("sky") for a in n.names}
        sky_names |= {a.asname or a.name.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.Import)
                      for a in n.names if a.name.startswith("sky")}
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("sky"):
                private += [f"{path.name}: {node.module}.{a.name}" for a in node.names if a.name.startswith("_")]
            if isinstance(node, ast.Attribute) and node.attr.startswith("_") and isinstance(node.value, ast.Name) \
                    and node.value.id in sky_names:
                private.append(f"{path.name}: {node.value.id}.{node.attr}")
    assert not private, private


# ---------------------------------------------------------------- the chain: fresh cache, sources, newest known, table


def test_prices_are_cached_in_the_store_with_time_and_source_and_read_again_when_old(azure_prices, tmp_path,
                                                                                      monkeypatch):
    store, clock = open_store(str(tmp_path / "store")), Clock()
    live = LivePrices(store, spot_max_age_s=3600, clock=clock)
    key = PriceKey("azure", T4, True, "eastus")
    azure_prices.set(T4, "eastus", spot=True, usd=0.21)
    first = live.lookup(key)
    assert (first.usd_per_hour, first.fetched_unix, first.live) == (0.21, clock.t, True)
    cached = json.loads((tmp_path / "store" / cache_key(key)).read_text())
    assert cached["usd_per_hour"] == 0.21 and cached["fetched_unix"] == clock.t and "Azure" in cached["source"]

    azure_prices.set(T4, "eastus", spot=True, usd=0.34)
    clock.t += 1800  # fresh: the cache answers, nothing is asked
    asked = len(azure_prices.requests)
    again = LivePrices(store, spot_max_age_s=3600, clock=clock).lookup(key)  # another process, the same store
    assert again.usd_per_hour == 0.21 and again.cached and len(azure_prices.requests) == asked
    assert "read 30 min ago (cached in the store)" in again.describe(clock.t)
    clock.t += 1801  # older than spot_price_max_age_s: read again
    assert live.lookup(key).usd_per_hour == 0.34

    # the source gone: the newest price known, saying its age; with none known, the table, saying its date
    monkeypatch.setenv("THRIFTY_AZURE_PRICES_URL", "http://127.0.0.1:9/api/retail/prices")
    clock.t += 7200
    stale = LivePrices(store, spot_max_age_s=3600, clock=clock)
    point = stale.lookup(key)
    assert point.usd_per_hour == 0.34 and "read 2.0 h ago" in point.describe(clock.t)
    assert stale.failures and "azure-retail-prices" in stale.failures[0]
    table = LivePrices(open_store(str(tmp_path / "empty")), clock=clock).lookup(key)
    assert table.usd_per_hour == 0.158 and not table.live
    assert table.source.endswith("price from a table of 2025-06: check it")
    # on-demand list prices are read again daily, not hourly
    assert live.max_age_s(spot=False) == 24 * 3600 and live.max_age_s(spot=True) == 3600


def test_a_rise_is_metered_from_when_the_old_price_was_seen_at_its_source_not_from_a_cached_read(azure_prices,
                                                                                                  tmp_path):
    """A watcher and a node share the store's price cache. A read answered from the cache carries a price seen at its
    source earlier; a rise found by the next read may have begun any time since then, so it is metered from then
    (seen in a stressed suite: the rise dated from the cached read, 0.3 ms after the change, and the ledger came out
    $1.3e-7 under the bill)."""
    from thrifty.money.prices.repricing import Repricer, change_from

    store, clock = open_store(str(tmp_path / "store")), Clock()
    key = PriceKey("azure", T4, True, "eastus")
    azure_prices.set(T4, "eastus", spot=True, usd=0.80)
    node = LivePrices(store, spot_max_age_s=1.0, clock=clock)
    assert node.lookup(key).fetched_unix == clock.t  # the node asks the source at t0 and caches the answer
    seen_by_node = clock.t
    watcher = Repricer(LivePrices(store, spot_max_age_s=1.0, clock=clock), key)
    clock.t += 0.5
    changed_at = clock.t  # the price rises; the watcher reads 0.2 s later and the cache still answers
    azure_prices.set(T4, "eastus", spot=True, usd=1.60)
    clock.t += 0.2
    assert watcher.read().usd_per_hour == 0.80
    clock.t += 1.0
    rise = watcher.read()
    assert rise.usd_per_hour == 1.60
    since = change_from(0.80, rise.usd_per_hour, watcher.previous_seen_unix, clock.t)
    assert since == seen_by_node <= changed_at, "dated from when the old price was last seen, not from the cached read"
    assert change_from(1.60, 0.80, watcher.previous_seen_unix, clock.t) == clock.t, "a fall counts from now"


def test_budget_prices_table_asks_no_source(azure_prices, tmp_path):
    azure_prices.set(T4, "eastus", spot=True, usd=0.21)
    cfg = build_config({"store": str(tmp_path), "budget": {"prices": "table"}, "compute": {"launcher": "skypilot"}})
    assert price_mode(cfg) == "table"
    point = LivePrices.for_config(cfg, open_store(str(tmp_path))).lookup(PriceKey("azure", T4, True, "eastus"))
    assert point.usd_per_hour == 0.158 and not azure_prices.requests
    auto = build_config({"store": str(tmp_path)})
    assert price_mode(auto) == "table"  # the local launcher's emulated instance: the table unless asked
    assert price_mode(auto.updated({"compute": {"launcher": "skypilot"}}, "test")) == "live"


# ---------------------------------------------------------------- the ledger: price segments, old ledgers still read


def test_attempts_cost_each_interval_at_its_price_and_old_rows_read_as_before():
    old = Attempt(**json.loads('{"job_id": "j", "number": 1, "cloud": "aws", "region": "us-east-1", '
                               '"instance": "g5.xlarge", "spot": true, "usd_per_hour": 0.36, "nodes": 2, '
                               '"started_unix": 0.0, "ended_unix": 3600.0, "end_reason": "succeeded"}'))
    assert old.cost_usd() == pytest.approx(0.72) and old.segments is None
    a = Attempt("j", 1, "aws", "us-east-1", "g5.xlarge", True, 0.30, 2, 0.0)
    assert a.repriced(0.60, "EC2", 1800.0) and not a.repriced(0.60, "EC2", 2000.0)
    a.ended_unix = 3600.0
    assert a.cost_usd() == pytest.approx(2 * (0.15 + 0.30)) and a.usd_per_hour == 0.60
    assert a.cost_usd(until=1800.0) == pytest.approx(0.30)
    again = Attempt(**json.loads(json.dumps(a.row())))  # the JSON line round trip
    assert again.cost_usd() == pytest.approx(a.cost_usd()) and again.segments == [[0.0, 0.30, ""], [1800.0, 0.6, "EC2"]]


# ---------------------------------------------------------------- the node meters its own price, interval by interval


def azure_node_env(t0: float) -> dict[str, str]:
    """What the local launcher hands a node emulating an Azure T4 spot VM (the table's price, its region)."""
    return {ENV_PRICES: prices_env([Price("azure", T4, True, 0.158, "T4:1", "offline table", "eastus")]),
            ENV_BILLING_START: repr(t0), ENV_JOB_ID: "local-doubling"}


def test_meter_stops_earlier_when_the_price_doubles_and_spend_stays_under_the_cap(azure_prices, tmp_path):
    """$1 at $3.60/h lasts 1000 s; the price doubles at 305 s, the node reads it every 60 s. The stop comes ~350 s
    earlier, and the bill at the prices in force in each interval stays <= max_usd (a rise is counted from when the
    old price was last seen at its source, so the meter never counts less than the bill)."""
    clock = Clock()
    t0 = clock.t
    store = open_store(str(tmp_path / "store"))
    cfg = build_config({"run_name": "doubling", "store": str(tmp_path / "store"),
                        "compute": {"emulate": f"azure:{T4}"},
                        "budget": {"max_usd": 1.0, "prices": "live", "spot_price_max_age_s": 60, "stop_margin_s": 30}})
    azure_prices.set(T4, "eastus", spot=True, usd=3.6)
    meter = NodeMeter.from_env(store, cfg, azure_node_env(t0), clock=clock)
    assert meter.rate == 3.6 and "Azure Retail Prices API" in meter.segments[0][2], "priced at boot, from the cloud"
    flip = t0 + 305
    while not meter.over_cap(save_s=0.0, step_s=1.0):
        clock.t += 1.0
        if clock.t == flip:
            azure_prices.set(T4, "eastus", spot=True, usd=7.2)
        meter.beat()
        assert clock.t < t0 + 2000
    stop = clock.t
    at_old_price = t0 + 1000 - 30  # where the same cap would have stopped it at $3.60/h
    assert stop < at_old_price - 300, f"the stop came {stop - t0:.0f} s in"
    billed_until = stop + meter.reserve_s(0.0, 1.0)  # the most a stop costs after the decision
    bill = (3.6 * (flip - t0) + 7.2 * (billed_until - flip)) / 3600  # the prices in force, interval by interval
    assert bill <= cfg.budget.max_usd
    assert bill <= meter.spend_usd(billed_until) <= cfg.budget.max_usd + 1e-9
    # from when $3.60 was last seen at its source: the read at +300 s was the store's cache answering with +240 s
    assert [s[1] for s in meter.segments] == [3.6, 7.2] and meter.segments[1][0] == t0 + 240

    meter.close("budget")
    [record] = read_meters(store, "doubling")
    assert [s[1] for s in record.segments] == [3.6, 7.2] and record.region == "eastus"
    assert "Azure Retail Prices API" in record.price_source and record.usd_per_hour == 7.2
    [attempt] = reconcile([], [record], clock.t + 1000)  # the ledger, from the node's record alone
    assert attempt.cost_usd() == pytest.approx(meter.spend_usd(record.ended_unix))
    # a watcher's row left open, its watcher gone: the node's dearer view counts
    open_row = Attempt("local-doubling", 1, "azure", "eastus", T4, True, 3.6, 1, t0)
    [merged] = reconcile([open_row], [record], clock.t + 1000)
    assert merged.segments and merged.cost_usd() == pytest.approx(attempt.cost_usd())


def test_a_node_that_cannot_tell_what_it_is_keeps_the_dearest_candidate_and_one_that_can_meters_itself(azure_prices, tmp_path):
    azure_prices.set(T4, "eastus", spot=True, usd=9.9)
    cfg = build_config({"run_name": "unknown", "store": str(tmp_path), "compute": {"launcher": "skypilot"},
                        "budget": {"prices": "live"}})
    env = {ENV_PRICES: prices_env([Price("azure", T4, True, 0.2, "T4:1", "x", "eastus"),
                                   Price("aws", "g4dn.xlarge", True, 0.3, "T4:1", "y", "us-east-1")])}
    meter = NodeMeter.from_env(open_store(str(tmp_path)), cfg, env)  # no identity probe: it cannot tell
    assert meter.repricer is None and meter.rate == 0.3 and "dearest" in meter.price_note
    # SkyPilot picked a size no candidate named: the node meters what it is, at that size's own price
    azure_prices.set("Standard_NC8as_T4_v3", "eastus", spot=True, usd=0.45)
    bigger = NodeMeter.from_env(open_store(str(tmp_path)), cfg, env, identify=lambda _env: NodeIdentity(
        "azure", "Standard_NC8as_T4_v3", True, "eastus", "2"))
    assert bigger.rate == 0.45 and bigger.price.instance == "Standard_NC8as_T4_v3" and "no candidate" in \
        bigger.price_note


# ---------------------------------------------------------------- the watch loop prices what it sees, hourly


def test_the_skypilot_watch_loop_prices_the_attempt_where_it_runs_and_again_as_it_ages(azure_prices, tmp_path,
                                                                                        monkeypatch):
    from test_skypilot import T0, FakeSky, on_cluster, record
    from thrifty.launchers.skypilot import SkyPilotLauncher

    fake = FakeSky(monkeypatch)
    cfg = build_config({"run_name": "cloud-run", "recipe": "digits", "store": str(tmp_path / "store"),
                        "compute": {"launcher": "skypilot", "clouds": ["azure"], "accelerators": ["T4:1"]},
                        "budget": {"spot_price_max_age_s": 600}})
    azure_prices.set(T4, "eastus", spot=True, usd=0.20)
    clock = {"now": T0 + 100}
    launcher = SkyPilotLauncher(cfg, clock=lambda: clock["now"])
    fake.records[7] = record(7, "RUNNING", start_at=T0 + 60, last_recovered_at=T0 + 60,
                             **on_cluster("Azure", "eastus", T4, "T4:1"))
    [a] = launcher.status("sky-7").attempts
    assert a.usd_per_hour == 0.20 and a.price_source.startswith("Azure Retail Prices API (eastus")
    azure_prices.set(T4, "eastus", spot=True, usd=0.50)
    clock["now"] = T0 + 400  # younger than spot_price_max_age_s: not read again
    assert launcher.status("sky-7").attempts[0].usd_per_hour == 0.20
    clock["now"] = T0 + 800
    [a] = launcher.status("sky-7").attempts
    assert a.usd_per_hour == 0.50 and a.segments[1][:2] == [T0 + 100, 0.50]  # a rise counts from the read before
    fake.set(7, status="SUCCEEDED", end_at=T0 + 1000)
    [a] = launcher.status("sky-7").attempts
    assert a.cost_usd() == pytest.approx((0.20 * 40 + 0.50 * 900) / 3600)
    write_job_attempts(open_store(cfg.store), "cloud-run", "sky-7", [a])
    [back] = read_attempts(open_store(cfg.store), "cloud-run")
    assert back.cost_usd() == pytest.approx(a.cost_usd()) and len(back.segments) == 2


# ---------------------------------------------------------------- the gate, the ranking, plan and prices


def azure_cfg(tmp_path, **budget):
    return build_config({"run_name": "fresh", "recipe": "digits", "store": str(tmp_path / "store"),
                         "compute": {"launcher": "skypilot", "clouds": ["azure", "aws"], "accelerators": ["T4:1"],
                                     "on_demand_fallback": True}, "budget": budget})


def test_the_gate_and_the_ranking_use_the_freshest_price_and_say_where_it_came_from(azure_prices, tmp_path):
    from thrifty.money.estimate import OverBudgetPlan, gate, smallest_budget_usd
    from thrifty.launchers.skypilot import candidates, plan_text, task_config
    from thrifty.results import PrepResult, SmokeResult

    azure_prices.set(T4, "eastus", spot=True, usd=0.111)  # the table says $0.158
    azure_prices.set(T4, "eastus", spot=False, usd=0.444)
    cfg = azure_cfg(tmp_path)
    cands, _ = candidates(cfg)
    by = {(k.cloud, k.spot): k.quote for k in cands}
    assert by["azure", True].usd_per_hour == 0.111 and by["azure", True].source.startswith("Azure Retail Prices API")
    assert by["azure", False].usd_per_hour == 0.444
    # AWS's EC2 does not answer here (a closed loopback port): the table, saying its date
    assert by["aws", True].usd_per_hour == 0.158 and by["aws", True].source.endswith("price from a table of 2025-06: "
                                                                                     "check it")
    assert cands[0].cloud == "azure" and cands[0].spot, "the fresh price ranks it first"

    plan = plan_text(cfg)
    sources = plan.split("# Price sources:")[1]
    assert "Azure Retail Prices API (eastus, meter 'NC4as T4 v3 Spot')" in sources and "check it" in sources
    handed = json.loads(task_config(cfg)["envs"][ENV_PRICES])  # what the node starts from
    azure_spot = next(p for p in handed if p["cloud"] == "azure" and p["spot"])
    assert azure_spot["usd_per_hour"] == 0.111 and azure_spot["region"] == "eastus" and azure_spot["fetched_unix"] > 0

    prep = PrepResult(key="k", hit=True, seconds=0.0, cold_seconds=0.0, examples={"train": 64_000_000, "val": 10},
                      bytes=0)
    smoke = SmokeResult(recipe="digits", steps=3, losses=[1.0], cpu_step_time_s=0.4, examples_per_step=64,
                        parameters=1, precision_checked="fp32", cache_key="k")
    estimate = estimate_for(cfg, prep, smoke)
    assert estimate.usd_per_hour == 0.111 and estimate.price_source.startswith("Azure Retail Prices API")
    smallest, _ = smallest_budget_usd(estimate, 0.0, 10)
    with pytest.raises(OverBudgetPlan, match=r"at \$0\.111/h from Azure Retail Prices API \(eastus"):
        gate(estimate, smallest * 1.01, False, 0.0, 10)  # the refusal says which price it used, and from where



def test_thrifty_prices_shows_the_freshest_price_and_numbers_its_sources(azure_prices, capsys):
    from thrifty.cli import main

    azure_prices.set(T4, "eastus", spot=True, usd=0.111)
    azure_prices.set(T4, "eastus", spot=False, usd=0.444)
    assert main(["prices", "-a", "T4", "--cloud", "azure"]) == 0
    out = capsys.readouterr().out
    row = next(line for line in out.splitlines() if T4 in line)
    assert "0.444" in row and "0.111" in row and row.rstrip().endswith("[1/2]")
    assert "[2] Azure Retail Prices API (eastus, meter 'NC4as T4 v3 Spot')" in out
    assert main(["prices", "-a", "T4", "--cloud", "azure", "--source", "offline"]) == 0
    out = capsys.readouterr().out
    assert "0.158" in out and "price from a table of 2025-06: check it" in out and "Azure Retail" not in out


def test_budget_prices_table_prices_the_candidates_from_the_table(azure_prices, tmp_path):
    from thrifty.launchers.skypilot import candidates

    azure_prices.set(T4, "eastus", spot=True, usd=0.111)
    cands, _ = candidates(azure_cfg(tmp_path, prices="table"))
    assert {k.quote.usd_per_hour for k in cands if k.spot} == {0.158} and not azure_prices.requests


# ---------------------------------------------------------------- the node's identity names its zone


def test_the_identity_probe_reads_the_zone(monkeypatch):
    from thrifty.launchers import identity

    answers = {"/latest/meta-data/instance-type": "g5.xlarge", "/latest/meta-data/instance-life-cycle": "spot",
               "/latest/meta-data/placement/region": "us-east-1",
               "/latest/meta-data/placement/availability-zone": "us-east-1c",
               "/computeMetadata/v1/instance/machine-type": "projects/1/machineTypes/g2-standard-4",
               "/computeMetadata/v1/instance/scheduling/provisioning-model": "SPOT",
               "/computeMetadata/v1/instance/zone": "projects/1/zones/us-central1-b"}

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args) -> None:
            pass

        def _answer(self) -> None:
            body = answers.get(self.path, "").encode()
            if self.path.startswith("/latest/api/token"):
                body = b"token"
            self.send_response(200 if body else 404)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        do_GET = do_PUT = _answer

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        monkeypatch.setenv("THRIFTY_METADATA_BASE", f"http://127.0.0.1:{server.server_address[1]}")
        assert identity.probe("aws") == identity.NodeIdentity("aws", "g5.xlarge", True, "us-east-1", "us-east-1c")
        assert identity.probe("gcp") == identity.NodeIdentity("gcp", "g2-standard-4", True, "us-central1",
                                                              "us-central1-b")
    finally:
        server.shutdown()
        server.server_close()


# ---------------------------------------------------------------- end to end: the real node program, the price doubles


@pytest.mark.slow
def test_a_price_that_doubles_mid_run_stops_the_real_job_earlier_and_under_the_cap(azure_prices, tmp_path,
                                                                                     monkeypatch):
    """The local launcher emulates an Azure T4 spot VM at its live price (the Retail Prices stand-in); the training
    program meters itself at the same source, reading it every second. $0.02 lasts 90 s at $0.80/h; once the node
    has booted and priced itself, the price doubles. The node stops itself at the cap well before 90 s, with a checkpoint, and the bill at
    the prices in force in each interval (the stand-in's history) is <= max_usd, as are the ledger and the node's
    record, each of which priced the change."""
    from thrifty.launchers.local import LocalLauncher

    max_usd, p0 = 0.02, 0.80
    store_dir = tmp_path / "store"
    cfg = build_config({
        "run_name": "doubling", "recipe": "digits", "store": str(store_dir), "recipe_params": {"hidden": 512},
        "train": {"max_epochs": 5000, "micro_batch": 16, "precision": "fp32", "checkpoint_every": 50,
                  "log_every": 5, "early_stopping": {"enabled": False}},
        "compute": {"emulate": f"azure:{T4}", "use_spot": True},
        # the margin covers the program's exit after its stop (seen: ~6 s from its last record to its exit here)
        "budget": {"max_usd": max_usd, "prices": "live", "spot_price_max_age_s": 1.0, "stop_margin_s": 10.0,
                   "burn_rate_alert_usd_per_hour": None}})
    azure_prices.set(T4, "eastus", spot=True, usd=p0)
    monkeypatch.setenv("THRIFTY_MIN_STEP_S", "0.01")  # the node's pace: the cap is in wall time, no core spent waiting
    launcher = LocalLauncher(cfg)
    job = launcher.submit(cfg)
    store = open_store(str(store_dir))
    deadline = time.time() + 240
    while not read_meters(store, "doubling"):  # the node has booted and priced itself: now the price doubles
        assert time.time() < deadline and not launcher.status(job).state.terminal, launcher.status(job).message
        time.sleep(0.2)
    flip = azure_prices.set(T4, "eastus", spot=True, usd=2 * p0)
    status = launcher.wait(job, timeout=240)
    assert status.state.terminal and "budget cap" in status.message, status.message
    write_job_attempts(store, "doubling", job, status.attempts)  # as the watch loop records them

    [attempt] = status.attempts
    start, end = attempt.started_unix, attempt.ended_unix
    assert flip > start and attempt.end_reason == "budget"
    bill = (p0 * (flip - start) + 2 * p0 * (end - flip)) / 3600  # the prices in force, interval by interval
    at_old_price = start + max_usd / p0 * 3600 - 10.0  # where the cap would have stopped it at $0.80/h
    print(f"\n[prices] flip at +{flip - start:.1f} s, stop at +{end - start:.1f} s (at the old price: "
          f"+{at_old_price - start:.0f} s), bill ${bill:.5f} of ${max_usd}")
    assert end < at_old_price - 5, "the rise moved the stop earlier"
    assert bill <= max_usd

    [meter] = read_meters(store, "doubling")
    assert meter.end == "budget" and [s[1] for s in meter.segments][-1] == 2 * p0
    assert "Azure Retail Prices API" in meter.segments[-1][2]
    assert attempt.segments and attempt.segments[-1][1] == 2 * p0, "the watcher priced the change too"
    ledger = sum(a.cost_usd() for a in read_attempts(store, "doubling"))
    assert bill - 1e-9 <= ledger <= max_usd, f"ledger ${ledger:.5f}, bill ${bill:.5f}"
    assert list((store_dir / "runs" / "doubling" / "ckpt").glob("*/COMMIT")), "a checkpoint was kept"
