"""Half-precision gold weights: a checkpoint's evaluated weights as safetensors in fp16 or bf16, beside it.

Floating tensors are cast, others kept; tensors that share storage (tied embeddings) are written once and
named as aliases in the file's metadata. Both the full and the exported weights are evaluated on the run's
evaluation splits (fp32 arithmetic, so only the rounding of the weights differs); the export is written only when
the early-stopping metric moved by at most the tolerance (relative), the safetensors first and its record
(size, sha256, both evaluations) last, so a reader sees a whole export or none. ``thrifty archive gold TARGET
--export fp16|bf16`` runs it on any checkpoint; ``train.export_half`` at the end of a run on its best one.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import logging
import math
import time
from typing import Any

import torch

from thrifty.config import ConfigError, TrainConfig, build_config
from thrifty.runs import checkpoints as layout
from thrifty.runs.checkpoints import CheckpointInfo
from thrifty.runs.reuse import HalfExport, export_file, export_record_name
from thrifty.storage import Store, join_key
from training.data import open_cache
from training.steps import evaluate
from training.validate import check_config
from training.half import to_half
from training.warm_start import Source, evaluated_weights, read_state

log = logging.getLogger("thrifty.export")

EVAL_BATCH = 256  # examples per evaluation batch (fp32 on CPU: memory, not speed, bounds it)


class ExportOutOfTolerance(ConfigError):
    """The half-precision weights evaluate too far from the full ones: nothing is written."""


def _relative(full: float, half: float) -> float:
    if full == half:
        return 0.0
    return abs(half - full) / abs(full) if full else math.inf


def export_checkpoint(store: Store, run_id: str, info: CheckpointInfo, dtype: str, tolerance: float,
                      device: torch.device | None = None) -> HalfExport:
    """Export ``info``'s evaluated weights in ``dtype`` beside it, after checking they evaluate within ``tolerance``
    (relative, on the run's early-stopping metric) of the full ones; ExportOutOfTolerance writes nothing."""
    device = device or torch.device("cpu")
    state = _load_state(store, run_id, info)
    cfg = build_config(json.loads(state["config"]), f"the config saved in {info.prefix}")
    recipe, params = check_config(cfg)
    cache, splits = open_cache(store, recipe, params, dedup=cfg.data)
    model = recipe.make_model(params, cache.manifest["meta"]).to(device)
    full = evaluated_weights(state)
    fp32_bytes = sum(t.numel() * 4 for t in _unique(full).values() if t.is_floating_point())
    half, aliases = to_half(full, dtype)
    metric = cfg.train.early_stopping.metric
    batch = max(cfg.train.step_batch(), EVAL_BATCH)
    model.load_state_dict(full)
    full_eval = evaluate(model, recipe, splits, device, None, batch)
    model.load_state_dict({**half, **{a: half[n] for a, n in aliases.items()}})  # cast back up by load: fp32 math
    half_eval = evaluate(model, recipe, splits, device, None, batch)
    diff = _relative(full_eval[metric], half_eval[metric])
    if not diff <= tolerance:
        raise ExportOutOfTolerance(
            f"{dtype} weights of {info.prefix} give {metric} {half_eval[metric]:.6g} against {full_eval[metric]:.6g} "
            f"with the full weights: {diff:.3%} apart, over the {tolerance:.3%} tolerance; nothing was written. "
            + ("Export fp16 instead (more mantissa bits), or allow more with --tolerance / train.export_tolerance"
               if dtype == "bf16" else "Allow more with --tolerance / train.export_tolerance, or keep the full weights"))
    from safetensors.torch import save

    data = save(half, metadata={"run": run_id, "step": str(info.step), "dtype": dtype, "aliases": json.dumps(aliases),
                                "source_sha256": str(info.commit.get("sha256"))})
    key = join_key(info.prefix, export_file(dtype))
    with store.writer(key) as f:
        f.write(data)
    record = HalfExport(run=run_id, step=info.step, dtype=dtype, key=key, bytes=len(data),
                        sha256=hashlib.sha256(data).hexdigest(), source_sha256=str(info.commit.get("sha256")),
                        source_bytes=int(info.commit.get("bytes") or 0), fp32_bytes=fp32_bytes, metric=metric,
                        full=full_eval, half=half_eval, relative_difference=round(diff, 8), tolerance=tolerance,
                        created_unix=time.time())
    store.put_bytes(join_key(info.prefix, export_record_name(dtype)), record.model_dump_json(indent=1).encode())
    log.info("exported %s weights of %s: %d bytes (fp32 %d, checkpoint %d), %s %.6g vs %.6g (%.4f%% apart)", dtype,
             info.prefix, record.bytes, fp32_bytes, record.source_bytes, metric, half_eval[metric], full_eval[metric],
             100 * diff)
    return record


def _unique(weights: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    tensors, _ = to_half(weights, "fp16")  # the same grouping: one entry per storage
    return {k: weights[k] for k in tensors}


def _load_state(store: Store, run_id: str, info: CheckpointInfo) -> dict[str, Any]:
    """The checkpoint's state, checked against its COMMIT like a resume."""
    src = Source(store, join_key(info.prefix, layout.STATE), "checkpoint", info.prefix, run_id, info.step,
                 info.commit.get("sha256"))
    return read_state(src)


def at_end(store: Store, run_id: str, info: CheckpointInfo | None, tc: TrainConfig,
           device: torch.device) -> HalfExport | None:
    """``train.export_half`` at the end of a run: its best checkpoint exported, or a warning (the run itself is
    fine either way); None when the setting is off."""
    if tc.export_half is None:
        return None
    if info is None:
        log.warning("export_half: run %r has no checkpoint with a validation metric to export", run_id)
        return None
    try:
        return export_checkpoint(store, run_id, info, tc.export_half, tc.export_tolerance, device)
    except ConfigError as exc:
        log.warning("export_half: %s", exc)
        return None


def cmd_export(args: argparse.Namespace) -> int:
    """``thrifty archive gold TARGET --export fp16|bf16``: after the gold mark, the half-precision export."""
    from thrifty.archive import open_checked
    from thrifty.archive.gold import target_checkpoint
    from thrifty.protocol import EXIT_OK

    store = open_checked(args.settings)
    run_id, info = target_checkpoint(store, args.target)
    record = export_checkpoint(store, run_id, info, args.export, args.tolerance)
    print(f"{record.dtype} export of run {run_id} step {record.step}: {store.uri.rstrip('/')}/{record.key}\n"
          f"  {record.bytes} bytes (the same weights in fp32: {record.fp32_bytes}; the whole checkpoint: "
          f"{record.source_bytes}), sha256 {record.sha256}\n"
          f"  {record.metric}: {record.half[record.metric]:.6g} exported, {record.full[record.metric]:.6g} full "
          f"({record.relative_difference:.4%} apart, tolerance {record.tolerance:.2%})\n"
          f"  start a run from it with init_from: run:{run_id}:{record.dtype}")
    return EXIT_OK
