"""The main job: preprocess (cached) -> smoke test on CPU -> budget gate -> launch and watch -> report.

Script mode (``recipe: script``) has no preprocessing step: the command reads its own data.

Every way a run can end is a state with a message and no traceback, and a report: Completed; Failed named
``BadInput`` (a setting to change, before anything was rented); Failed named ``StoppedAtCap``
(the budget ran out; the checkpoint kept); Failed (the job failed); Cancelled (from the UI or the API: the job
is stopped with a checkpoint first). The message is one sentence (``thrifty.report.ends``): the end, the spend,
what to do next.
"""

from __future__ import annotations

import time
from typing import Any

from prefect import flow, get_run_logger
from prefect.exceptions import TerminationSignal
from prefect.states import Cancelled, Completed, Failed, State

from flows.hooks import announce_projection, post_final_cost
from flows.run_names import say_where_it_starts, scheduled_date, tag_run, train_run_name, upcoming_named
from flows.slots import training_slot
from tasks.budget import budget_gate
from tasks.errors import BAD_INPUT, USER_ERRORS, bad_input
from tasks.launch import launch_and_watch
from tasks.preprocess import preprocess
from tasks.report import publish, report
from tasks.smoke import smoke
from thrifty.runs import checkpoints, lease
from thrifty.money.budget import spend_usd
from thrifty.config import RunConfig
from thrifty.report import ends
from thrifty.money.ledger import read_attempts
from thrifty.money.unwatched import settle
from thrifty.launchers.preflight import check_before_spending
from thrifty.results import PipelineResult, PrepResult, SmokeResult
from thrifty.runs import finished_summary
from thrifty.runs.lineage import resolve_previous
from thrifty.usercode.script import is_script
from thrifty.storage import open_store
from training.validate import check_config

STOPPED_AT_CAP = ends.STATE["budget"]  # the name of the Failed state a run stopped at its budget cap ends in


class StepFailed(Exception):
    """A step ended in a failed state; the flow ends in the same one."""

    def __init__(self, state: State):
        super().__init__(state.message)
        self.state = state


def outcome_of(state: State) -> Any:
    """A finished task's result, or StepFailed carrying its failed state (its message is already the whole story)."""
    if not state.is_completed():
        raise StepFailed(state)
    return state.result()


def step(task: Any, *args: Any, **kwargs: Any) -> Any:
    return outcome_of(task(*args, return_state=True, **kwargs))


# one flow, two entry points: the deployments' form (train_pipeline) and a search's trials (train_trial)
TRAIN_FLOW = dict(name="thrifty-train", flow_run_name=train_run_name, log_prints=True,
                  on_running=[announce_projection], on_completion=[post_final_cost], on_failure=[post_final_cost],
                  on_crashed=[post_final_cost], on_cancellation=[post_final_cost])


@flow(**TRAIN_FLOW)
def train_pipeline(config: RunConfig = RunConfig(), poll_s: float = 1.0) -> PipelineResult:
    """Train one run the cheap way: cached preprocessing, a CPU smoke test, the budget gate, a spot launch watched
    to its end, and the report.

    Args:
        config: The RunConfig: what to train, where to keep it, what to rent and what it may cost. Its run_name
            names the flow run (the form's top "Run Name" field is replaced by it when the run starts).
        poll_s: Seconds between looks at the job's status, spend and progress (s). Shorter stops closer to the
            budget cap; the gate keeps this much burn in reserve.
    """
    return _run(config, poll_s, None)


@flow(**TRAIN_FLOW)
def train_trial(config: RunConfig, poll_s: float, smoke_result: SmokeResult) -> PipelineResult:
    """One trial of a search (flows.sweep): the train pipeline, with the smoke test its model shape already passed
    (the search runs one per shape). Not deployed: a form must never let a person hand the budget gate a step
    time."""
    return _run(config, poll_s, smoke_result)


def _run(config: RunConfig, poll_s: float, smoke_result: SmokeResult | None) -> PipelineResult:
    """The pipeline, and every way it can end before its own report: each is reported (its spend, what to do
    next) and ends in a state whose message says it."""
    began = time.time()
    try:
        with upcoming_named(get_run_logger()):  # a scheduled deployment's next runs show the names they will run under
            return pipeline(config, poll_s, smoke_result)
    except StepFailed as failed:
        name = failed.state.name if failed.state.name in (BAD_INPUT, STOPPED_AT_CAP) else "Failed"
        kind, message = ends.KIND_OF_STATE[name], failed.state.message or ""
    except USER_ERRORS as exc:
        name, kind, message = BAD_INPUT, "bad_input", bad_input(exc).message or ""
    except TerminationSignal:  # cancelled (the UI, the API): the watch loop stopped the job, checkpoint first
        name, kind, message = "Cancelled", "cancelled", "it was cancelled from outside the run"
    message = report_end(config, kind, message, began)
    if name == "Cancelled":
        return Cancelled(message=message)  # type: ignore[return-value]
    return Failed(name=name, message=message)  # type: ignore[return-value]


