"""The pre-launch budget gate: price what the watch loop will enforce, and refuse a plan the budget cannot carry."""

from __future__ import annotations

from prefect import get_run_logger, task

from tasks.errors import fails_quietly
from thrifty import checkpoints
from thrifty.budget import spend_usd, stop_reserve_s, world_size
from thrifty.config import RunConfig
from thrifty.estimate import Estimate, estimate_run, gate
from thrifty.ledger import read_attempts
from thrifty.pricing import quote_emulated
from thrifty.results import PrepResult, SmokeResult
from thrifty.script import is_script, script_total_steps
from thrifty.storage import open_store


def estimate_for(config: RunConfig, prep: PrepResult, smoke: SmokeResult) -> Estimate:
    """What is left of the run (from its newest checkpoint) at the smoke test's measured speed and the price table."""
    c = config.compute
    if c.launcher == "local":
        quote, accelerator = quote_emulated(c.emulate, c.use_spot), None
    else:  # the cheapest candidate SkyPilot may pick
        from thrifty.launchers.skypilot import candidates

        cheapest = candidates(config)[0][0]
        quote, accelerator = cheapest.quote, cheapest.accelerator
    world = world_size(config)
    if is_script(config):  # the script's own data: its length as it reported it, or as the config says
        total = script_total_steps(config, smoke.total_steps)
    else:
        total = config.train.total_steps(prep.examples["train"], world)
    saved = checkpoints.committed(open_store(config.store), config.run_name)
    done = min(total, saved[-1].step) if saved else 0
    per_example_s = smoke.cpu_step_time_s / smoke.examples_per_step
    return estimate_run(total - done, per_example_s, config.train.examples_per_step(world), quote.usd_per_hour,
                        c.num_nodes, accelerator, c.launcher, quote.source, total_steps=total)


@task(name="budget-gate", retries=0)
@fails_quietly
def budget_gate(config: RunConfig, prep: PrepResult, smoke: SmokeResult, poll_s: float = 1.0) -> Estimate:
    """Estimate from the smoke test's measured speed and the price table; refuse (OverBudgetPlan) what the budget,
    less what the run already spent and the reserve the cap holds back, cannot carry."""
    estimate = estimate_for(config, prep, smoke)
    spent = spend_usd(read_attempts(open_store(config.store), config.run_name))
    reserve = stop_reserve_s(config, poll_s)
    logger = get_run_logger()
    logger.info("estimated cost $%.5f for %d steps (%.4f h at $%.3f/h): %s; %g s of burn held back to stop in; "
                "$%.5f spent by earlier jobs of this run", estimate.usd, estimate.steps, estimate.hours,
                estimate.usd_per_hour, estimate.assumption, reserve, spent)
    b = config.budget
    gate(estimate, b.max_usd, b.allow_over_budget, reserve, config.train.checkpoint_every, spent)
    return estimate
