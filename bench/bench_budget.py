"""The hard cap, measured: final spend as a fraction of max_usd, and the steps kept, for budgets around a run's cost.

A reference run (digits on an emulated p5.48xlarge spot, ~1.1 cents a second, so seconds cost
real money) measures what the whole run costs. Then the same run is trained, each time from
scratch, with ``budget.max_usd`` from 0.5x to 3x of that cost, at ``poll_s`` 1 and 5, through
the real flow (smoke test, gate, local launcher, watch loop, node meter). For each: the spend as
a fraction of the cap (goal: never above 1.00), how the run ended, the steps trained, the newest
checkpoint, and whether it lies within one checkpoint interval of where training stopped.

    python bench/bench_budget.py                 # ~8 min on a 2-core CPU
    python bench/bench_budget.py --fractions 0.5 1 --polls 5 --json out.json
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))
os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
os.environ.setdefault("DO_NOT_TRACK", "1")
os.environ.setdefault("PREFECT_LOGGING_LEVEL", "WARNING")  # the table below is the output

CHECKPOINT_EVERY = 25


def config(store: Path, run: str, max_usd: float, margin_s: float):
    from thrifty.config import build_config

    return build_config({
        "run_name": run, "recipe": "digits", "store": str(store), "recipe_params": {"hidden": 512},
        "train": {"max_epochs": 40, "micro_batch": 16, "precision": "fp32", "checkpoint_every": CHECKPOINT_EVERY,
                  "log_every": 5, "early_stopping": {"enabled": False}},
        "compute": {"emulate": "aws:p5.48xlarge"},
        "budget": {"max_usd": max_usd, "allow_over_budget": True, "stop_margin_s": margin_s,
                   "burn_rate_alert_usd_per_hour": None, "thresholds": [1.0]},
    })


def measure(store: Path, run: str, max_usd: float, margin_s: float, poll_s: float) -> dict:
    from flows.train_pipeline import train_pipeline
    from thrifty.runs import checkpoints
    from thrifty.money.budget import spend_usd
    from thrifty.money.ledger import read_attempts
    from thrifty.runs import latest_progress, read_metrics
    from thrifty.storage import open_store

    state = train_pipeline(config(store, run, max_usd, margin_s), poll_s=poll_s, return_state=True)
    s = open_store(str(store))
    spent = spend_usd(read_attempts(s, run))
    saved = checkpoints.committed(s, run)
    trained = latest_progress(read_metrics(s, run)).get("step", 0)
    kept = saved[-1].step if saved else None
    return {"max_usd": round(max_usd, 5), "poll_s": poll_s, "end": state.name, "spend_usd": round(spent, 5),
            "fraction": round(spent / max_usd, 4), "steps_trained": trained, "last_checkpoint": kept,
            # a refused budget trains nothing and owes no checkpoint
            "within_one_interval": trained == 0 or (kept is not None and trained - kept <= CHECKPOINT_EVERY)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--fractions", type=float, nargs="+", default=[0.5, 0.75, 1.0, 1.5, 2.0, 3.0])
    parser.add_argument("--polls", type=float, nargs="+", default=[1.0, 5.0])
    parser.add_argument("--margin-s", type=float, default=3.0, help="budget.stop_margin_s")
    parser.add_argument("--json", help="write the rows here")
    args = parser.parse_args()
    import torch

    torch.set_num_threads(1)
    root = Path(tempfile.mkdtemp(prefix="thrifty-bench-budget-"))
    rows = []
    try:
        ref = measure(root / "ref", "ref", 100.0, args.margin_s, 1.0)
        cost = ref["spend_usd"]
        print(f"reference run: ${cost:.4f} for {ref['steps_trained']} steps ({ref['end']})")
        for poll in args.polls:
            for frac in args.fractions:
                row = measure(root / f"p{poll}-{frac}", "capped", frac * cost, args.margin_s, poll)
                row["budget_x"] = frac
                rows.append(row)
                print(f"  {frac:>4}x ${row['max_usd']:.4f} poll {poll:g} s: {row['end']:<13} spent ${row['spend_usd']:.4f} "
                      f"= {row['fraction']:.3f} of the cap; {row['steps_trained']} steps, checkpoint "
                      f"{row['last_checkpoint']} ({'within' if row['within_one_interval'] else 'NOT within'} one "
                      f"interval of {CHECKPOINT_EVERY}{'; nothing trained' if not row['steps_trained'] else ''})",
                      flush=True)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    worst = max(r["fraction"] for r in rows)
    print(f"\nworst spend/cap: {worst:.3f} (goal <= 1.000: {'met' if worst <= 1.0 else 'MISSED'}); "
          f"checkpoint within one interval of the stop: {sum(r['within_one_interval'] for r in rows)}/{len(rows)} "
          f"({sum(1 for r in rows if r['end'] == 'BadInput')} refused by the gate, nothing spent)")
    if args.json:
        Path(args.json).write_text(json.dumps({"reference_usd": cost, "rows": rows}, indent=2))
    return 0 if worst <= 1.0 else 1


if __name__ == "__main__":
    sys.exit(main())
