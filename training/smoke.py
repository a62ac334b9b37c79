"""Smoke test: the real recipe's model on the real shards, a few steps on CPU, before any GPU is rented.

Checks that the cached arrays fit one model (same arrays, dtypes and shapes in every split), that
a batch flows through the model in fp32 and under the configured precision's autocast (same loss
shape, finite), that an evaluation on every eval split produces every declared metric, that a few
optimizer steps run (with the recipe's optimizer, scheduler and transform), and that a checkpoint
saves and loads back to identical weights. Raises :class:`SmokeTestFailed` with the cause and,
for a recipe's exception, what the batch's dtypes suggest fixing.
"""

from __future__ import annotations

import math
import statistics
import tempfile
import time
import numpy as np
import torch

from thrifty.money.budget import world_size
from thrifty.config import ConfigError, RunConfig
from thrifty.usercode.script import is_script
from thrifty.results import SmokeResult
from thrifty.storage import FileStore, open_store
from training.checkpoint import CheckpointManager
from thrifty.runs.checkpoints import committed
from training import memory, warm_start
from training.data import open_cache
from training.steps import evaluate, optimizer_step
from training.runtime import autocast, pick_precision, precision_name, seed_everything, weights_sha256
from training.validate import SmokeTestFailed, check_arrays, check_config, check_data, dtype_hints


def smoke_test(cfg: RunConfig, steps: int = 5) -> SmokeResult:
    """Run ``steps`` optimizer steps of the real model on CPU and a checkpoint round trip; return what was measured.
    Script mode (``recipe: script``): the command, run twice with a small step limit (``training.script_smoke``)."""
    if is_script(cfg):
        from training.script_smoke import smoke_script

        return smoke_script(cfg)
    recipe, params = check_config(cfg)  # what the node would reject, by the node's own code
    store = open_store(cfg.store)
    world = world_size(cfg)  # the job's processes, not this CPU's: one step must fit the data on the node
    cache, splits = open_cache(store, recipe, params, lambda sizes: check_data(cfg, sizes, world), dedup=cfg.data)
    try:
        check_arrays(recipe, cache.manifest)
    except ConfigError as exc:
        raise SmokeTestFailed(str(exc)) from None
    split = splits["train"]
    device = torch.device("cpu")
    # the GPU's autocast path, exercised on CPU: auto means bf16 on any GPU that will be rented
    requested = "bf16" if cfg.train.precision == "auto" else cfg.train.precision
    amp = pick_precision(requested, device)
    tc = cfg.train
    n = min(split.n, tc.step_batch() if tc.micro_batch == "auto" else tc.micro_batch)  # auto: one micro-batch here
    stage = "building the model"
    batch = None
    try:
        seed_everything(tc.seed)
        model = recipe.make_model(params, cache.manifest["meta"]).to(device)
        stage = "finding the model's blocks for train.activation_checkpointing"
        memory.apply(model, recipe, tc)  # the node's steps, recomputed blocks and all: a recipe without blocks fails here
        stage = "building the model"
        batch = split.batch(np.arange(n), device)
        if tc.init_from and not committed(store, cfg.run_name):  # the warm start's shapes, before anything is rented
            stage = f"loading init_from {tc.init_from}"
            warm_start.load_into(store, cfg, model)

        stage = "a forward pass in fp32"
        with torch.no_grad():
            ref = recipe.run_step(model, batch, "train")
            stage = f"a forward pass under {precision_name(amp)} autocast"
            with autocast(device, amp):
                mixed = recipe.run_step(model, batch, "train")
        if ref.loss.shape != mixed.loss.shape or not (math.isfinite(float(ref.loss)) and math.isfinite(float(mixed.loss))):
            raise SmokeTestFailed(f"loss in fp32 ({float(ref.loss)}) and {precision_name(amp)} ({float(mixed.loss)}) "
                                  "must be finite scalars of the same shape")

        stage = "an evaluation of " + ", ".join(recipe.eval_splits)
        t_eval = time.perf_counter()
        evaluated = evaluate(model, recipe, splits, device, amp, n, max_batches=2)
        seen = sum(min(splits[name].n, 2 * n) for name in recipe.eval_splits)
        # what a whole evaluation takes (every eval split, at the loop's batch): priced into the estimate
        eval_s = (time.perf_counter() - t_eval) / max(seen, 1) * sum(splits[name].n for name in recipe.eval_splits)

        stage = "optimizer steps"
        optimizer = recipe.make_optimizer(model, tc)
        scheduler = recipe.make_scheduler(optimizer, tc, max(steps, 1))
        scaler = torch.amp.GradScaler("cpu", enabled=amp == torch.float16)
        per_micro = max(1, n // tc.grad_accum_steps)
        losses, step_times = [], []
        for s in range(steps):
            def fetch(i: int) -> dict[str, torch.Tensor]:
                batch = split.batch(np.arange(i * per_micro, (i + 1) * per_micro) % split.n, device)
                return recipe.apply_transform(batch, tc.seed, 0, s, i, 0)

            t0 = time.perf_counter()
            losses.append(optimizer_step(model, recipe, fetch, tc.grad_accum_steps, optimizer, scaler, device, amp,
                                         tc.grad_clip))
            scheduler.step()
            step_times.append(time.perf_counter() - t0)
        # the first step pays for lazy initialisation (allocator, autograd, kernels): the steps after it are the speed
        step_time_s = statistics.median(step_times[1:] or step_times)
        if not all(math.isfinite(x) for x in losses):
            raise SmokeTestFailed(f"training loss is not finite after {steps} steps: {losses}")

        stage = "a checkpoint save/load round trip"
        with tempfile.TemporaryDirectory(prefix="thrifty-smoke-") as tmp:
            ckpts = CheckpointManager(FileStore(tmp), "smoke", keep_last=1)
            save_s = ckpts.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(),
                                 "scheduler": scheduler.state_dict(), "scaler": scaler.state_dict()}, steps, None)
            _, state = ckpts.load_latest()
            fresh = recipe.make_model(params, cache.manifest["meta"])
            fresh.load_state_dict(state["model"])
            fresh_opt = recipe.make_optimizer(fresh, tc)
            fresh_opt.load_state_dict(state["optimizer"])
            recipe.make_scheduler(fresh_opt, tc, max(steps, 1)).load_state_dict(state["scheduler"])
        if weights_sha256(fresh.state_dict()) != weights_sha256(model.state_dict()):
            raise SmokeTestFailed("weights loaded from the checkpoint differ from the weights saved")
    except (SmokeTestFailed, ConfigError) as exc:
        raise SmokeTestFailed(str(exc)) from None
    except Exception as exc:  # the recipe's own bug: say where it happened, and what the data suggests
        hints = dtype_hints(batch) if batch is not None else []
        fix = (" Likely fix: " + "; ".join(hints) + ".") if hints else ""
        raise SmokeTestFailed(f"recipe {recipe.name!r} failed during {stage}: {type(exc).__name__}: {exc}.{fix}") from exc
    return SmokeResult(
        recipe=recipe.name,
        steps=steps,
        losses=[round(x, 6) for x in losses],
        cpu_step_time_s=round(step_time_s, 6),
        cpu_eval_s=round(eval_s, 5),
        cpu_save_s=round(save_s, 5),
        examples_per_step=per_micro * tc.grad_accum_steps,
        parameters=sum(p.numel() for p in model.parameters()),
        precision_checked=precision_name(amp),
        cache_key=cache.key,
        metrics_checked=sorted(evaluated),
    )
