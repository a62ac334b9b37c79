"""The main job: preprocess (cached) -> smoke test on CPU -> budget gate -> launch and watch -> report."""

from __future__ import annotations

import datetime as dt
from prefect import flow, get_run_logger

from flows.hooks import announce_projection, post_final_cost
from tasks.budget import budget_gate
from tasks.launch import launch_and_watch
from tasks.preprocess import preprocess
from tasks.report import report
from tasks.smoke import smoke
from thrifty.config import RunConfig
from thrifty.budget import spend_usd
from thrifty.preflight import check_before_spending
from thrifty.results import PipelineResult
from thrifty.runs import finished_summary, read_attempts
from thrifty.storage import open_store


def scheduled_date() -> dt.date:
    """The date this flow run was scheduled for (UTC); hooks resolve '{date}' from the same field."""
    from prefect.runtime import flow_run

    when = flow_run.scheduled_start_time
    return when.date() if when else dt.datetime.now(dt.timezone.utc).date()


@flow(name="thrifty-train", flow_run_name="{config.run_name}", log_prints=True,
      on_running=[announce_projection], on_completion=[post_final_cost], on_failure=[post_final_cost],
      on_crashed=[post_final_cost], on_cancellation=[post_final_cost])
def train_pipeline(config: RunConfig = RunConfig(), poll_s: float = 1.0) -> PipelineResult:
    """Train one run the cheap way. `config` is the RunConfig: the Prefect UI draws its form from it."""
    logger = get_run_logger()
    config = config.resolved(scheduled_date())  # 'nightly-{date}' -> a new run each night, validated again
    check_before_spending(config)
    prep_state = preprocess(config, return_state=True)
    prep = prep_state.result()
    if prep_state.name == "Cached":
        prep = prep.model_copy(update={"hit": True})  # Prefect's own cache: the shards were there
    logger.info("preprocessing cache %s: %s", "hit" if prep.hit else "miss", prep.key)

    store = open_store(config.store)
    done = finished_summary(store, config.run_name, config.training_fingerprint())
    if done is not None:  # relaunching would rent a machine only to load the last checkpoint and exit
        logger.info("run %s already finished training with this config (%s at step %s); nothing is launched. "
                    "Change a train setting to continue it, or pick a new run_name to train again.",
                    config.run_name, done.status, done.steps)
        return PipelineResult(run_name=config.run_name, cache_hit=prep.hit, already_finished=True, summary=done,
                              cost_usd=spend_usd(read_attempts(store, config.run_name)))

    smoke_result = smoke(config)  # raises before any launch if the recipe cannot train
    estimate = budget_gate(config, prep, smoke_result)  # raises if the plan exceeds the budget

    job = launch_and_watch(config, poll_s=poll_s)  # stops the job at the budget cap
    figures = report(config, prep, smoke_result, estimate, job)
    return PipelineResult(run_name=config.run_name, cache_hit=prep.hit, smoke=smoke_result, estimate=estimate,
                          job=job, summary=job.summary, cost_usd=figures.actual_usd,
                          on_demand_usd=figures.on_demand_usd, savings=figures)
