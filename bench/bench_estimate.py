"""The pre-launch estimate against what runs actually cost: estimate / actual for four kinds of job, first and
second run.

Each workload runs twice through the real flow (smoke test, budget gate, local launcher, watch loop, report) in
one fresh store, under two run names: the first run's estimate is scaled from the smoke test's CPU measurement
(basis "scaled"), the second's comes from the store's history of the first (basis "measured": start-up and the
all-in cost of a step). Actual is the ledger's spend. The goal: within 3x on a first run, within +-30 % once the
store holds one run of the model. Emulated prices (aws:g5.xlarge spot), training on this machine's CPU.

    python bench/bench_estimate.py                      # ~6 min on a 2-core CPU
    python bench/bench_estimate.py --only digits --json out.json
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

WORKLOADS = {  # name: (recipe, recipe_params, train settings)
    "digits": ("digits", {}, {"max_epochs": 8, "micro_batch": 32, "early_stopping": {"patience": 50}}),
    "codelm": ("codelm", {}, {"max_epochs": 20, "max_steps": 120, "micro_batch": 32, "lr": 0.003,
                              "warmup_steps": 30, "eval_every": 40, "early_stopping": {"patience": 50}}),
    "script": ("script", {"command": "python examples/script/train.py --epochs 6 --batch 32"},
               {"checkpoint_every": 20, "log_every": 5, "early_stopping": {"patience": 50}}),
    "lightning": ("script", {"command": "python examples/script/lightning_train.py --epochs 4"},
                  {"checkpoint_every": 40, "log_every": 5, "early_stopping": {"patience": 50}}),
}


def config(store: Path, workload: str, run: str):
    from thrifty.config import build_config

    recipe, params, train = WORKLOADS[workload]
    return build_config({"run_name": run, "recipe": recipe, "store": str(store), "recipe_params": params,
                         "train": {"precision": "fp32", **train},
                         "compute": {"emulate": "aws:g5.xlarge"}, "budget": {"max_usd": 5.0}})


def measure(store: Path, workload: str, run: str) -> dict:
    from flows.train_pipeline import train_pipeline

    out = train_pipeline(config(store, workload, run), poll_s=0.5)
    est = out.estimate
    return {"workload": workload, "run": run, "basis": est.basis, "estimate_usd": est.usd, "low_usd": est.low_usd,
            "high_usd": est.high_usd, "actual_usd": out.cost_usd, "ratio": est.usd / out.cost_usd,
            "in_range": est.low_usd <= out.cost_usd <= est.high_usd}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", nargs="*", choices=sorted(WORKLOADS), default=list(WORKLOADS))
    parser.add_argument("--json", help="also write the rows here")
    args = parser.parse_args()
    from prefect.testing.utilities import prefect_test_harness

    os.chdir(REPO)  # the script commands are relative to the repository
    rows = []
    with prefect_test_harness(server_startup_timeout=120):
        for workload in args.only:
            tmp = Path(tempfile.mkdtemp(prefix=f"bench-estimate-{workload}-"))
            try:
                for n in (1, 2):
                    rows.append(measure(tmp / "store", workload, f"{workload}-{n}"))
                    r = rows[-1]
                    print(f"{r['workload']:<10} run {n}  {r['basis']:<9} estimate ${r['estimate_usd']:.5f} "
                          f"(${r['low_usd']:.5f}-${r['high_usd']:.5f})  actual ${r['actual_usd']:.5f}  "
                          f"estimate/actual {r['ratio']:.2f}  {'in range' if r['in_range'] else 'OUT OF RANGE'}",
                          flush=True)
            finally:
                shutil.rmtree(tmp, ignore_errors=True)
    print("\n| workload | run | basis | estimate $ | range $ | actual $ | estimate / actual |")
    print("|---|---:|---|---:|---:|---:|---:|")
    for r in rows:
        print(f"| {r['workload']} | {r['run'][-1]} | {r['basis']} | {r['estimate_usd']:.5f} | "
              f"{r['low_usd']:.5f}-{r['high_usd']:.5f} | {r['actual_usd']:.5f} | {r['ratio']:.2f} |")
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
