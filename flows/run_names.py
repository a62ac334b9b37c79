"""How Thrifty's flow runs read in the Prefect UI: their names, and the tag that ties one Thrifty run's flow runs
together.

Prefect formats a string ``flow_run_name`` with the raw parameters, so a nightly run would be named literally
``nightly-{date}``; these callables name the run as the flow resolves it. Each train flow run is tagged
``thrifty-run:<run_name>``: one click on the tag in the UI lists every flow run of that Thrifty run (its first
try, its resumes, its reports).
"""

from __future__ import annotations

import datetime as dt
import logging
from typing import Any

from thrifty.config import ConfigError, RunConfig

RUN_TAG_PREFIX = "thrifty-run:"


def scheduled_date() -> dt.date:
    """The date this flow run was scheduled for (UTC); the hooks resolve '{date}' from the same field."""
    from prefect.runtime import flow_run

    when = flow_run.scheduled_start_time
    return when.date() if when else dt.datetime.now(dt.timezone.utc).date()


def train_run_name() -> str:
    """The train flow run's name: the config's run_name with '{date}' resolved, as the run trains it."""
    from prefect.runtime import flow_run

    raw = (flow_run.parameters or {}).get("config")
    try:
        config = raw if isinstance(raw, RunConfig) else RunConfig.model_validate(raw or {})
        return config.resolved(scheduled_date()).run_name
    except (ValueError, ConfigError):  # the flow fails on these parameters and says why; the name only has to exist
        name = raw.get("run_name") if isinstance(raw, dict) else None
        return str(name or "thrifty-train").replace("{date}", scheduled_date().strftime("%Y%m%d"))


def archive_run_name() -> str:
    """'preview-archive-tier-20261129' for a dry run, 'apply-archive-tier-20261129' when objects move."""
    from prefect.runtime import flow_run

    params = flow_run.parameters or {}
    mode = "preview" if params.get("dry_run", True) else "apply"
    return f"{mode}-{params.get('tier', 'archive')}-tier-{scheduled_date().strftime('%Y%m%d')}"


def run_tag(run_name: str) -> str:
    return f"{RUN_TAG_PREFIX}{run_name}"


def _ui_link(flow_run: Any) -> str:
    try:
        from prefect.utilities.urls import url_for

        return url_for(flow_run) or str(flow_run.id)
    except Exception:  # noqa: BLE001 - a link is a courtesy
        return str(flow_run.id)


def tag_run(run_name: str, logger: logging.Logger | logging.LoggerAdapter, cost_tags: dict[str, str] | None = None
            ) -> list[Any]:
    """Tag this flow run ``thrifty-run:<run_name>`` and ``key:value`` for each cost allocation tag (RunConfig.tags);
    returns the run's earlier flow runs, newest first. Best effort: the UI's bookkeeping never stops a run."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId, FlowRunFilterTags
    from prefect.client.schemas.sorting import FlowRunSort
    from prefect.runtime import flow_run as current

    me = current.id
    if me is None:
        return []
    tag = run_tag(run_name)
    try:
        with get_client(sync_client=True) as client:
            this = client.read_flow_run(me)
            wanted = [tag, *(f"{k}:{v}" for k, v in (cost_tags or {}).items())]
            missing = [t for t in wanted if t not in this.tags]
            if missing:
                client.update_flow_run(me, tags=[*this.tags, *missing])
            return client.read_flow_runs(
                flow_run_filter=FlowRunFilter(tags=FlowRunFilterTags(all_=[tag]), id=FlowRunFilterId(not_any_=[me])),
                sort=FlowRunSort.EXPECTED_START_TIME_DESC, limit=20)
    except Exception as exc:  # noqa: BLE001
        logger.warning("could not tag this flow run %r (%s); the run goes on", tag, exc)
        return []


def say_where_it_starts(run_name: str, earlier: list[Any], resumes_from_step: int | None,
                        logger: logging.Logger | logging.LoggerAdapter) -> None:
    """One log line: from scratch or from which checkpoint, and which earlier flow run of the same run it follows."""
    where = f"from its checkpoint at step {resumes_from_step}" if resumes_from_step is not None else "from scratch"
    tag = run_tag(run_name)
    if not earlier:
        logger.info("Thrifty run %s: its first flow run, training %s (the tag %r lists its flow runs)",
                    run_name, where, tag)
        return
    last = earlier[0]
    started = last.start_time.isoformat(timespec="seconds") if last.start_time else "never started"
    logger.info("Thrifty run %s continues %s after %d earlier flow run(s); the last was %s (started %s, ended %s). "
                "The tag %r lists them all.", run_name, where, len(earlier), _ui_link(last), started,
                last.state_name or "?", tag)
