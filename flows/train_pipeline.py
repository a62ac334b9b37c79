"""The main job: preprocess (cached) -> smoke test on CPU -> launch on (emulated) spot and watch -> report."""

from __future__ import annotations

from typing import Any

from prefect import flow, get_run_logger

from tasks.launch import launch_and_watch
from tasks.preprocess import preprocess
from tasks.report import report
from tasks.smoke import smoke
from thrifty.config import RunConfig
from thrifty.preflight import check_before_spending


@flow(name="thrifty-train", flow_run_name="{config.run_name}", log_prints=True)
def train_pipeline(config: RunConfig = RunConfig(), poll_s: float = 1.0) -> dict[str, Any]:
    """Train one run the cheap way. `config` is the RunConfig: the Prefect UI draws its form from it."""
    logger = get_run_logger()
    check_before_spending(config)

    prep_state = preprocess(config, return_state=True)
    prep = prep_state.result()
    prep["hit"] = prep["hit"] or prep_state.name == "Cached"
    logger.info("preprocessing cache %s: %s", "hit" if prep["hit"] else "miss", prep["key"])

    smoke_result = smoke(config)  # raises before any launch if the recipe cannot train

    job = launch_and_watch(config, poll_s=poll_s)
    figures = report(config.run_name, prep, smoke_result, job)
    return {"cache_hit": prep["hit"], "smoke": smoke_result, "job": job, "cost_usd": figures["cost_usd"],
            "on_demand_usd": figures["on_demand_usd"], "summary": job["summary"]}
