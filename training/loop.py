"""The training loop, readable top to bottom: data, model, resume, steps, eval, checkpoints, summary.

Imports no Prefect: this is what a GPU node runs. Resume is automatic (latest complete
checkpoint of the run) and bit-exact on CPU: data order is a pure function of (seed, epoch)
and everything else that moves lives in the checkpoint.
"""

from __future__ import annotations

import collections
import logging
import math
import statistics
import time
from dataclasses import asdict, dataclass, field

import torch

from thrifty.config import ConfigError, RunConfig
from thrifty.faults import armed as fault_armed, fault_point, min_step_s as min_step_s_env, pace
from thrifty.launchers.identity import identify
from thrifty.money.meter import NodeMeter
from thrifty.spot.preemption import config_mtbp, node_mtbp
from thrifty.runs import RunSummary, run_key, write_summary
from thrifty.storage import Store, open_store
from thrifty.money.throughput import model_key, speed_key
from training import batch_probe, export, memory, warm_start
from training.cap_watchdog import CapWatchdog, armed
from training.boundary import StepBoundary
from training.checkpoint import CheckpointManager
from training.ckpt_writer import CheckpointWriter, Written
from training.data import epoch_permutation, open_cache
from training.resume import one_trainer, restore
from training.speedups import Levers
from training.progress import CheckpointSchedule, MetricsWriter
from training.profiling import CostMap
from training.telemetry import Telemetry, summary_record
from training.steps import batch_rows, evaluate, optimizer_step
from training.early_stopping import EarlyStopping, best_metric, best_metric_at
from training.validate import check_arrays, check_config, check_data
from training.runtime import (
    Dist,
    StopSignal,
    pick_device,
    pick_precision,
    precision_name,
    rng_state,
    seed_everything,
    set_rng_state,
    weights_sha256,
)

log = logging.getLogger("thrifty.train")


MAX_NONFINITE_STEPS = 20  # with fp16's GradScaler, a few inf/nan steps are skipped by design; this many is divergence


class TrainingDiverged(ConfigError):
    """The loss is not finite: more steps would only burn money (exit 2: a setting to change, never a restart)."""


@dataclass
class LoopState:
    step: int = 0  # optimizer steps taken
    epoch: int = 0
    batch_in_epoch: int = 0  # optimizer steps taken inside ``epoch``: the position to resume from
    resumes: int = 0
    checkpoints_written: int = 0
    train_time_s: float = 0.0  # wall time covered by the last checkpoint (work lost to a kill is not counted)
    data_wait_s: float = 0.0
    checkpoint_time_s: float = 0.0
    compile_time_s: float = 0.0  # torch.compile's time over every attempt (train.compile: each attempt compiles)
    last_eval: dict[str, float] = field(default_factory=dict)
    last_eval_step: int = -1  # the step ``last_eval`` measured: a checkpoint carries its metric only if equal


@dataclass
class TrainResult:
    status: str  # completed | stopped_early | interrupted | budget | rung (ended at train.stop_at_epoch)
    summary: RunSummary | None
    step: int


def train(cfg: RunConfig) -> TrainResult:
    """Run (or resume) training for ``cfg`` until it completes, stops early, or is told to stop."""
    cfg.require_resolved()  # the flow (or `thrifty train`) resolved '{date}' and priced this name
    dist = Dist.from_env()
    check_config(cfg)  # the same checks the flow ran before renting this machine
    store = open_store(cfg.store, retry_s=cfg.store_retry_s)  # a store's brief outage is waited out, not fatal
    with one_trainer(store, cfg.run_name, dist), armed():
        return _train(cfg, dist, store)


