"""Reuse: a nightly warm start against a from-scratch night (codelm, CPU), and the size of half-precision gold weights.

Night 1 trains codelm from scratch on the first part of its corpus. Night 2 has fresh data (the corpus grew by
``--growth``; the BPE is trained on a fixed leading slice, ``tokenizer_max_bytes``, so token ids keep their
meaning) and is trained twice, side by side in this process with the same settings and early stopping: from
scratch, and warm-started from night 1's gold weights (``init_from: run:night-1:gold``, what ``init_from:
previous`` resolves to). The target is the best validation loss the from-scratch night reaches; each arm's steps
and dollars to reach it are read off its metric lines (the first evaluation at or below the target; dollars =
wall time from the start of training to that evaluation, evaluations and checkpoints included, at the emulated
instance's spot price). Then night 2's gold weights are exported in fp16 and bf16 and their sizes and validation
losses compared with the full weights.

    python bench/bench_reuse.py               # ~5 min on a 2-core CPU
    python bench/bench_reuse.py --json out.json
"""

from __future__ import annotations

import argparse
import json
import logging
import shutil
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

import torch  # noqa: E402

from thrifty.config import build_config  # noqa: E402
from thrifty.money.pricing import find_instance  # noqa: E402
from thrifty.runs import checkpoints, read_metrics  # noqa: E402
from thrifty.storage import open_store  # noqa: E402
from training.export import export_checkpoint  # noqa: E402
from training.loop import train  # noqa: E402


def run_config(store: str, name: str, params: dict, args: argparse.Namespace, **train_cfg):
    return build_config({
        "run_name": name, "recipe": "codelm", "store": store, "recipe_params": params,
        "train": {"max_epochs": args.max_epochs, "micro_batch": 16, "lr": 3e-3, "warmup_steps": 20,
                  "precision": "fp32", "checkpoint_every": 200, "log_every": 20, "eval_every": args.eval_every,
                  "early_stopping": {"patience": 3, "min_delta": 0.005}, **train_cfg},
        "compute": {"emulate": args.instance},
    })


def to_target(records: list[dict], target: float) -> tuple[int | None, float | None]:
    """(step, seconds since the start of training) of the first evaluation at or below ``target``."""
    start = next(r["time_unix"] for r in records if r.get("event") == "start")
    for r in records:
        if r.get("event") == "eval" and r["val_loss"] <= target:
            return r["step"], r["time_unix"] - start
    return None, None


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--night1-bytes", type=int, default=500_000, help="night 1's corpus (bytes of stdlib)")
    parser.add_argument("--growth", type=float, default=0.3, help="night 2's corpus is this much larger (fraction)")
    parser.add_argument("--max-epochs", type=int, default=6)
    parser.add_argument("--eval-every", type=int, default=25)
    parser.add_argument("--instance", default="aws:g5.xlarge", help="the price the dollars are read at (spot)")
    parser.add_argument("--store", help="keep the store here (default: a temporary one, deleted)")
    parser.add_argument("--json", help="write the figures here")
    args = parser.parse_args()
    torch.set_num_threads(1)
    logging.basicConfig(level=logging.WARNING)
    root = Path(args.store) if args.store else Path(tempfile.mkdtemp(prefix="thrifty-bench-reuse-"))
    store_uri = str(root)
    model = {"vocab_size": 1024, "tokenizer_max_bytes": 300_000, "seq_len": 64, "n_layer": 2, "n_head": 4,
             "n_embd": 64, "val_every": 6}
    night1 = {**model, "max_bytes": args.night1_bytes}
    night2 = {**model, "max_bytes": int(args.night1_bytes * (1 + args.growth))}
    price = find_instance(*args.instance.split(":")).spot_usd_per_hour
    try:
        first = train(run_config(store_uri, "night-1", night1, args))
        scratch = train(run_config(store_uri, "night-2-scratch", night2, args))
        warm = train(run_config(store_uri, "night-2-warm", night2, args, init_from="run:night-1:gold"))
        store = open_store(store_uri)
        target = scratch.summary.best_metric.value
        arms = {}
        for name, result in (("scratch", scratch), ("warm", warm)):
            step, seconds = to_target(read_metrics(store, result.summary.run_id), target)
            arms[name] = {"steps_to_target": step, "seconds_to_target": seconds,
                          "usd_to_target": None if seconds is None else seconds / 3600 * price,
                          "steps_trained": result.summary.steps, "best_val_loss": result.summary.best_metric.value,
                          "wall_s": result.summary.wall_time_s, "usd_trained": result.summary.wall_time_s / 3600 * price}
        lever = warm.summary.init_from
        gold = checkpoints.best_checkpoint(store, "night-2-warm")
        exports = {d: export_checkpoint(store, "night-2-warm", gold, d, 0.01) for d in ("fp16", "bf16")}
        s, w = arms["scratch"], arms["warm"]
        print(f"codelm, night 1 {night1['max_bytes']:,} B of corpus, night 2 {night2['max_bytes']:,} B; "
              f"{args.instance} spot ${price}/h; night 1 trained {first.summary.steps} steps from scratch")
        print(f"target: night 2 from scratch's best val_loss {target:.4f}")
        print(f"{'':10} {'steps to target':>16} {'$ to target':>12} {'steps trained':>14} {'$ trained':>11} "
              f"{'best val_loss':>14}")
        for name, a in arms.items():
            usd = "-" if a["usd_to_target"] is None else f"{a['usd_to_target']:.6f}"
            print(f"{name:10} {str(a['steps_to_target']):>16} {usd:>12} {a['steps_trained']:>14} "
                  f"{a['usd_trained']:>11.6f} {a['best_val_loss']:>14.4f}")
        if w["steps_to_target"] is not None:
            print(f"warm start: {w['steps_to_target'] / s['steps_to_target']:.2f}x the steps and "
                  f"{w['usd_to_target'] / s['usd_to_target']:.2f}x the dollars to the same validation loss; "
                  f"{w['steps_trained'] / s['steps_trained']:.2f}x the steps and "
                  f"{w['usd_trained'] / s['usd_trained']:.2f}x the dollars to its early stop")
        print(f"the report's lever (against night 1, the from-scratch run it descends from): "
              f"{lever.steps_not_trained} steps not trained (night 1 {'reached' if lever.reference_reached else 'never reached'} "
              f"night 2's best at step {lever.reference_steps})")
        for d, e in exports.items():
            print(f"{d} export: {e.bytes:,} B = {e.bytes / e.fp32_bytes:.3f}x the fp32 weights ({e.fp32_bytes:,} B), "
                  f"{e.bytes / e.source_bytes:.3f}x the whole checkpoint ({e.source_bytes:,} B); val_loss "
                  f"{e.half['val_loss']:.5f} vs {e.full['val_loss']:.5f} ({e.relative_difference:.4%})")
        if args.json:
            Path(args.json).write_text(json.dumps({
                "target_val_loss": target, "arms": arms, "price_usd_per_hour": price,
                "lever": lever.model_dump(), "exports": {d: e.model_dump() for d, e in exports.items()}}, indent=1))
        return 0 if w["steps_to_target"] is not None and w["steps_to_target"] < s["steps_to_target"] else 1
    finally:
        if not args.store:
            shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