def report_end(config: RunConfig, kind: str, detail: str, began_unix: float) -> str:
    """The report of an end the pipeline did not reach its own report for; returns the end's sentence. Never
    raises: a store it cannot read leaves the sentence without the spend. An end before this flow run rented
    anything (no attempt since ``began_unix``) writes nothing in the store: the run's figures stay its last job's."""
    try:
        config = config.resolved(scheduled_date())
    except ValueError:
        pass  # the config's own fault: said in ``detail``
    try:
        launched = any(a.started_unix >= began_unix - 1.0
                       for a in read_attempts(open_store(config.store), config.run_name))
        return publish(config, kind, detail, write=launched)[0]
    except Exception as exc:  # noqa: BLE001 - the end is said whatever the report could not write
        get_run_logger().warning("could not write the report of run %s (%s)", config.run_name, exc)
        return ends.sentence(kind, config.run_name, 0.0, config.budget.max_usd, detail, launched=False)


def pipeline(config: RunConfig, poll_s: float, smoke_result: SmokeResult | None = None) -> PipelineResult | State:
    logger = get_run_logger()
    template, config = config.run_name, config.resolved(scheduled_date())  # 'nightly-{date}' -> a new run each night
    earlier = tag_run(config.run_name, logger, config.tags)  # the UI's one-click filter; cost tags for a team's view
    check_before_spending(config)  # launcher, prices, credentials, the store: nothing written yet
    check_config(config)  # what the training program would reject, by the same code, before anything is rented
    store = open_store(config.store)
    config, said = resolve_previous(store, config, template)  # init_from: previous -> the schedule's last finished run
    if said:
        logger.info("warm start: %s", said)
    saved = checkpoints.committed(store, config.run_name)
    say_where_it_starts(config.run_name, earlier, saved[-1].step if saved else None, logger)
    held = lease.read(store, config.run_name)
    if held is not None and held.live(time.time()):  # said now, not after preprocessing and a smoke test
        raise lease.LeaseHeld(config.run_name, held, time.time())
    for settled in settle(store, config.run_name):  # a job that ended while its flow run was dead: said, row closed
        logger.warning(settled.describe())
    if is_script(config):  # the user's command reads its own data: no cache step
        prep = PrepResult.none("script mode: the command reads its own data")
        logger.info("preprocessing: none (%s)", prep.note)
    else:
        prep_state = preprocess(config, return_state=True)
        prep = outcome_of(prep_state)
        if prep_state.name == "Cached":
            prep = prep.model_copy(update={"hit": True})  # Prefect's own cache: the shards were there
        logger.info("preprocessing cache %s: %s", "hit" if prep.hit else "miss", prep.key)

    done = finished_summary(store, config.run_name, config.training_fingerprint())
    if done is not None:  # relaunching would rent a machine only to load the last checkpoint and exit
        logger.info("run %s already finished training with this config (%s at step %s); nothing is launched. "
                    "Change a train setting to continue it, or pick a new run_name to train again.",
                    config.run_name, done.status, done.steps)
        spent = spend_usd(read_attempts(store, config.run_name))
        return Completed(message=f"run {config.run_name} had already finished training with this config "
                         f"({done.status} at step {done.steps}, ${spent:.4g} spent): nothing was launched. Change a train "
                         "setting to continue it, or pick a new run_name to train again.",
                         data=PipelineResult(run_name=config.run_name, cache_hit=prep.hit, already_finished=True,
                                             summary=done, cost_usd=spent))  # type: ignore[return-value]

    if smoke_result is None:
        smoke_result = step(smoke, config)  # a failure ends the run before any launch
    else:
        logger.info("smoke test: passed already for this model shape (%d steps, %.4f s/step on CPU)",
                    smoke_result.steps, smoke_result.cpu_step_time_s)
    estimate = step(budget_gate, config, prep, smoke_result, poll_s)  # refuses what the budget cannot carry

    with training_slot(logger):  # at most --pool-concurrency training jobs at once, however many workers
        job = step(launch_and_watch, config, estimate, poll_s)  # stops the job at the budget cap
    figures = step(report, config, prep, smoke_result, estimate, job)  # every end is reported, its spend counted
    if job.end == "budget":
        return Failed(name=STOPPED_AT_CAP, message=figures.end)
    if job.end == "cancelled":
        return Cancelled(message=figures.end)
    if job.end != "succeeded":
        return Failed(message=figures.end)
    # the run page's one line (the flow run's state message): spent, saved, the best metric at its step, why it
    # ended, what next; the flow's caller still gets the PipelineResult
    return Completed(message=figures.end, data=PipelineResult(  # type: ignore[return-value]
        run_name=config.run_name, cache_hit=prep.hit, smoke=smoke_result, estimate=estimate, job=job,
        summary=job.summary, cost_usd=figures.actual_usd, on_demand_usd=figures.on_demand_usd, savings=figures))