def _train(cfg: RunConfig, dist: Dist, store: Store) -> TrainResult:
    run_id = cfg.run_name
    tc = cfg.train
    recipe, params = check_config(cfg)
    device = pick_device(tc.device, dist)
    amp = pick_precision(tc.precision, device)
    levers = Levers(cfg, device, precision_name(amp))  # TF32 decided and set now; compile wraps the model below
    dist.init(device)
    if dist.is_main:
        swept = store.sweep(run_key(run_id))  # what killed writers of this run left: temp files, empty directories
        if swept:
            log.info("removed %d file(s) a killed writer of run %r left behind", swept, run_id)
    # the cap, enforced here too: a job whose flow died (a killed `thrifty run`, a closed laptop) still stops
    meter = NodeMeter.from_env(store, cfg, identify=identify) if dist.is_main else None
    if meter is not None:
        log.info("budget: this job bills $%.4f/h (%s); the run has spent $%.4f of its $%g cap", meter.rate,
                 meter.price_note, meter.spend_usd(), cfg.budget.max_usd)
        CapWatchdog(meter).start()  # ends the job at the cap even while a step cannot end (a hung store call)
    if dist.any(meter is not None and meter.over_cap(save_s=0.0, step_s=0.0)):
        if meter is not None:
            meter.close("budget")
        log.warning("budget: run %r has spent $%.4f of its $%g cap before training: nothing more is trained. Run it "
                    "again with a larger budget.max_usd to continue", run_id, meter.spend_usd() if meter else 0.0,
                    cfg.budget.max_usd)
        dist.close()
        return TrainResult("budget", None, 0)

    # ---- data: the preprocessing cache (rank 0 fills it, the others read it), every shard checked
    def fits(sizes: dict[str, int]) -> None:
        check_data(cfg, sizes, dist.world)

    if dist.is_main:
        cache, splits = open_cache(store, recipe, params, fits, dedup=cfg.data)
    dist.barrier()
    if not dist.is_main:
        cache, splits = open_cache(store, recipe, params, fits, dedup=cfg.data)
    check_arrays(recipe, cache.manifest)
    train_split = splits["train"]
    global_batch = tc.examples_per_step(dist.world)
    steps_per_epoch = tc.steps_per_epoch(train_split.n, dist.world)
    total_steps = tc.total_steps(train_split.n, dist.world)
    stop_steps = tc.job_steps(train_split.n, dist.world)  # < total_steps: a search's rung ends this job there

    # ---- model, optimizer, schedule, scaler, early stopping
    seed_everything(tc.seed)
    model = recipe.make_model(params, cache.manifest["meta"]).to(device)
    recomputed = memory.apply(model, recipe, tc)  # train.activation_checkpointing: less memory for more compute
    # an exponential moving average of the weights, updated after every optimizer step; evaluated instead of them
    ema = (torch.optim.swa_utils.AveragedModel(model, multi_avg_fn=torch.optim.swa_utils.get_ema_multi_avg_fn(
        tc.ema_decay), use_buffers=True) if tc.ema_decay is not None else None)
    optimizer = recipe.make_optimizer(model, tc)
    scheduler = recipe.make_scheduler(optimizer, tc, total_steps)
    scaler = torch.amp.GradScaler(device.type, enabled=amp == torch.float16)
    es_cfg = tc.early_stopping
    stopper = EarlyStopping(es_cfg.mode, es_cfg.patience, es_cfg.min_delta, es_cfg.enabled)
    state = LoopState()
    ckpts = CheckpointManager(store, run_id, tc.keep_last, es_cfg.mode)

    # ---- autoresume: the newest complete checkpoint, no flag
    seed_everything(tc.seed + 1 + dist.rank)  # per-rank dropout streams, independent of model init
    loaded = ckpts.load_latest()
    if loaded is not None:
        info, saved = loaded
        restore(cfg, info.step, saved, model, optimizer, scheduler, scaler, stopper, ema)
        ckpts.best_step = stopper.best_step
        state = LoopState(**saved["loop"])
        state.resumes += 1
        rngs = saved["rng"]
        set_rng_state(rngs[dist.rank] if dist.rank < len(rngs) else rngs[0])
        log.info("resumed run %r from step %d (epoch %d, batch %d of %d)", run_id, state.step, state.epoch,
                 state.batch_in_epoch, steps_per_epoch)
    elif tc.init_from:  # a warm start: another run's weights, only while this run has no checkpoint of its own
        warm_start.apply(store, cfg, model, ema, record=dist.is_main)
    # the micro-batch: the config's, or (auto) the largest that fits this device, kept while the device stays the same
    choice = batch_probe.resolve(tc, model, recipe, train_split, device, amp,
                                 saved.get("micro_batch") if loaded is not None else None, dist)
    micro_batch, accum = choice.micro_batch, choice.grad_accum_steps
    ddp_model = model
    if dist.enabled:
        ddp_model = torch.nn.parallel.DistributedDataParallel(
            model, device_ids=[device.index] if device.type == "cuda" else None)
    # the steps run the compiled module (train.compile); ``model`` stays the uncompiled one: checkpoints, EMA and
    # evaluation use it (an eval graph would be a second compilation for a small part of the run's time)
    step_model = levers.wrap(ddp_model)

    metrics = MetricsWriter(store, run_id) if dist.is_main else None
    emit = metrics.write if metrics else (lambda record: None)
    # auto plans from the instance's preemption data: the store's ledgers, the shipped traces, else the config
    mtbp = node_mtbp(store, cfg, meter.price if meter else None) if dist.is_main else config_mtbp(cfg)
    schedule = CheckpointSchedule(tc.checkpoint_every, mtbp.mtbp_s, state.step, mtbp.source)
    stop = StopSignal().install()
    boundary = StepBoundary.from_env()  # the local launcher's preemption, at exactly its step
    emit({"event": "start", "step": state.step, "total_steps": total_steps, "resumes": state.resumes,
          **({"stop_step": stop_steps} if stop_steps < total_steps else {}),  # this job ends there (a search's rung)
          "precision": precision_name(amp), "device": str(device), "world_size": dist.world,
          "compile": levers.compile, "tf32": levers.tf32,
          "cache_key": cache.key, "cache_hit": cache.hit, "recomputed_blocks": recomputed,
          "micro_batch": micro_batch, "grad_accum_steps": accum,
          # what lets `thrifty plan` and the budget gate reuse this attempt's speed (thrifty.money.throughput)
          "speed_key": speed_key(cfg), "model_key": model_key(cfg), "train_examples": train_split.n}
         | ({"mtbp_s": round(mtbp.mtbp_s, 1), "mtbp_source": mtbp.source, "mtbp_detail": mtbp.detail}
            if schedule.auto else {}))
    if schedule.auto and dist.is_main:
        log.info("auto checkpoint interval: mean time between preemptions %s", mtbp.describe())
    log.info("training %s: %d steps (%d per epoch), %s on %s, cache %s; %s", recipe.name, total_steps,
             steps_per_epoch, precision_name(amp), device, "hit" if cache.hit else "miss", memory.describe(recomputed, tc))

    # utilisation sampled off the step path; the cost map (train.profile_steps) is None when off: no profiler at all
    telemetry = Telemetry(tc.utilisation_every_s if dist.is_main else None,
                          checkpoint_total_s=state.checkpoint_time_s).start()
    cost_map = CostMap.maybe(tc.profile_steps if dist.is_main else 0, store, run_id, total_steps,
                             meter.rate if meter else None, device)

    # checkpoints are written by one background thread (train.async_checkpoint); the metrics go up after each COMMIT
    writer = CheckpointWriter(ckpts, tc.async_checkpoint, metrics.put if metrics and metrics.upload else None)

    finished: list[Written] = []  # writes reported since the last save: the auto interval re-plans from them there

    def report(written: list[Written]) -> None:
        """The checkpoint events of finished writes (rank 0)."""
        for w in written:
            state.checkpoint_time_s += w.block_s
            emit(w.event())
        finished.extend(written)

    def replan() -> None:
        """Re-plan auto from the writes finished since the last save (rank 0, just before the broadcast: every rank
        changes its interval at the same step)."""
        for w in finished:
            plan = schedule.saved(w.step, w.block_s, statistics.median(recent_step_s) if recent_step_s else 0.0,
                                  write_s=w.write_s)
            if plan:
                emit(plan)
                log.info("auto checkpoint interval: every %d steps (~%.1f s; save %.3f s, mean time between "
                         "preemptions %.0f s from %s)", plan["steps"], plan["seconds"], plan["save_s"], plan["mtbp_s"],
                         plan["mtbp_source"])
        finished.clear()

    def save(final: bool = False, cadence: bool = True) -> None:
        """Snapshot now, write in the background; ``final`` (the end, a stop) waits for the COMMIT. ``cadence=False``
        (a new best's save) leaves the interval counting from the last scheduled save."""
        rngs = dist.gather(rng_state())  # every rank's RNG streams, so each resumes its own
        if dist.is_main:
            checkpoint = {
                "model": model.state_dict(), "optimizer": optimizer.state_dict(), "scheduler": scheduler.state_dict(),
                "ema": ema.state_dict() if ema is not None else None,
                "scaler": scaler.state_dict(), "early_stopping": stopper.state_dict(), "rng": rngs,
                "loop": asdict(LoopState(**{**asdict(state), "checkpoints_written": state.checkpoints_written + 1,
                                            "train_time_s": base_train_time + (time.perf_counter() - attempt_t0)})),
                "config": cfg.model_dump_json(), "data_key": cache.key, "world_size": dist.world,
                "micro_batch": choice.record(),  # micro_batch auto: a resume on the same device reuses it
            }
            # the COMMIT carries the metric only where these weights scored a new best: retention keeps that one
            report(writer.save(checkpoint, state.step, best_metric_at(stopper, state.step), wait=final))
            state.checkpoints_written += 1
            if cadence:
                replan()
        if cadence:
            schedule.follow(state.step, dist.broadcast(schedule.interval))  # all ranks keep rank 0's plan

    # ---- the loop
    attempt_t0 = time.perf_counter()
    base_train_time = state.train_time_s
    recent_step_s: collections.deque[float] = collections.deque(maxlen=21)  # median guides auto checkpointing
    win_loss, win_n, win_wait, win_time = 0.0, 0, 0.0, 0.0  # this metric line's window
    perm, perm_epoch = None, -1
    interrupted: str | None = None  # "signal" | "budget"
    diverged = 0  # consecutive steps with a loss that is not finite
    last_saved_step = state.step if loaded else -1
    min_step_s, step_fault = min_step_s_env(), fault_armed("step")  # tests' pace and kill point, read once a run
    wait = 0.0

    def fetch(micro: int) -> dict[str, torch.Tensor]:
        nonlocal wait
        tw = time.perf_counter()
        start = state.batch_in_epoch * global_batch + (micro * dist.world + dist.rank) * micro_batch
        batch = train_split.batch(batch_rows(perm, start, micro_batch), device)
        wait += time.perf_counter() - tw
        return recipe.apply_transform(batch, tc.seed, state.epoch, state.batch_in_epoch, micro, dist.rank)

    if dist.any(stop.signum is not None):  # a notice during start-up: nothing trained yet, nothing new to save
        interrupted = "signal"
    while interrupted is None and state.step < stop_steps and not stopper.stopped:
        if state.batch_in_epoch >= steps_per_epoch:
            state.epoch, state.batch_in_epoch = state.epoch + 1, 0
        if perm_epoch != state.epoch:
            perm, perm_epoch = epoch_permutation(train_split.n, tc.seed, state.epoch), state.epoch
        t0 = time.perf_counter()
        wait = 0.0
        if cost_map:
            cost_map.begin(state.epoch)
        loss = optimizer_step(step_model, recipe, fetch, accum, optimizer, scaler, device, amp,
                              tc.grad_clip, ddp=dist.enabled)
        diverged = diverged + 1 if not math.isfinite(loss) else 0
        if diverged and (not scaler.is_enabled() or diverged >= MAX_NONFINITE_STEPS):  # fp16 skips a few by design
            raise TrainingDiverged(
                f"the training loss became {loss} at step {state.step + 1}{' and stayed so' if diverged > 1 else ''}: "
                f"the run diverged. Lower train.lr (now {tc.lr:g}), set train.grad_clip, or check the data; the last "
                "checkpoint (before it) is kept.")
        scheduler.step()
        if ema is not None:
            ema.update_parameters(model)
        state.step += 1
        state.batch_in_epoch += 1
        if min_step_s:
            pace(t0, min_step_s)
        step_time = time.perf_counter() - t0
        if cost_map:
            cost_map.end()
        state.data_wait_s += wait
        recent_step_s.append(step_time)
        state.compile_time_s += levers.stepped(state.step, step_time, emit)
        if step_fault:
            fault_point("step")

        win_loss += loss
        win_n += 1
        win_wait += wait
        win_time += step_time
        if state.step % tc.log_every == 0 or state.step == total_steps:
            emit({"step": state.step, "epoch": state.epoch, "loss": round(win_loss / win_n, 6),
                  "lr": scheduler.get_last_lr()[0],
                  "samples_per_s": round(global_batch * win_n / max(win_time, 1e-9), 1),
                  "step_time_s": round(win_time / win_n, 5),
                  "data_wait_s": round(win_wait / win_n, 6),
                  **telemetry.window(win_n, win_time, win_wait, state.checkpoint_time_s)})
            win_loss, win_n, win_wait, win_time = 0.0, 0, 0.0, 0.0

        end_of_epoch = state.batch_in_epoch == steps_per_epoch
        new_best = False
        if (tc.eval_every and state.step % tc.eval_every == 0) or (tc.eval_every is None and end_of_epoch) \
                or state.step in (total_steps, stop_steps):  # a rung's end is measured: the search ranks it
            state.last_eval = evaluate(ema.module if ema is not None else model, recipe, splits, device, amp,
                                       tc.step_batch())
            state.last_eval_step = state.step
            best = stopper.update(state.last_eval[es_cfg.metric], state.step)
            new_best = dist.any(best)  # every rank saves the same steps
            ckpts.best_step = stopper.best_step
            emit({"event": "eval", "step": state.step, "epoch": state.epoch, **state.last_eval, "best": best})
            log.info("step %d epoch %d: %s%s", state.step, state.epoch,
                     " ".join(f"{k}={v:.4f}" for k, v in state.last_eval.items()), " (best)" if best else "")

        finishing = stopper.stopped or state.step >= stop_steps
        if (schedule.due(state.step) and not writer.waiting_on_store) or finishing:  # a retrying write: train on
            save(final=finishing)
            last_saved_step = state.step
        elif new_best:  # the weights that scored the best metric are saved now, kept until a better one
            save(cadence=False)
            last_saved_step = state.step
        elif writer.in_flight:
            report(writer.poll(state.step))
        at_cap = False
        if meter is not None and not finishing:
            meter.beat()
            at_cap = meter.over_cap(max(schedule.save_s or 0.0, writer.stop_save_s), step_time)  # a stop's save waits
        boundary.passed(state.step, stop, metrics.sync if metrics else None)
        if dist.any(stop.signum is not None or at_cap):
            at_cap = dist.any(at_cap)  # rank 0 decides the cap; every rank stops at the same step
            if last_saved_step != state.step:
                save(final=True)
            interrupted = "budget" if at_cap else "signal"
            break

    state.compile_time_s += levers.finish(state.step, emit)  # a short job: measured from the steps it had
    report(writer.close())  # a stop right after a due save: that write lands before the run says "interrupted"
    telemetry.close()
    if cost_map:
        cost_map.close()
    wall = base_train_time + (time.perf_counter() - attempt_t0)
    if interrupted:
        emit({"event": "interrupted", "step": state.step, "reason": interrupted})
        if interrupted == "budget":
            log.warning("budget: run %r reached its $%g cap (spent $%.4f, holding back what a stop costs): "
                        "checkpoint saved at step %d. Run it again with a larger budget.max_usd to finish from there",
                        run_id, cfg.budget.max_usd, meter.spend_usd() if meter else 0.0, state.step)
        else:
            log.warning("stopped by signal at step %d after an emergency checkpoint; rerun to resume", state.step)
        if meter is not None:
            meter.close(interrupted)
        if metrics:
            metrics.close()
        dist.close()
        return TrainResult("budget" if interrupted == "budget" else "interrupted", None, state.step)

    if state.step < total_steps and not stopper.stopped:  # a rung's end: checkpointed and evaluated, not finished
        emit({"event": "rung", "step": state.step, "epoch": tc.stop_at_epoch, **state.last_eval})
        log.info("stopped at epoch %d (step %d of %d) as train.stop_at_epoch says; a job with a larger value "
                 "continues from this checkpoint on the same schedule", tc.stop_at_epoch, state.step, total_steps)
        if meter is not None:
            meter.close("finished")
        if metrics:
            metrics.close()
        dist.barrier()
        dist.close()
        return TrainResult("rung", None, state.step)

    summary = None
    if dist.is_main:
        summary = RunSummary(
            run_id=run_id,
            recipe=recipe.name,
            status="stopped_early" if stopper.stopped else "completed",
            steps=state.step,
            total_steps=total_steps,
            epochs=round(state.step / steps_per_epoch, 3),
            stopped_early=stopper.stopped,
            best_metric=best_metric(es_cfg.metric, stopper, ckpts.committed()),
            final_metrics=state.last_eval,
            wall_time_s=round(wall, 3),
            data_wait_fraction=round(state.data_wait_s / wall, 5) if wall else 0.0,
            checkpoint_time_fraction=round(state.checkpoint_time_s / wall, 5) if wall else 0.0,
            checkpoints_written=state.checkpoints_written,
            resumes=state.resumes,
            precision=precision_name(amp),
            speedups=levers.summary(optimizer, state.compile_time_s),
            device=device.type,
            world_size=dist.world,
            cache_key=cache.key,
            training_fingerprint=cfg.training_fingerprint(),
            tags=cfg.tags,
            weights_sha256=weights_sha256(model.state_dict()),
            init_from=warm_start.summary_record(store, cfg, state.step, stopper.best),
            half_export=export.at_end(store, run_id, ckpts.best(ckpts.committed()), tc, device),  # null: none
            utilisation=summary_record(telemetry, recipe.flops_per_example(params, cache.manifest["meta"])
                                       if recipe.flops_per_example else None, tc.examples_per_step(1), device,
                                       precision_name(amp)),
            **recipe.summary_fields(cache.manifest["meta"]),
        )
        write_summary(store, summary)
        if meter is not None:
            meter.close("finished")
        emit({"event": "end", "status": summary.status, "steps": summary.steps, "weights_sha256": summary.weights_sha256})
        metrics.close()
    dist.barrier()
    dist.close()
    return TrainResult(summary.status if summary else "completed", summary, state.step)
