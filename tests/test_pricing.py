"""Prices: the shipped table (instances and storage tiers, each row sourced and dated), SkyPilot's catalog when present
(the ``sky_catalog`` fixture, tests/price_standins.py), clear errors."""

from __future__ import annotations

import pytest

from thrifty.money import prices, pricing
from thrifty.cli import main as thrifty_main
from thrifty.money.pricing import PricingError

COMMON_GPUS = ("T4", "L4", "A10G", "V100", "A100", "H100")


def test_every_row_is_sourced_dated_and_positive():
    for row in pricing.INSTANCES:
        assert row.source and row.as_of and row.region, row
        assert row.on_demand_usd_per_hour > 0
        assert row.spot_usd_per_hour is not None and 0 < row.spot_usd_per_hour < row.on_demand_usd_per_hour, row
        assert pricing.parse_accelerator(row.accelerator)[1] >= 1
    for tier in pricing.STORAGE_TIERS:
        assert tier.source and tier.as_of and tier.usd_per_gb_month > 0, tier


def test_the_common_gpus_are_priced_on_the_clouds_that_offer_them():
    names = {(r.cloud, r.accelerator.split(":")[0]) for r in pricing.INSTANCES}
    for gpu in COMMON_GPUS:
        assert (("aws", gpu) in names), gpu  # AWS offers all six
    for gpu in ("T4", "L4", "V100", "A100", "H100"):
        assert ("gcp", gpu) in names, gpu  # GCP has no A10G
    for gpu in ("T4", "V100", "A100", "H100"):
        assert ("azure", gpu) in names, gpu  # Azure's A10 is not an A10G


def test_quotes_name_their_source_and_pick_the_cheapest_instance():
    q = pricing.quote("aws", "g5.xlarge", spot=True)
    assert (q.usd_per_hour, q.on_demand_usd_per_hour) == (0.302, 1.006)
    assert q.source.startswith("offline table (") and "2025-06" in q.source and "us-east-1" in q.source
    a = prices.quote_accelerator("gcp", "A100:1", spot=False, source="offline")
    assert a.instance == "a2-highgpu-1g" and a.accelerator == "A100:1" and a.usd_per_hour == 3.673
    assert prices.quote_accelerator("aws", "T4", spot=True).instance == "g4dn.xlarge"  # a bare name means :1
    assert pricing.quote_emulated("azure:Standard_NC4as_T4_v3", spot=False).usd_per_hour == 0.526


def test_unknown_things_are_clear_errors_never_zero():
    with pytest.raises(PricingError, match=r"no price for aws:p9\.huge\. Known aws instances: .*g5\.xlarge"):
        pricing.quote("aws", "p9.huge", spot=True)
    with pytest.raises(PricingError, match=r"no spot price for A10G:1 on gcp in the offline table.*Accelerators known on gcp"):
        prices.quote_accelerator("gcp", "A10G:1", spot=True, source="offline")
    with pytest.raises(PricingError, match="unknown cloud 'oracle'"):
        pricing.quote("oracle", "x", spot=False)
    with pytest.raises(PricingError, match="NAME or NAME:COUNT"):
        prices.quote_accelerator("aws", "A100:0", spot=True)
    with pytest.raises(PricingError, match="no prices for accelerator 'X100'"):
        prices.price_table("X100")


def test_storage_tiers_per_cloud_hot_to_cold():
    names = {c: [t.tier for t in pricing.storage_tiers(c)] for c in pricing.CLOUDS}
    assert {"STANDARD", "GLACIER", "DEEP_ARCHIVE"} <= set(names["aws"])
    assert names["gcp"] == ["STANDARD", "NEARLINE", "COLDLINE", "ARCHIVE"]
    assert names["azure"] == ["Hot", "Cool", "Cold", "Archive"]
    for cloud in pricing.CLOUDS:
        hot, cold = pricing.hot_tier(cloud), pricing.coldest_tier(cloud)
        assert hot.temperature == "hot" and cold.temperature == "archive"
        assert cold.usd_per_gb_month < hot.usd_per_gb_month / 5
        assert cold.min_storage_days >= 180 and hot.min_storage_days == 0
    assert pricing.storage_price("aws", "deep_archive").usd_per_gb_month == 0.00099
    assert pricing.storage_cloud("gs://bucket/prefix") == "gcp"
    with pytest.raises(PricingError, match="Known azure tiers: Hot, Cool, Cold, Archive"):
        pricing.storage_price("azure", "Glacier")
    with pytest.raises(PricingError, match="is local"):
        pricing.storage_cloud("/tmp/store")


