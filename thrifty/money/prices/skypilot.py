"""SkyPilot's catalog, through its public functions only (``sky.catalog.get_hourly_cost`` and friends).

Used where the catalog file is already on this machine (``sky show-gpus`` or ``sky launch`` wrote it): thrifty never
makes SkyPilot download a missing catalog, though SkyPilot refreshes a stale one it fetched itself, as it always
does. GCP bills a GPU apart from its host VM, so a GCP price is the host's plus the GPU's, as SkyPilot adds them.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import sys
import time
from pathlib import Path
from typing import Iterator

from thrifty.money.prices.base import PriceKey, PricePoint, PriceSourceError
from thrifty.money.pricing import InstancePrice, parse_accelerator


def catalog_file(cloud: str) -> Path | None:
    """SkyPilot's ``<cloud>/vms.csv`` when SkyPilot is installed and the file is on this machine; else None."""
    if not Path("~/.sky/catalogs").expanduser().is_dir() or importlib.util.find_spec("sky") is None:
        return None  # cheap checks first: importing SkyPilot's catalog takes seconds
    try:
        from sky.catalog import common
    except Exception:  # a broken SkyPilot install must not break pricing
        return None
    path = Path(common.get_catalog_path(f"{cloud}/vms.csv"))
    return path if path.is_file() else None


def catalog_date(path: Path) -> str:
    return time.strftime("%Y-%m-%d", time.gmtime(os.path.getmtime(path)))


@contextlib.contextmanager
def sky_calls() -> Iterator[None]:
    """Around calls into SkyPilot: its ``print_exception_no_traceback`` sets ``sys.tracebacklimit = 0`` and leaves it
    so when an exception passes through (no ``finally``), which would strip every later traceback of this process."""
    before = getattr(sys, "tracebacklimit", None)
    try:
        yield
    finally:
        if before is None:
            if hasattr(sys, "tracebacklimit"):
                del sys.tracebacklimit
        else:
            sys.tracebacklimit = before


def _catalog():
    import sky.catalog as catalog

    return catalog


def _gpu(accelerator: str) -> tuple[str, int] | None:
    return parse_accelerator(accelerator) if accelerator else None


def _zones(cloud: str, host: str, gpu: tuple[str, int] | None, spot: bool, region: str) -> list[str]:
    catalog = _catalog()
    regions = (catalog.get_region_zones_for_accelerators(gpu[0], gpu[1], spot, clouds=cloud) if cloud == "gcp" and gpu
               else catalog.get_region_zones_for_instance_type(host, spot, clouds=cloud))
    return [z.name for r in regions if r.name == region for z in (r.zones or [])]


def _cost(cloud: str, host: str, gpu: tuple[str, int] | None, spot: bool, region: str | None,
          zone: str | None) -> float:
    """One node's $/hour as SkyPilot prices it (ValueError where the catalog has no such offer)."""
    catalog = _catalog()
    usd = float(catalog.get_hourly_cost(host, spot, region, zone, clouds=cloud))
    if cloud == "gcp" and gpu:
        usd += float(catalog.get_accelerator_hourly_cost(gpu[0], gpu[1], spot, region, zone, clouds=cloud))
    return usd


