"""Activation checkpointing on codelm: memory a step keeps for its backward pass against the compute it adds.

For each mode of ``train.activation_checkpointing`` (off, selective every 2nd block, full) on one codelm model:
the activation bytes a micro-batch keeps (counted by autograd's saved-tensor hooks, any device; on a GPU also the
step's peak allocated memory), the largest micro-batch that fits the activation budget `off` needs for
``--micro-batch`` examples, and the median step time, the modes taking turns step by step (ABCABC...) so the
machine's drift falls on all alike. Ratios against off. Runs unchanged on a GPU (``--device cuda``).

    python bench/bench_levers_memory.py [--device cpu|cuda] [--steps 12] [--micro-batch 16] [--layers 4] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

import torch  # noqa: E402

from thrifty.config import build_config  # noqa: E402
from training import memory  # noqa: E402
from training.recipes.base import resolve_recipe  # noqa: E402

MODES = ("off", "selective", "full")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    ap.add_argument("--steps", type=int, default=12, help="timed steps per mode (after 2 warm-up steps)")
    ap.add_argument("--micro-batch", type=int, default=16)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--width", type=int, default=128)
    ap.add_argument("--seq-len", type=int, default=128)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    if args.device == "cpu":
        torch.set_num_threads(1)
    device = torch.device(args.device)
    recipe = resolve_recipe("codelm")
    params = recipe.parse_params({"n_layer": args.layers, "n_embd": args.width, "n_head": 4, "seq_len": args.seq_len,
                                  "vocab_size": 1024, "dropout": 0.1})
    meta = {"vocab_size": 1024, "seq_len": args.seq_len}
    tokens = torch.randint(0, 1024, (args.micro_batch, args.seq_len + 1), device=device)
    batch = {"tokens": tokens}
    models, opts, saved, peak = {}, {}, {}, {}
    for mode in MODES:
        torch.manual_seed(0)
        model = recipe.make_model(params, meta).to(device)
        memory.apply(model, recipe, build_config({"train": {"activation_checkpointing": mode}}).train)
        models[mode], opts[mode] = model, torch.optim.AdamW(model.parameters(), lr=1e-3)
        with memory.SavedActivations(model) as kept:
            recipe.run_step(model, batch, "train").loss.backward()
        saved[mode] = kept.bytes
        model.zero_grad(set_to_none=True)
        if device.type == "cuda":
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
            base = torch.cuda.memory_allocated()
            recipe.run_step(model, batch, "train").loss.backward()
            torch.cuda.synchronize()
            peak[mode] = torch.cuda.max_memory_allocated() - base
            model.zero_grad(set_to_none=True)

    def step(mode: str) -> float:
        t0 = time.perf_counter()
        recipe.run_step(models[mode], batch, "train").loss.backward()
        opts[mode].step()
        opts[mode].zero_grad(set_to_none=True)
        if device.type == "cuda":
            torch.cuda.synchronize()
        return time.perf_counter() - t0

    times: dict[str, list[float]] = {m: [] for m in MODES}
    for i in range(args.steps + 2):
        for mode in MODES:
            t = step(mode)
            if i >= 2:
                times[mode].append(t)
    med = {m: statistics.median(times[m]) for m in MODES}
    rows = []
    print(f"codelm {args.layers} blocks x {args.width} wide, {args.seq_len} tokens, micro-batch {args.micro_batch}, "
          f"{args.device}; {args.steps} steps a mode, interleaved")
    print(f"{'mode':<10} {'activations/ex':>15} {'x off':>7} {'micro-batch in off budget':>26} {'step s':>9} "
          f"{'x off':>7}" + ("  peak MiB  x off" if peak else ""))
    for mode in MODES:
        per_ex = saved[mode] / args.micro_batch
        fits = int(saved["off"] // per_ex) if per_ex else 0
        row = {"mode": mode, "activation_bytes_per_example": round(per_ex), "memory_ratio": saved[mode] / saved["off"],
               "micro_batch_in_off_budget": fits, "batch_multiplier": fits / args.micro_batch,
               "step_s": med[mode], "compute_ratio": med[mode] / med["off"]}
        if peak:
            row |= {"peak_bytes": peak[mode], "peak_ratio": peak[mode] / peak["off"]}
        rows.append(row)
        print(f"{mode:<10} {per_ex:>15,.0f} {row['memory_ratio']:>7.3f} {fits:>20} ({row['batch_multiplier']:.2f}x) "
              f"{med[mode]:>9.4f} {row['compute_ratio']:>7.3f}"
              + (f"  {peak[mode] / 2**20:8.1f} {row['peak_ratio']:5.3f}" if peak else ""))
    if args.json:
        args.json.write_text(json.dumps({"args": {k: str(v) for k, v in vars(args).items()}, "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
