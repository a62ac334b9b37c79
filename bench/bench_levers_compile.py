"""train.compile, side by side: the training step of digits and codelm eager and compiled, in one process.

Each model is built by its recipe (``Recipe.make_model``, the default AdamW of ``make_optimizer``) and stepped by
the loop's own ``optimizer_step`` on random batches of the recipe's shapes (no data to preprocess). The eager and
the compiled copy start from the same weights; after the compiled copy's first step (its compilation, timed) the
two are timed in alternating rounds, so a machine that slows down mid-run slows both. Printed: the median step
time of each, the ratio eager / compiled (> 1: compile is faster), the compilation's seconds and the steps it takes
to pay for itself.

    python bench/bench_levers_compile.py                    # CPU, small shapes: ~1-2 min on a 2-core machine
    python bench/bench_levers_compile.py --device cuda --batch 64 --steps 50
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

import torch  # noqa: E402

from thrifty.config import build_config  # noqa: E402
from training.recipes import resolve_recipe  # noqa: E402
from training.runtime import pick_precision, precision_name  # noqa: E402
from training.speedups import Levers  # noqa: E402
from training.steps import optimizer_step  # noqa: E402


def setups(batch: int, seq_len: int) -> dict[str, tuple[dict, dict, callable]]:
    """recipe -> (recipe_params, meta, a random batch on ``device``), at the bench's shapes."""
    vocab = 2048

    def digits_batch(device: torch.device) -> dict[str, torch.Tensor]:
        return {"x": torch.rand(batch, 64, device=device), "y": torch.randint(0, 10, (batch,), device=device)}

    def codelm_batch(device: torch.device) -> dict[str, torch.Tensor]:
        return {"tokens": torch.randint(0, vocab, (batch, seq_len + 1), device=device)}

    return {
        "digits": ({"hidden": 256}, {"features": 64, "classes": 10}, digits_batch),
        "codelm": ({"seq_len": seq_len}, {"vocab_size": vocab, "seq_len": seq_len}, codelm_batch),
    }


def bench_one(name: str, params: dict, meta: dict, make_batch, device: torch.device, precision: str, steps: int,
              rounds: int) -> dict:
    recipe = resolve_recipe(name)
    cfg = build_config({"recipe": name, "recipe_params": params,
                        "train": {"precision": precision, "compile": "on", "micro_batch": 1}})
    tc = cfg.train
    amp = pick_precision(tc.precision, device)
    levers = Levers(cfg, device, precision_name(amp))  # the loop's TF32 decision, on a GPU
    torch.manual_seed(0)
    eager = recipe.make_model(recipe.parse_params(params), meta).to(device)
    compiled_module = recipe.make_model(recipe.parse_params(params), meta).to(device)
    compiled_module.load_state_dict(eager.state_dict())
    compiled = levers.wrap(compiled_module)
    runs = {}
    for label, model in (("eager", eager), ("compiled", compiled)):
        opt = recipe.make_optimizer(model if label == "eager" else compiled_module, tc)
        scaler = torch.amp.GradScaler(device.type, enabled=amp == torch.float16)
        runs[label] = (model, opt, scaler)
    fixed = make_batch(device)  # one batch: the step's cost, not the data's

    def step(label: str) -> float:
        model, opt, scaler = runs[label]
        if device.type == "cuda":
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        optimizer_step(model, recipe, lambda micro: fixed, 1, opt, scaler, device, amp, tc.grad_clip)  # a float: synced
        return time.perf_counter() - t0

    step("eager")  # warm-up of the eager path too (allocator, first kernels)
    first_compiled = step("compiled")  # the compilation
    step("compiled")  # a backward graph compiled lazily, or a guard's recompile, lands here, not in the timing
    times: dict[str, list[float]] = {"eager": [], "compiled": []}
    for r in range(rounds):
        for label in (("eager", "compiled") if r % 2 == 0 else ("compiled", "eager")):
            times[label] += [step(label) for _ in range(steps)]
    eager_s, compiled_s = statistics.median(times["eager"]), statistics.median(times["compiled"])
    compile_s = max(0.0, first_compiled - compiled_s)
    saved = eager_s - compiled_s
    return {"recipe": name, "device": str(device), "precision": precision_name(amp), "tf32": levers.tf32,
            "eager_step_s": round(eager_s, 6), "compiled_step_s": round(compiled_s, 6),
            "ratio_eager_over_compiled": round(eager_s / compiled_s, 3), "compile_s": round(compile_s, 2),
            "break_even_steps": math.ceil(compile_s / saved) if saved > 0 else None}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    parser.add_argument("--precision", default="fp32", choices=["auto", "fp32", "bf16", "fp16"])
    parser.add_argument("--recipes", default="digits,codelm")
    parser.add_argument("--batch", type=int, default=32, help="examples per step (default 32)")
    parser.add_argument("--seq-len", type=int, default=64, help="codelm's tokens per example (default 64)")
    parser.add_argument("--steps", type=int, default=6, help="steps per round and model (default 6)")
    parser.add_argument("--rounds", type=int, default=4, help="alternating rounds (default 4)")
    parser.add_argument("--threads", type=int, default=0, help="torch threads on CPU (0: torch's default)")
    parser.add_argument("--json", action="store_true", help="print one JSON line per recipe")
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    all_setups = setups(args.batch, args.seq_len)
    print(f"torch {torch.__version__} on {device}" + (f" ({torch.cuda.get_device_name(device)})"
                                                     if device.type == "cuda" else f", {torch.get_num_threads()} threads"))
    print(f"{'recipe':8} {'eager s/step':>13} {'compiled s/step':>16} {'eager/compiled':>15} {'compile s':>10} "
          f"{'break-even steps':>17}")
    for name in args.recipes.split(","):
        params, meta, make_batch = all_setups[name]
        row = bench_one(name, params, meta, make_batch, device, args.precision, args.steps, args.rounds)
        if args.json:
            print(json.dumps(row))
        print(f"{name:8} {row['eager_step_s']:13.5f} {row['compiled_step_s']:16.5f} "
              f"{row['ratio_eager_over_compiled']:14.2f}x {row['compile_s']:10.1f} "
              f"{row['break_even_steps'] if row['break_even_steps'] is not None else 'never':>17}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
