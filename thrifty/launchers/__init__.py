"""Launchers: where a training job runs. One protocol (``base``) and a registry from ``compute.launcher`` to it.

The registry names each launcher's class by module path, so the protocol never imports its
implementations, and SkyPilot (an optional install) is imported only when a run asks for it.
"""

from __future__ import annotations

import importlib

from thrifty.config import ConfigError, RunConfig
from thrifty.launchers.base import JobState, JobStatus, Launcher, LaunchError, node_env

REGISTRY: dict[str, str] = {
    "local": "thrifty.launchers.local:LocalLauncher",  # emulated spot on this machine
    "skypilot": "thrifty.launchers.skypilot:SkyPilotLauncher",  # SkyPilot managed jobs on AWS, GCP, Azure
}


def make_launcher(cfg: RunConfig) -> Launcher:
    """The launcher ``cfg.compute.launcher`` names, built for ``cfg``."""
    target = REGISTRY.get(cfg.compute.launcher)
    if target is None:
        raise ConfigError(f"'compute.launcher': {cfg.compute.launcher!r} is not a launcher; use "
                          f"{' or '.join(REGISTRY)}")
    module, _, name = target.partition(":")
    return getattr(importlib.import_module(module), name)(cfg)


__all__ = ["REGISTRY", "JobState", "JobStatus", "LaunchError", "Launcher", "make_launcher", "node_env"]
