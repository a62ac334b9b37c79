"""Start-up after a preemption: seconds from `python -m training` to its first trained step on resume, before and after.

For each recipe (digits, codelm; CPU, one thread) a run gets one committed checkpoint. Then the node program
resumes it again and again with the environment the local launcher gives a node (the RunConfig, the prices, the
job id, a lease token), each time SIGKILLed by thrifty.faults right after its first optimizer step
(THRIFTY_FAULT=step:1), so the process's life is its start-up plus one step and the run stays at its checkpoint
for the next round. Two source trees take turns, ABAB...: `--before REV` (default 534ba40, the code before
issue 20's start-up work), exported with `git archive`, and this checkout. Medians of wall and CPU seconds, the
ratio before/after, and what the node imported that it need not (torch._dynamo, sklearn, prefect, boto3, sky).

    python bench/bench_startup.py [--rounds 7] [--before REV] [--recipes digits,codelm] [--json out.json]
"""

from __future__ import annotations

import argparse
import io
import json
import os
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from thrifty.config import ENV_VAR, build_config  # noqa: E402
from thrifty.launchers.base import node_env  # noqa: E402
from thrifty.money.meter import Price  # noqa: E402
from thrifty.money.pricing import quote_emulated  # noqa: E402
from thrifty.protocol import ENV_BILLING_START, ENV_JOB_ID, ENV_LEASE_TOKEN  # noqa: E402

RECIPES = {  # the examples' models; codelm on a smaller corpus so that preparing it takes seconds, not minutes
    "digits": {"recipe_params": {}, "train": {"micro_batch": 64}},
    "codelm": {"recipe_params": {"max_bytes": 400_000, "vocab_size": 1024},
               "train": {"micro_batch": 32, "lr": 0.003, "warmup_steps": 30}},
}
UNNEEDED = ("torch._dynamo.convert_frame", "torch._inductor", "sklearn", "prefect", "boto3", "sky")
PROBE = f"""
import sys
import thrifty.faults as faults
point = faults.fault_point
def report_then_die(name):
    if name == "step":
        print("LOADED " + ",".join(m for m in {UNNEEDED!r} if m in sys.modules), file=sys.stderr, flush=True)
    point(name)
faults.fault_point = report_then_die
"""


def export_tree(rev: str, into: Path) -> Path:
    """The source tree at ``rev`` (tracked files only), to put first on PYTHONPATH."""
    data = subprocess.run(["git", "-C", str(REPO), "archive", "--format=tar", rev], capture_output=True, check=True)
    with tarfile.open(fileobj=io.BytesIO(data.stdout)) as tar:
        tar.extractall(into, filter="data")
    return into


def config(recipe: str, store: Path) -> dict:
    """The run's settings as a user writes them: each tree fills in its own defaults (the trees' RunConfigs differ)."""
    spec = RECIPES[recipe]
    return {"run_name": f"startup-{recipe}", "recipe": recipe, "store": str(store), "recipe_params": spec["recipe_params"],
            "train": {"max_epochs": 50, "precision": "fp32", "device": "cpu", "checkpoint_every": 10, "log_every": 1,
                      "async_checkpoint": False, "early_stopping": {"enabled": False}, **spec["train"]}}


def node(cfg: dict, tree: Path, tmp: Path, fault: str) -> dict[str, str]:
    """The environment the local launcher gives a node (thrifty.launchers.local), on ``tree``'s code."""
    q = quote_emulated("aws:g5.xlarge", True)
    price = Price(q.cloud, q.instance, True, q.usd_per_hour, q.accelerator, q.source)
    env = {k: v for k, v in os.environ.items() if not k.startswith("THRIFTY_")}
    return {**env, **node_env(build_config(cfg), [price]), ENV_VAR: json.dumps(cfg), ENV_JOB_ID: "local-bench",
            ENV_BILLING_START: repr(time.time()),
            ENV_LEASE_TOKEN: "bench", "THRIFTY_FAULT": fault, "PYTHONPATH": str(tree), "OMP_NUM_THREADS": "1",
            "HOME": str(tmp / "home"), "TMPDIR": str(tmp / "tmp"), "THRIFTY_LOCAL_CACHE": str(tmp / "shard-cache")}


