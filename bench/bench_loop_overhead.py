"""The training loop's own per-step cost against a raw torch loop, side by side in one run (issue 24's goal: at most
5 % of the raw loop's step time on digits with checkpoints off).

Both arms train the same model on the same batches with the same AdamW, schedule and clipping (the raw arm is
bench_checkpoint.py's, its one save at the end); Thrifty's arm is
``training.loop.train`` at its defaults but for checkpoints (off: the final save only) and evaluation (the last step
only, as the raw arm's one evaluation), so what it adds is the loop's bookkeeping: the metric lines, data-wait and
step timing, utilisation windows, the early-stopping, checkpoint, signal and cap checks. Each arm runs a short and a
long job; the per-step cost is the difference over the difference in steps, so the fixed per-run costs (the lease,
the cache check, the final save) fall out. Arms alternate within a round and rounds repeat; the figure takes each
job's least time over the rounds (a busy neighbour only ever adds time), and the rounds' own ratios are shown beside
it. CPU: process CPU time (every thread), one torch thread. CUDA:
wall time, synchronised at each end.

    python bench/bench_loop_overhead.py [--device cpu|cuda] [--rounds 7] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import logging
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

import numpy as np  # noqa: E402
import torch  # noqa: E402

from bench.bench_checkpoint import OFF, raw_arm  # noqa: E402
from thrifty.config import RunConfig  # noqa: E402
from thrifty.storage import open_store  # noqa: E402
from training.data import open_cache  # noqa: E402
from training.loop import train  # noqa: E402
from training.recipes.base import resolve_recipe  # noqa: E402

PARAMS: dict[str, Any] = {"hidden": 128}


def config(store: str, name: str, steps: int, device: str) -> RunConfig:
    return RunConfig(run_name=name, recipe="digits", recipe_params=PARAMS, store=store, train={
        "max_steps": steps, "max_epochs": 10**6, "micro_batch": 32, "precision": "fp32", "device": device,
        "checkpoint_every": OFF, "eval_every": steps, "early_stopping": {"enabled": False}})


def timer(device: torch.device) -> Callable[[Callable[[], Any]], float]:
    def cpu(fn: Callable[[], Any]) -> float:
        c0 = time.process_time()
        fn()
        return time.process_time() - c0

    def wall(fn: Callable[[], Any]) -> float:
        torch.cuda.synchronize()
        w0 = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        return time.perf_counter() - w0

    return wall if device.type == "cuda" else cpu


def measure(device_name: str, rounds: int, short: int, long: int) -> dict[str, Any]:
    device = torch.device(device_name)
    work = Path(tempfile.mkdtemp(prefix="thrifty-bench-loop-"))
    store = work / "store"
    recipe = resolve_recipe("digits")
    params = recipe.parse_params(PARAMS)
    cache, splits = open_cache(open_store(str(store)), recipe, params)
    tr, va = splits["train"], splits["val"]
    whole = lambda split, key: torch.from_numpy(split.arrays[key].take(np.arange(split.n)))  # noqa: E731
    data = {"recipe": recipe, "params": params, "meta": cache.manifest["meta"],
            "cfg": config(str(store), "x", 1, device_name), "x": whole(tr, "x"), "y": whole(tr, "y"),
            "vx": whole(va, "x"), "vy": whole(va, "y")}
    timed = timer(device)
    runs = 0

    def thrifty(steps: int) -> None:
        nonlocal runs
        runs += 1
        train(config(str(store), f"t{runs}", steps, device_name))

    arms = {"thrifty": thrifty, "raw": lambda steps: raw_arm(data, work / "raw", OFF, steps, device)}
    for arm in arms.values():  # warm-up: imports, the allocator, the first cache open
        arm(short)
    times: dict[tuple[str, int], list[float]] = {(arm, steps): [] for arm in arms for steps in (short, long)}
    for r in range(rounds):
        order = list(arms) if r % 2 == 0 else list(reversed(arms))
        for steps in (short, long):
            for arm in order:
                times[(arm, steps)].append(timed(lambda: arms[arm](steps)))
    # each job's least time over the rounds (a busy neighbour only ever adds time), then the per-step slope
    step = {arm: (min(times[(arm, long)]) - min(times[(arm, short)])) / (long - short) for arm in arms}
    by_round = [((times[("thrifty", long)][r] - times[("thrifty", short)][r])
                 / (times[("raw", long)][r] - times[("raw", short)][r]) - 1) for r in range(rounds)]
    return {"device": device_name, "rounds": rounds, "steps": [short, long],
            "thrifty_step_us": round(step["thrifty"] * 1e6, 1), "raw_step_us": round(step["raw"] * 1e6, 1),
            "overhead_us": round((step["thrifty"] - step["raw"]) * 1e6, 1),
            "overhead_share": round(step["thrifty"] / step["raw"] - 1, 4),
            "overhead_share_round_median": round(statistics.median(by_round), 4),
            "overhead_share_by_round": [round(s, 4) for s in by_round]}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--short", type=int, default=500, help="steps of the short job (default 500)")
    ap.add_argument("--long", type=int, default=4000, help="steps of the long job (default 4000)")
    ap.add_argument("--json", action="store_true", help="print the figures as one JSON line")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.ERROR)
    torch.set_num_threads(1)
    r = measure(args.device, args.rounds, args.short, args.long)
    if args.json:
        print(json.dumps(r))
        return 0
    print(f"digits MLP (hidden {PARAMS['hidden']}), micro-batch 32, {args.device}, checkpoints off; per-step cost from "
          f"{args.short}- and {args.long}-step jobs, least of {args.rounds} rounds")
    print(f"  raw torch loop            {r['raw_step_us']:8.1f} us a step")
    print(f"  Thrifty's loop            {r['thrifty_step_us']:8.1f} us a step")
    print(f"  the loop's own per step   {r['overhead_us']:8.1f} us = {r['overhead_share']:.1%} of raw (goal <= 5 %)")
    print(f"  each round's own ratio    median {r['overhead_share_round_median']:.1%}; "
          f"{', '.join(f'{s:.1%}' for s in r['overhead_share_by_round'])}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
