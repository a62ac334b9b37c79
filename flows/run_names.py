"""How Thrifty's flow runs read in the Prefect UI: their names, the upcoming runs' names, and the tag that ties one
Thrifty run's flow runs together.

Prefect formats a string ``flow_run_name`` with the raw parameters, so a nightly run would be named literally
``nightly-{date}``; these callables name the run as the flow resolves it, by the pure functions of
thrifty.runs.names that also name the upcoming (Scheduled) runs ahead (deployments.upcoming). Each train flow run is
tagged ``thrifty-run:<run_name>``; the UI's tags are not links, so the start log line and the summary artifact carry
the link that lists every flow run of that Thrifty run (its first try, its resumes, its reports).
"""

from __future__ import annotations

import contextlib
import datetime as dt
import logging
from typing import Any, Iterator

from tasks.links import flow_run_link, run_flow_runs_link
from thrifty.runs import names
from thrifty.runs.names import run_tag


def _scheduled_start() -> dt.datetime | None:
    from prefect.runtime import flow_run

    return flow_run.scheduled_start_time


def scheduled_date() -> dt.date:
    """The date this flow run was scheduled for (UTC); the hooks resolve '{date}' from the same field."""
    return names.scheduled_date(_scheduled_start())


def train_run_name() -> str:
    """The train flow run's name: the config's run_name with '{date}' resolved, as the run trains it."""
    from prefect.runtime import flow_run

    return names.train_name(flow_run.parameters or {}, _scheduled_start())


def archive_run_name() -> str:
    """'preview-archive-tier-20261129' for a dry run, 'apply-archive-tier-20261129' when objects move."""
    from prefect.runtime import flow_run

    return names.archive_name(flow_run.parameters or {}, _scheduled_start())


def name_upcoming(logger: logging.Logger | logging.LoggerAdapter) -> None:
    """Give this run's deployment's upcoming runs the names they will run under (the scheduler adds one with a
    random name as each run leaves the queue). Best effort: a failure is a warning, never the run's."""
    try:
        from prefect.client.orchestration import get_client
        from prefect.runtime import deployment

        deployment_id = deployment.id
        if deployment_id is None:  # a search's trial, a run of `thrifty run`: no deployment, no schedule
            return

        from deployments.upcoming import name_upcoming_runs

        with get_client(sync_client=True) as client:
            renamed = name_upcoming_runs(client, deployment_id)
        if renamed:
            logger.info("upcoming flow run(s) named as they will run: %s",
                        ", ".join(f"{run.name} -> {name}" for run, name in renamed))
    except Exception as exc:  # noqa: BLE001
        logger.warning("could not name this deployment's upcoming flow runs (%s); the run goes on", exc)


@contextlib.contextmanager
def upcoming_named(logger: logging.Logger | logging.LoggerAdapter) -> Iterator[None]:
    """Name the deployment's upcoming runs as this run starts and again as it ends (by then the scheduler has
    replaced it in the queue)."""
    name_upcoming(logger)
    try:
        yield
    finally:
        name_upcoming(logger)


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
    """One log line: from scratch or from which checkpoint, which earlier flow run of the same run it follows, and
    the link that lists them all (the UI makes a link of an address in a log line, never of a tag)."""
    where = f"from its checkpoint at step {resumes_from_step}" if resumes_from_step is not None else "from scratch"
    # the UI's link ends at the ')' (and at a space), never swallowing the sentence's punctuation
    every = f"(every flow run of it, tagged {run_tag(run_name)}: {run_flow_runs_link(run_name)})"
    if not earlier:
        logger.info("Thrifty run %s: its first flow run, training %s %s", run_name, where, every)
        return
    last = earlier[0]
    started = last.start_time.isoformat(timespec="seconds") if last.start_time else "never started"
    logger.info("Thrifty run %s continues %s after %d earlier flow run(s); the last was %s (started %s, ended %s) %s",
                run_name, where, len(earlier), flow_run_link(last), started, last.state_name or "?", every)
