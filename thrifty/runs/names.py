"""Flow run names as a pure function of a run's parameters and its scheduled time: the name a flow run takes when
it starts and the name its upcoming (Scheduled) flow run shows beforehand come from the same call.

A scheduled run's parameters are the deployment's merged with its schedule's (Prefect stores them merged on the
flow run); its date is the UTC date of its scheduled start, as '{date}' in a run_name resolves.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable, Mapping
from typing import Any

from thrifty.config import ConfigError, RunConfig

TRAIN_FLOW = "thrifty-train"  # the flows' Prefect names (flows/train_pipeline.py, flows/archive_stale.py)
ARCHIVE_FLOW = "thrifty-archive"
RUN_TAG_PREFIX = "thrifty-run:"  # every flow run of one Thrifty run carries thrifty-run:<run_name>


def scheduled_date(when: dt.datetime | None) -> dt.date:
    """The UTC date of a scheduled start (today when there is none): '{date}' in a run_name."""
    when = when or dt.datetime.now(dt.timezone.utc)
    return (when.astimezone(dt.timezone.utc) if when.tzinfo else when).date()


def train_name(parameters: Mapping[str, Any], when: dt.datetime | None) -> str:
    """The config's run_name with '{date}' resolved, as the run trains it (``nightly-20261129``)."""
    raw = parameters.get("config")
    day = scheduled_date(when)
    try:
        config = raw if isinstance(raw, RunConfig) else RunConfig.model_validate(raw or {})
        return config.resolved(day).run_name
    except (ValueError, ConfigError):  # the flow fails on these parameters and says why; the name only has to exist
        name = raw.get("run_name") if isinstance(raw, Mapping) else None
        return str(name or "thrifty-train").replace("{date}", day.strftime("%Y%m%d"))


def archive_name(parameters: Mapping[str, Any], when: dt.datetime | None) -> str:
    """'preview-archive-tier-20261129' for a dry run (the flow's default), 'apply-archive-tier-20261129' when
    objects move."""
    mode = "preview" if parameters.get("dry_run", True) else "apply"
    return f"{mode}-{parameters.get('tier', 'archive')}-tier-{scheduled_date(when):%Y%m%d}"


NAMERS: dict[str, Callable[[Mapping[str, Any], dt.datetime | None], str]] = {
    TRAIN_FLOW: train_name, ARCHIVE_FLOW: archive_name}


def flow_run_name(flow_name: str, parameters: Mapping[str, Any], when: dt.datetime | None) -> str | None:
    """The name a flow run of ``flow_name`` takes; None for a flow Thrifty does not name this way."""
    namer = NAMERS.get(flow_name)
    return namer(parameters or {}, when) if namer else None


def run_tag(run_name: str) -> str:
    return f"{RUN_TAG_PREFIX}{run_name}"
