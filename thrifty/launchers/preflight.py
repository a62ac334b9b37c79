"""Checks that need no money: everything a user can get wrong is caught here, before preprocessing or launch."""

from __future__ import annotations

from thrifty.config import ConfigError, RunConfig
from thrifty.config.report import tracking_uri
from thrifty.launchers import make_launcher
from thrifty.launchers.availability import spot_trace
from thrifty.money.pricing import PricingError, quote_emulated
from thrifty.spot.deadline_run import deadline_moves
from thrifty.storage import StoreError, check_store


def check_before_spending(cfg: RunConfig) -> None:
    """Raise ConfigError naming the setting to change if this run cannot be priced or launched as configured."""
    make_launcher(cfg)  # an unavailable launcher is a ConfigError
    tracking_uri(cfg.report)  # a malformed $MLFLOW_TRACKING_URI: said now, not at the run's end
    if cfg.compute.launcher == "local":
        try:
            quote_emulated(cfg.compute.emulate, cfg.compute.use_spot)
            if deadline_moves(cfg):  # the deadline policy may move the job to on-demand: it needs that price too
                quote_emulated(cfg.compute.emulate, False)
        except PricingError as exc:
            raise ConfigError(f"'compute.emulate': {exc} Pick one of those for the local launcher to meter.") from None
        spot_trace(cfg)  # a trace that cannot be read is a ConfigError
    elif cfg.compute.launcher == "skypilot":
        from thrifty.launchers.skypilot import preflight as skypilot_preflight

        skypilot_preflight(cfg)  # offline: prices, credentials present, a task SkyPilot's parser accepts
    try:  # last: the one check here that talks to a service (a probe object written, read and removed)
        check_store(cfg.store)
    except StoreError as exc:
        raise ConfigError(f"'store': {exc}") from None
