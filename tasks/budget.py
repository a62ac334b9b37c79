"""The pre-launch budget gate: estimate the run's cost and refuse to launch past the budget."""

from __future__ import annotations

from prefect import get_run_logger, task

from thrifty.budget import Estimate, estimate_run, gate, world_size
from thrifty.config import RunConfig
from thrifty.pricing import quote_emulated
from thrifty.results import PrepResult, SmokeResult


@task(name="budget-gate", retries=0)
def budget_gate(config: RunConfig, prep: PrepResult, smoke: SmokeResult) -> Estimate:
    """Estimate from the smoke test's measured speed and the price table; raise OverBudgetPlan if over budget."""
    c = config.compute
    if c.launcher == "local":
        quote, accelerator = quote_emulated(c.emulate, c.use_spot), None
    else:  # the cheapest candidate SkyPilot may pick
        from thrifty.launchers.skypilot import candidates

        cheapest = candidates(config)[0][0]
        quote, accelerator = cheapest.quote, cheapest.accelerator
    world = world_size(config)
    steps = config.train.total_steps(prep.examples["train"], world)
    per_example_s = smoke.cpu_step_time_s / smoke.examples_per_step
    estimate = estimate_run(steps, per_example_s, config.train.examples_per_step(world), quote.usd_per_hour,
                            c.num_nodes, accelerator, c.launcher, quote.source)
    logger = get_run_logger()
    logger.info("estimated cost $%.5f for %d steps (%.4f h at $%.3f/h): %s", estimate.usd, steps, estimate.hours,
                estimate.usd_per_hour, estimate.assumption)
    gate(estimate, config.budget)
    return estimate
