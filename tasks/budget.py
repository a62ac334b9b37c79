"""The pre-launch budget gate: price what the watch loop will enforce, and refuse a plan the budget cannot carry."""

from __future__ import annotations

import time

from prefect import get_run_logger, task
from prefect.states import Failed

from tasks.errors import fails_quietly
from thrifty.runs import checkpoints
from thrifty.money.budget import spend_usd, stop_reserve_s, world_size
from thrifty.config import ConfigError, RunConfig
from thrifty.numbers import money
from thrifty.report import ends
from thrifty.money.estimate import AUTO_FIRST_CHECKPOINT_STEPS, Estimate, estimate_run, gate, smallest_budget_usd
from thrifty.money.history import LOCAL, job_history
from thrifty.money.ledger import read_attempts, read_meters
from thrifty.money.prices import LivePrices, emulated_quote
from thrifty.results import PrepResult, SmokeResult
from thrifty.usercode.script import is_script, script_total_steps
from thrifty.storage import open_store
from thrifty.money.throughput import measured_speeds, speed_key, speeds_for
from thrifty.spot.deadline_run import deadline_moves, market_config


SCRIPT_EVAL_ASSUMED = 0.25  # a script's evaluation and checkpoints, per step, until a run of it is measured: assumed


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
    examples_per_step = config.train.examples_per_step(world)
    if is_script(config):  # the script's own batch when it said it (sess.describe), else one step is the unit
        examples_per_step = smoke.examples_per_step or examples_per_step
    per_example_s = smoke.cpu_step_time_s / (smoke.examples_per_step or examples_per_step)
    history = job_history(store, speed_key(config))  # earlier jobs of this model: what a step cost them all in
    overhead_s, overhead_note = cpu_overhead_per_step(config, prep, smoke, world)
    if c.launcher == "local":
        live = LivePrices.for_config(config, store)  # the table unless budget.prices is live
        quote, accelerator, speeds, why = emulated_quote(c.emulate, c.use_spot, live), None, None, ""
    else:
        from thrifty.launchers.skypilot import candidates, ranked_candidates

        names = [k.accelerator for k in candidates(config)[0]]
        speeds = speeds_for(names, measured_speeds(store, speed_key(config)), 1.0 / per_example_s) if names else None
        ranking = ranked_candidates(config, speeds=speeds, examples=(total - done) * examples_per_step)
        winner = ranking.winner.candidate
        if deadline_moves(config):  # the deadline policy may move the run to on-demand: one must make it in time
            on_demand_can_finish(config, speeds, (total - done) * examples_per_step)
        quote, accelerator, why = winner.quote, winner.accelerator, ranking.why()
    where = LOCAL if accelerator is None else accelerator.partition(":")[0]
    estimate = estimate_run(total - done, per_example_s, examples_per_step, quote.usd_per_hour, c.num_nodes,
                            accelerator, c.launcher, quote.source, total_steps=total, speeds=speeds, choice=why,
                            history=history.get(where), cpu_overhead_s_per_step=overhead_s,
                            overhead_note=overhead_note,
                            compiled=config.train.compile == "on" and not is_script(config))
    if c.launcher == "local" and c.deadline_h is not None and estimate.hours > c.deadline_h:  # this CPU or nothing
        raise ConfigError(f"'compute.deadline_h': the run needs ~{estimate.hours:.2f} h on this machine "
                          f"({estimate.assumption}), over compute.deadline_h {c.deadline_h:g} h. Raise compute.deadline_h, "
                          "train fewer steps (train.max_epochs / train.max_steps), or use compute.launcher=skypilot "
                          "with a faster accelerator; nothing was launched.")
    return estimate


