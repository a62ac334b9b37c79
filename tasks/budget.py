"""The pre-launch budget gate: estimate the run's cost and refuse to launch past the budget."""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

from prefect import get_run_logger, task

from thrifty.budget import estimate_run, gate, gpus_per_node
from thrifty.config import RunConfig
from thrifty.pricing import quote_emulated


def planned_steps(config: RunConfig, train_examples: int) -> int:
    """Optimizer steps the run will take if it never stops early (same rule as the training loop)."""
    world = config.compute.num_nodes * (1 if config.compute.launcher == "local" else gpus_per_node(config))
    per_epoch = train_examples // (config.train.micro_batch * config.train.grad_accum_steps * world)
    total = config.train.max_epochs * per_epoch
    return min(total, config.train.max_steps) if config.train.max_steps else total


@task(name="budget-gate", retries=0)
def budget_gate(config: RunConfig, prep: dict[str, Any], smoke: dict[str, Any]) -> dict[str, Any]:
    """Estimate from the smoke test's measured speed and the price table; raise OverBudgetPlan if over budget."""
    c = config.compute
    if c.launcher == "local":
        quote, accelerator, gpus = quote_emulated(c.emulate, c.use_spot), None, 1
    else:  # the cheapest candidate SkyPilot may pick
        from thrifty.launchers.skypilot import candidates

        cheapest = candidates(config)[0][0]
        quote, accelerator, gpus = cheapest.quote, cheapest.accelerator, gpus_per_node(config)
    steps = planned_steps(config, prep["examples"]["train"])
    per_example_s = smoke["cpu_step_time_s"] / smoke["examples_per_step"]
    world_batch = config.train.micro_batch * config.train.grad_accum_steps * c.num_nodes * gpus
    estimate = estimate_run(steps, per_example_s, world_batch, quote.usd_per_hour, c.num_nodes, accelerator,
                            c.launcher)
    logger = get_run_logger()
    logger.info("estimated cost $%.5f for %d steps (%.4f h at $%.3f/h): %s", estimate.usd, steps, estimate.hours,
                estimate.usd_per_hour, estimate.assumption)
    gate(estimate, config.budget)
    return {**asdict(estimate), "price_source": quote.source}