# ---------------------------------------------------------------- SkyPilot's catalog, when on this machine

def test_skypilot_catalog_is_preferred_when_present_and_says_so(sky_catalog):
    q = prices.quote_accelerator("aws", "A10G:1", spot=True)
    assert q.source.startswith("SkyPilot catalog ") and "aws/vms.csv" in q.source
    assert (q.instance, q.usd_per_hour, q.region) == ("g5.xlarge", 0.29, "us-west-2")  # cheapest region's spot
    assert prices.quote_accelerator("aws", "A10G:1", spot=False).usd_per_hour == 1.006
    # the offline table still answers when asked for, and for a cloud without a catalog file
    assert prices.quote_accelerator("aws", "A10G:1", spot=True, source="offline").usd_per_hour == 0.302
    assert prices.quote_accelerator("azure", "T4:1", spot=True).source.startswith("offline table")
    with pytest.raises(PricingError, match="SkyPilot's azure catalog is not on this machine"):
        prices.quote_accelerator("azure", "T4:1", spot=True, source="skypilot")


def test_gcp_catalog_price_is_gpu_plus_host_like_skypilot(sky_catalog):
    l4 = prices.quote_accelerator("gcp", "L4:1", spot=False)
    assert l4.instance == "g2-standard-4" and l4.usd_per_hour == pytest.approx(0.56 + 0.147)
    t4 = prices.quote_accelerator("gcp", "T4:1", spot=True)  # n1 host with >= 4 vCPUs and 4x memory
    assert t4.instance == "n1-highmem-4+T4" and t4.usd_per_hour == pytest.approx(0.14 + 0.05)


def test_prices_command_filters_by_accelerator_and_names_its_source(capsys):
    assert thrifty_main(["prices", "--accelerator", "A100", "--source", "offline"]) == 0
    out = capsys.readouterr().out
    assert "a2-highgpu-1g" in out and "p4d.24xlarge" in out and "g5.xlarge" not in out
    assert "Sources:" in out and "2025-06" in out
    assert thrifty_main(["prices", "--storage", "--cloud", "aws"]) == 0
    out = capsys.readouterr().out
    assert "DEEP_ARCHIVE" in out and "NEARLINE" not in out
    assert thrifty_main(["prices", "-a", "Z9"]) == 2
    assert "no prices for accelerator 'Z9'" in capsys.readouterr().err


def test_prices_command_uses_the_catalog_when_present(sky_catalog, capsys):
    assert thrifty_main(["prices", "-a", "A10G:1", "--cloud", "aws"]) == 0
    out = capsys.readouterr().out
    assert "g5.2xlarge" in out and "SkyPilot catalog" in out


def test_calls_into_skypilot_leave_tracebacks_as_they_were():
    """SkyPilot's print_exception_no_traceback sets sys.tracebacklimit = 0 without a finally: an error passing
    through it would strip every later traceback of the flow process."""
    import sys

    from sky.utils import ux_utils

    from thrifty.money.prices.skypilot import sky_calls

    @sky_calls()
    def fails_inside_skypilot():
        with ux_utils.print_exception_no_traceback():
            raise ValueError("no such offer")

    assert not hasattr(sys, "tracebacklimit")
    with pytest.raises(ValueError):
        fails_inside_skypilot()
    assert not hasattr(sys, "tracebacklimit"), "the limit SkyPilot set is undone"