def first_step(cfg, tree: Path, tmp: Path) -> tuple[float, float, str]:
    """(wall s, CPU s, unneeded modules loaded) of one resume that dies right after its first step."""
    env = node(cfg, tree, tmp, "step:1")
    with tempfile.TemporaryFile("w+") as log:
        t0 = time.perf_counter()
        proc = subprocess.Popen([sys.executable, "-c", PROBE + "\nimport runpy\nrunpy.run_module('training', "
                                 "run_name='__main__')"], env=env, cwd=tmp, stdout=subprocess.DEVNULL, stderr=log)
        _, status, usage = os.wait4(proc.pid, 0)
        wall = time.perf_counter() - t0
        proc.returncode = -os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status)
        log.seek(0)
        err = log.read()
    if proc.returncode != -9 or "resumed run" not in err:
        raise SystemExit(f"{tree}: expected a resume killed after its first step, got {proc.returncode}:\n{err[-3000:]}")
    loaded = next((line[7:] for line in err.splitlines() if line.startswith("LOADED ")), "?")
    return wall, usage.ru_utime + usage.ru_stime, loaded


def prepare(cfg, tree: Path, tmp: Path) -> None:
    """Preprocess and train to the first checkpoint (step 10), then die: the run every round resumes."""
    out = subprocess.run([sys.executable, "-m", "training"], env=node(cfg, tree, tmp, "after_commit:1"), cwd=tmp,
                         capture_output=True, text=True, timeout=1800)
    if out.returncode != -9:
        raise SystemExit(f"preparing {cfg['recipe']} failed ({out.returncode}):\n{out.stderr[-3000:]}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=7, help="resumes per tree and recipe (alternating trees)")
    ap.add_argument("--before", default="534ba40", help="the git revision to compare against")
    ap.add_argument("--recipes", default="digits,codelm")
    ap.add_argument("--json", type=Path, help="write the figures here")
    args = ap.parse_args()

    rows = []
    with tempfile.TemporaryDirectory(prefix="thrifty-bench-startup-") as d:
        tmp = Path(d)
        (tmp / "home").mkdir()
        (tmp / "tmp").mkdir()
        trees = {"before": export_tree(args.before, tmp / "before"), "after": REPO}
        for recipe in args.recipes.split(","):
            cfg = config(recipe, tmp / "store")
            prepare(cfg, REPO, tmp)
            for tree in trees.values():
                first_step(cfg, tree, tmp)  # warm the page cache for both: the rounds compare code, not the disk
            got: dict[str, list[tuple[float, float, str]]] = {name: [] for name in trees}
            for r in range(args.rounds):
                for name in (list(trees) if r % 2 == 0 else list(reversed(trees))):
                    got[name].append(first_step(cfg, trees[name], tmp))
            row = {"recipe": recipe, "rounds": args.rounds}
            for name, runs in got.items():
                row[f"{name}_wall_s"] = round(statistics.median(w for w, _, _ in runs), 3)
                row[f"{name}_cpu_s"] = round(statistics.median(c for _, c, _ in runs), 3)
                row[f"{name}_loaded"] = runs[-1][2]
            row["wall_ratio"] = round(row["before_wall_s"] / row["after_wall_s"], 2)
            row["cpu_ratio"] = round(row["before_cpu_s"] / row["after_cpu_s"], 2)
            rows.append(row)
            print(f"{recipe:7s} to the first step on resume: before {row['before_wall_s']:.2f} s wall "
                  f"({row['before_cpu_s']:.2f} s CPU), after {row['after_wall_s']:.2f} s wall "
                  f"({row['after_cpu_s']:.2f} s CPU): {row['wall_ratio']:.2f}x wall, {row['cpu_ratio']:.2f}x CPU "
                  f"(medians of {args.rounds}, alternating)", flush=True)
            for name in trees:
                print(f"        {name:6s} loaded: {row[f'{name}_loaded'] or 'none of ' + ', '.join(UNNEEDED)}")
    print(f"load average now: {os.getloadavg()[0]:.1f} ({os.cpu_count()} CPUs)")
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