def cpu_overhead_per_step(config: RunConfig, prep: PrepResult, smoke: SmokeResult, world: int) -> tuple[float, str]:
    """Seconds per step, on the smoke test's CPU, of what a job does besides its steps: each evaluation (measured by
    the smoke test, every epoch or ``train.eval_every`` steps) and each checkpoint (its save, measured: the
    cadence's and one per evaluation that is a new best, at most). A script's own evaluation is not seen by the
    smoke test: assumed, and said so."""
    tc = config.train
    step_s = smoke.cpu_step_time_s
    if is_script(config) or not prep.examples:
        return SCRIPT_EVAL_ASSUMED * step_s, (f"the script's evaluation is not seen by the smoke test: assumed "
                                              f"+{SCRIPT_EVAL_ASSUMED:.0%} a step until a run of it is measured")
    per_epoch = tc.steps_per_epoch(prep.examples["train"], world)
    evals_per_step = 1.0 / (tc.eval_every or per_epoch)
    saves_per_step = evals_per_step + (1.0 / tc.checkpoint_every if tc.checkpoint_every != "auto"
                                       else 1.0 / max(per_epoch, AUTO_FIRST_CHECKPOINT_STEPS))
    per_step = evals_per_step * smoke.cpu_eval_s + saves_per_step * smoke.cpu_save_s
    return per_step, (f"evaluation ({smoke.cpu_eval_s:.3g} s each on CPU) every {tc.eval_every or per_epoch} steps and "
                      f"checkpoints ({smoke.cpu_save_s:.3g} s each) measured by the smoke test")


@task(name="budget-gate", retries=0)
@fails_quietly
def budget_gate(config: RunConfig, prep: PrepResult, smoke: SmokeResult, poll_s: float = 1.0) -> Estimate:
    """Estimate on the candidate where the run costs least (measured or smoke-test speeds, the price table); refuse (OverBudgetPlan) what the budget,
    less what the run already spent and the reserve the cap holds back, cannot carry."""
    estimate = estimate_for(config, prep, smoke)
    store = open_store(config.store)
    spent = spend_usd(read_attempts(store, config.run_name))
    reserve = stop_reserve_s(config, poll_s)
    logger = get_run_logger()
    if estimate.choice:
        logger.info("hardware by the run's cost: %s", estimate.choice)
    logger.info("estimate %s; %g s of burn held back to stop in (%s); %s spent by earlier jobs of this run",
                estimate.summary(), reserve, money(reserve / 3600.0 * estimate.usd_per_hour), money(spent))
    b = config.budget
    if any(not m.gone(time.time()) for m in read_meters(store, config.run_name)):
        logger.info("a job of run %s is still alive: the launch step re-attaches to it or says so; nothing new is "
                    "priced", config.run_name)
        return estimate
    smallest, why = smallest_budget_usd(estimate, reserve, config.train.checkpoint_every, spent)
    if spent > 0 and b.max_usd < smallest:  # what the run spent took its budget (a Retry of a run its cap stopped)
        saved = checkpoints.committed(store, config.run_name)
        return Failed(name=ends.STATE["budget"], message=ends.sentence(  # type: ignore[return-value]
            "budget", config.run_name, spent, b.max_usd, f"what is left cannot buy a checkpoint more (it needs "
            f"${smallest:.5f}: {why}); nothing was launched", saved[-1].step if saved else None))
    gate(estimate, b.max_usd, b.allow_over_budget, reserve, config.train.checkpoint_every, spent)
    worst = on_demand_usd(config, estimate) if deadline_moves(config) else None
    if worst is not None and spent + worst > b.max_usd:
        logger.warning("deadline: should the policy move the whole run to on-demand, it costs ~%s more, over "
                       "budget.max_usd $%g with what was spent: the cap would stop it before its deadline", money(worst),
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
        on_demand = emulated_quote(c.emulate, False, LivePrices.for_config(config, open_store(config.store)))
        return estimate.hours * on_demand.usd_per_hour * c.num_nodes
    return on_demand_can_finish(config, estimate.speeds, estimate.steps * config.train.examples_per_step(world_size(config)))
