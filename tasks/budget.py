"""The pre-launch budget gate: price what the watch loop will enforce, and refuse a plan the budget cannot carry."""

from __future__ import annotations

from prefect import get_run_logger, task

from tasks.errors import fails_quietly
from thrifty.runs import checkpoints
from thrifty.money.budget import spend_usd, stop_reserve_s, world_size
from thrifty.config import ConfigError, RunConfig
from thrifty.money.estimate import Estimate, estimate_run, gate
from thrifty.money.ledger import read_attempts
from thrifty.money.pricing import quote_emulated
from thrifty.results import PrepResult, SmokeResult
from thrifty.usercode.script import is_script, script_total_steps
from thrifty.storage import open_store
from thrifty.money.throughput import measured_speeds, speed_key, speeds_for
from thrifty.spot.deadline_run import deadline_moves, market_config


def estimate_for(config: RunConfig, prep: PrepResult, smoke: SmokeResult) -> Estimate:
    """What is left of the run (from its newest checkpoint) on the candidate where it costs least, and why that one:
    every candidate's speed measured in the store's runs of this model, else scaled from the smoke test's CPU speed
    by the throughput table. ConfigError when ``compute.deadline_h`` leaves no candidate."""
    c = config.compute
    store = open_store(config.store)
    world = world_size(config)
    if is_script(config):  # the script's own data: its length as it reported it, or as the config says
        total = script_total_steps(config, smoke.total_steps)
    else:
        total = config.train.job_steps(prep.examples["train"], world)  # a search's rung ends at stop_at_epoch
    saved = checkpoints.committed(store, config.run_name)
    done = min(total, saved[-1].step) if saved else 0
    per_example_s = smoke.cpu_step_time_s / smoke.examples_per_step
    examples_per_step = config.train.examples_per_step(world)
    if c.launcher == "local":
        quote, accelerator, speeds, why = quote_emulated(c.emulate, c.use_spot), None, None, ""
    else:
        from thrifty.launchers.skypilot import candidates, ranked_candidates

        names = [k.accelerator for k in candidates(config)[0]]
        speeds = speeds_for(names, measured_speeds(store, speed_key(config)), 1.0 / per_example_s) if names else None
        ranking = ranked_candidates(config, speeds=speeds, examples=(total - done) * examples_per_step)
        winner = ranking.winner.candidate
        if deadline_moves(config):  # the deadline policy may move the run to on-demand: one must make it in time
            on_demand_can_finish(config, speeds, (total - done) * examples_per_step)
        quote, accelerator, why = winner.quote, winner.accelerator, ranking.why()
    estimate = estimate_run(total - done, per_example_s, examples_per_step, quote.usd_per_hour, c.num_nodes,
                            accelerator, c.launcher, quote.source, total_steps=total, speeds=speeds, choice=why)
    if c.launcher == "local" and c.deadline_h is not None and estimate.hours > c.deadline_h:  # this CPU or nothing
        raise ConfigError(f"'compute.deadline_h': the run needs ~{estimate.hours:.2f} h on this machine "
                          f"({estimate.assumption}), over compute.deadline_h {c.deadline_h:g} h. Raise compute.deadline_h, "
                          "train fewer steps (train.max_epochs / train.max_steps), or use compute.launcher=skypilot "
                          "with a faster accelerator; nothing was launched.")
    return estimate


@task(name="budget-gate", retries=0)
@fails_quietly
def budget_gate(config: RunConfig, prep: PrepResult, smoke: SmokeResult, poll_s: float = 1.0) -> Estimate:
    """Estimate on the candidate where the run costs least (measured or smoke-test speeds, the price table); refuse (OverBudgetPlan) what the budget,
    less what the run already spent and the reserve the cap holds back, cannot carry."""
    estimate = estimate_for(config, prep, smoke)
    spent = spend_usd(read_attempts(open_store(config.store), config.run_name))
    reserve = stop_reserve_s(config, poll_s)
    logger = get_run_logger()
    if estimate.choice:
        logger.info("hardware by the run's cost: %s", estimate.choice)
    logger.info("estimated cost $%.5f for %d steps (%.4f h at $%.3f/h): %s; %g s of burn held back to stop in; "
                "$%.5f spent by earlier jobs of this run", estimate.usd, estimate.steps, estimate.hours,
                estimate.usd_per_hour, estimate.assumption, reserve, spent)
    b = config.budget
    gate(estimate, b.max_usd, b.allow_over_budget, reserve, config.train.checkpoint_every, spent)
    worst = on_demand_usd(config, estimate) if deadline_moves(config) else None
    if worst is not None and spent + worst > b.max_usd:
        logger.warning("deadline: should the policy move the whole run to on-demand, it costs ~$%.4f more, over "
                       "budget.max_usd $%g with what was spent: the cap would stop it before its deadline", worst,
                       b.max_usd)
    return estimate


def on_demand_can_finish(config: RunConfig, speeds, examples: float) -> float | None:
    """ConfigError unless an on-demand candidate can finish what is left within ``compute.deadline_h``: the deadline
    policy's last resort (the spot candidates alone cannot promise a deadline). What the cheapest one costs (None
    without a runtime)."""
    from thrifty.launchers.skypilot import ranked_candidates

    try:
        return ranked_candidates(market_config(config, "on_demand"), speeds=speeds, examples=examples).winner.usd
    except ConfigError as exc:
        raise ConfigError(f"on-demand, the deadline policy's fallback: {exc}") from None


def on_demand_usd(config: RunConfig, estimate: Estimate) -> float | None:
    """What the rest of the run costs should the deadline policy move all of it to on-demand."""
    c = config.compute
    if c.launcher == "local":
        return estimate.hours * quote_emulated(c.emulate, False).usd_per_hour * c.num_nodes
    return on_demand_can_finish(config, estimate.speeds, estimate.steps * config.train.examples_per_step(world_size(config)))