class SkyCatalogPrices:
    """$/hour of one instance in a region or zone, from SkyPilot's catalog (the dearest zone of the region when the
    zone is not named or not in the catalog: AWS's catalog names zones by id, use1-az1, not us-east-1a)."""

    name = "skypilot-catalog"
    endpoint = "~/.sky/catalogs"

    @sky_calls()
    def lookup(self, key: PriceKey, now: float) -> PricePoint | None:
        path = catalog_file(key.cloud)
        if path is None:
            return None
        gpu = _gpu(key.accelerator) if key.cloud == "gcp" else None
        if key.cloud == "gcp" and gpu is None and "+" in key.instance:
            gpu = (key.instance.rsplit("+", 1)[1], 1)
        source = f"SkyPilot catalog {key.cloud}/vms.csv (file date {catalog_date(path)})"
        try:
            if key.zone:
                try:
                    usd = _cost(key.cloud, key.host, gpu, key.spot, key.region, key.zone)
                    return PricePoint(usd, f"{source}, {key.zone}", now, key.region, key.zone, catalog_date(path))
                except ValueError:
                    pass
            if key.region and key.spot:
                zones = _zones(key.cloud, key.host, gpu, key.spot, key.region)
                prices = []
                for z in zones:
                    try:
                        prices.append((_cost(key.cloud, key.host, gpu, key.spot, key.region, z), z))
                    except ValueError:
                        continue
                if prices:
                    usd, zone = max(prices)
                    return PricePoint(usd, f"{source}, {key.region}, the dearest of {len(prices)} zone(s): {zone}",
                                      now, key.region, zone, catalog_date(path))
            usd = _cost(key.cloud, key.host, gpu, key.spot, key.region, None)
            where = key.region or "cheapest region"
            return PricePoint(usd, f"{source}, {where}", now, key.region, None, catalog_date(path))
        except ValueError:
            return None  # not in the catalog
        except Exception as exc:  # SkyPilot's own failures (a catalog it could not refresh, credentials)
            raise PriceSourceError(f"SkyPilot's catalog: {type(exc).__name__}: {exc}") from None


def _cheapest_region(cloud: str, host: str, gpu: tuple[str, int] | None, spot: bool) -> tuple[float, str] | None:
    catalog = _catalog()
    regions = (catalog.get_region_zones_for_accelerators(gpu[0], gpu[1], spot, clouds=cloud) if cloud == "gcp" and gpu
               else catalog.get_region_zones_for_instance_type(host, spot, clouds=cloud))
    best: tuple[float, str] | None = None
    for r in regions:
        try:
            usd = _cost(cloud, host, gpu, spot, r.name, None)
        except ValueError:
            continue
        if usd == usd and (best is None or usd < best[0]):  # a NaN price is no offer
            best = (usd, r.name)
    return best


@sky_calls()
def catalog_offers(cloud: str, accelerator: str) -> list[InstancePrice]:
    """Instances of ``cloud`` carrying exactly ``accelerator`` in SkyPilot's catalog, each at its cheapest region,
    cheapest on-demand first; [] when the catalog file is not on this machine."""
    path = catalog_file(cloud)
    if path is None:
        return []
    name, count = parse_accelerator(accelerator)
    catalog = _catalog()
    source, as_of = f"SkyPilot catalog {cloud}/vms.csv (file date {catalog_date(path)})", catalog_date(path)
    try:
        types: list[str] = []
        for spot in (False, True):
            found, _ = catalog.get_instance_type_for_accelerator(name, count, use_spot=spot, clouds=cloud)
            types.extend(found or [])
        out = []
        for host in dict.fromkeys(types):
            gpu = (name, count) if cloud == "gcp" else None
            od, spot = _cheapest_region(cloud, host, gpu, False), _cheapest_region(cloud, host, gpu, True)
            if od is None:
                continue
            vcpus, _ = catalog.get_vcpus_mem_from_instance_type(host, clouds=cloud)
            label = f"{host}+{name}" if cloud == "gcp" and host.startswith("n1-") else host  # N1 takes attached GPUs
            out.append(InstancePrice(cloud, label, f"{name}:{count}", int(vcpus or 0), od[0],
                                     spot[0] if spot else None, od[1], source, as_of, spot[1] if spot else None))
    except ValueError:
        return []
    except Exception as exc:
        raise PriceSourceError(f"SkyPilot's catalog: {type(exc).__name__}: {exc}") from None
    return sorted(out, key=lambda r: r.on_demand_usd_per_hour)


@sky_calls()
def catalog_accelerator(cloud: str, instance: str) -> str | None:
    """NAME:COUNT the instance carries in SkyPilot's catalog; None when not there (or no catalog here)."""
    if catalog_file(cloud) is None:
        return None
    try:
        accs = _catalog().get_accelerators_from_instance_type(instance.split("+", 1)[0], clouds=cloud)
    except Exception:
        return None
    if not accs:
        return None
    name, count = next(iter(accs.items()))
    return f"{name}:{int(count)}"
