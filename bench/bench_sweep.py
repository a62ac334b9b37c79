"""What successive halving saves: the same trials searched (rungs 1 -> 3 -> 9 -> 27 epochs, eta 3) against all of
them trained to the full budget, side by side in one run, both through the real thrifty-sweep flow.

Both arms draw the same trials (same base, space and seed) and run them the same way: two at a time, each a
thrifty-train child flow run on the local launcher, metered at the emulated instance's spot price. The "full"
arm is the same sweep with one rung at max_epochs (``min_epochs = max_epochs``: every trial trains to the end,
early stopping as in the base). Reported: dollars (the trials' ledgers), wall time, launches, the best metric
each arm found, the saving, and the search's own estimate of the full cost beside the measured one.

    python bench/bench_sweep.py                       # ~4 min on a 2-core CPU
    python bench/bench_sweep.py --trials 9 --max-epochs 27 --hidden 512 --json out.json
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))
os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
os.environ.setdefault("DO_NOT_TRACK", "1")
os.environ.setdefault("PREFECT_LOGGING_LEVEL", "WARNING")  # the table below is the output


def sweep_config(store: Path, name: str, args: argparse.Namespace, full: bool):
    from thrifty.sweep import build_sweep

    return build_sweep({
        "name": name, "seed": args.seed, "max_trials": args.trials, "eta": 3, "max_epochs": args.max_epochs,
        "min_epochs": args.max_epochs if full else 1, "concurrency": args.concurrency, "max_usd": 100.0,
        "reserve_factor": 10.0,  # generous: a job its own cap stops pays a second start-up, in either arm
        "space": {"train.lr": {"log_uniform": [1e-5, 1e-2]}, "train.weight_decay": {"choice": [0.0, 0.01]}},
        "base": {"recipe": "digits", "store": str(store), "recipe_params": {"hidden": args.hidden},
                 "train": {"micro_batch": args.micro_batch, "precision": "fp32", "checkpoint_every": 1000000,
                           "log_every": 50, "early_stopping": {"patience": args.patience}},
                 "compute": {"emulate": args.emulate}, "budget": {"stop_margin_s": 10}},
    })


def arm(store: Path, name: str, args: argparse.Namespace, full: bool) -> dict:
    from flows.sweep import sweep
    from thrifty.money.ledger import read_attempts
    from thrifty.runs import latest_progress, read_metrics
    from thrifty.storage import open_store

    cfg = sweep_config(store, name, args, full)
    t0 = time.perf_counter()
    out = sweep(cfg, poll_s=0.5)
    wall = time.perf_counter() - t0
    s = open_store(str(store))
    launches = sum(len(read_attempts(s, cfg.run_name(i))) for i in range(cfg.max_trials))
    epochs = 0.0  # trained, early stops included: each run's newest step over its steps per epoch
    for i in range(cfg.max_trials):
        records = read_metrics(s, cfg.run_name(i))
        start = next((r for r in records if r.get("event") == "start"), None)
        if start:
            per_epoch = cfg.trial(i).train.steps_per_epoch(int(start["train_examples"]), 1)
            epochs += latest_progress(records).get("step", 0) / per_epoch
    return {"usd": out.spent_usd, "wall_s": wall, "launches": launches, "epochs": epochs, "best": out.best_value,
            "best_run": out.best_run, "best_values": out.best_values, "estimated_full_usd": out.full_usd,
            "metric": out.metric}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--trials", type=int, default=9)
    p.add_argument("--max-epochs", type=int, default=27, help="the full budget; rungs 1, 3, 9, 27 at eta 3")
    p.add_argument("--hidden", type=int, default=512, help="digits' MLP width (a heavier epoch)")
    p.add_argument("--micro-batch", type=int, default=16)
    p.add_argument("--patience", type=int, default=5, help="early stopping, the same in both arms")
    p.add_argument("--concurrency", type=int, default=2)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--emulate", default="aws:g5.xlarge", help="the instance whose spot price meters the jobs")
    p.add_argument("--store", help="keep the store here (default: a temporary directory, deleted)")
    p.add_argument("--json", help="write the figures here")
    args = p.parse_args()
    tmp = None if args.store else tempfile.mkdtemp(prefix="bench-sweep-")
    store = Path(args.store or tmp) / "store"
    try:
        search = arm(store, "bench-search", args, full=False)  # first: it also fills the preprocessing cache
        full = arm(store, "bench-full", args, full=True)
    finally:
        if tmp:
            shutil.rmtree(tmp, ignore_errors=True)
    saving = 1.0 - search["usd"] / full["usd"]
    rows = [("dollars (emulated spot)", f"${search['usd']:.5f}", f"${full['usd']:.5f}", f"{saving:.0%} saved"),
            ("wall time", f"{search['wall_s']:.0f} s", f"{full['wall_s']:.0f} s",
             f"{1 - search['wall_s'] / full['wall_s']:.0%} saved"),
            ("launches (ledger attempts)", str(search["launches"]), str(full["launches"]), ""),
            ("epochs trained (early stops too)", f"{search['epochs']:.0f}", f"{full['epochs']:.0f}", ""),
            (f"best {search['metric']}", f"{search['best']:.4f}", f"{full['best']:.4f}",
             f"{search['best_run']} vs {full['best_run']}"),
            ("the search's estimate of full", f"${search['estimated_full_usd']:.5f}", f"${full['usd']:.5f} measured",
             f"{search['estimated_full_usd'] / full['usd']:.2f}x")]
    print(f"\n{args.trials} trials of digits (hidden {args.hidden}, micro_batch {args.micro_batch}), max_epochs "
          f"{args.max_epochs}, {args.concurrency} at a time, {args.emulate} spot")
    print(f"{'':32} {'search':>14} {'all to the end':>18}")
    for label, a, b, note in rows:
        print(f"{label:32} {a:>14} {b:>18}   {note}")
    if args.json:
        Path(args.json).write_text(json.dumps({"search": search, "full": full, "saving": saving,
                                               "args": vars(args)}, indent=2, default=str))


if __name__ == "__main__":
    main()
