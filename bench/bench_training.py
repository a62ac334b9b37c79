"""Training-loop overheads on codelm, measured side by side in one process.

1. Checkpoint overhead at ``checkpoint_every: auto`` (Young/Daly): the summary's
   ``checkpoint_time_fraction``, and wall time against the same run with checkpointing
   effectively off (``checkpoint_every`` = 10**9: one save at the end). Goal: < 2 %.
2. Data wait at steady state: the loop's ``data_wait_s`` over ``step_time_s`` from the
   metrics JSON lines, first ``--skip-steps`` left out; also the summary's
   ``data_wait_fraction`` (over the whole wall time). Goal: < 5 %.

Runs alternate auto/off in ABBA order so slow drift of a shared machine cancels; only
ratios are reported as results, absolute seconds are context. ``auto`` plans the interval
from the measured save time and ``train.mean_time_between_preemptions_s``; the default here
is 600 s (not the 7200 s default) so that a run of under a minute writes several checkpoints.

    python bench/bench_training.py                 # ~2.5 min on a 2-core CPU
    python bench/bench_training.py --json out.json # also write the figures as JSON
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

import torch  # noqa: E402

from thrifty.config import RunConfig  # noqa: E402
from thrifty.storage import open_store  # noqa: E402
from training.data import ensure_shards  # noqa: E402
from training.loop import train  # noqa: E402
from training.recipes.base import resolve_recipe  # noqa: E402

RECIPE_PARAMS: dict[str, Any] = {}  # codelm's defaults: 3 blocks x 128 wide, 4 heads, 128 tokens, 2048-token BPE
CHECKPOINT_GOAL = 0.02
DATA_WAIT_GOAL = 0.05
OFF = 10**9  # checkpoint_every for "off": only the final save happens


def run_config(store: str, name: str, every: int | str, args: argparse.Namespace) -> RunConfig:
    return RunConfig(
        run_name=name,
        recipe="codelm",
        recipe_params=RECIPE_PARAMS,
        store=store,
        train={
            "max_steps": args.steps,
            "micro_batch": args.micro_batch,
            "lr": 3e-3,
            "warmup_steps": 20,
            "precision": args.precision,
            "device": args.device,
            "checkpoint_every": every,
            "mean_time_between_preemptions_s": args.mtbp,
            "eval_every": args.steps,  # one validation, at the end: the same work in both arms
            "log_every": 10,
            "early_stopping": {"enabled": False},
        },
    )


def parse_metrics(store_root: Path, run_id: str, skip_steps: int) -> dict[str, Any]:
    """From the run's metric lines: steady-state data wait / step time, total step time, eval time, auto plans."""
    wait = step = total_step_s = eval_s = 0.0
    plans, prev_step, prev_time = [], 0, None
    for path in sorted((store_root / "runs" / run_id / "metrics").glob("*.jsonl")):
        for line in path.read_text().splitlines():
            rec = json.loads(line)
            if rec.get("event") == "eval" and prev_time is not None:
                eval_s += rec["time_unix"] - prev_time  # the line before an eval is written just before it starts
            if rec.get("event") == "checkpoint_interval":
                plans.append(rec["steps"])
            prev_time = rec["time_unix"]
            if "event" in rec or "step_time_s" not in rec:
                continue
            n = rec["step"] - prev_step  # a line averages over the steps since the previous line
            prev_step = rec["step"]
            total_step_s += rec["step_time_s"] * n
            if rec["step"] - n >= skip_steps:
                wait += rec["data_wait_s"] * n
                step += rec["step_time_s"] * n
    return {"data_wait_steady": wait / step if step else float("nan"), "step_time_sum_s": total_step_s,
            "eval_s": eval_s, "auto_interval_steps": plans[-1] if plans else None}


def one_run(store_root: Path, name: str, every: int | str, args: argparse.Namespace) -> dict[str, Any]:
    summary = train(run_config(str(store_root), name, every, args)).summary
    m = parse_metrics(store_root, name, args.skip_steps)
    wall = summary["wall_time_s"]
    return {
        "run": name,
        "checkpoint_every": every,
        "wall_s": wall,
        "steps": summary["steps"],
        "checkpoints": summary["checkpoints_written"],
        "checkpoint_time_fraction": summary["checkpoint_time_fraction"],
        "data_wait_fraction": summary["data_wait_fraction"],
        "data_wait_steady": round(m["data_wait_steady"], 6),
        "step_time_sum_s": round(m["step_time_sum_s"], 3),
        "eval_s": round(m["eval_s"], 3),
        # wall time in neither optimizer steps nor validation: start-up, checkpoints, logging
        "other_s": round(wall - m["step_time_sum_s"] - m["eval_s"], 3),
        "mean_step_s": round(m["step_time_sum_s"] / summary["steps"], 4),
        "auto_interval_steps": m["auto_interval_steps"],
        "val_loss": round(summary["final_metrics"]["val_loss"], 4),
        "unigram_entropy_nats": summary["unigram_entropy_nats"],
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=150, help="optimizer steps per run (default 150)")
    ap.add_argument("--micro-batch", type=int, default=16, help="windows of 129 tokens per step (default 16)")
    ap.add_argument("--threads", type=int, default=1,
                    help="torch threads (default 1: steadier on a shared machine; 0 = torch's default)")
    ap.add_argument("--device", choices=["cpu", "cuda"], default="cpu", help="where to train (default cpu)")
    ap.add_argument("--precision", choices=["fp32", "bf16", "fp16"], default="fp32",
                    help="autocast precision (default fp32; bf16 on a GPU)")
    ap.add_argument("--repeats", type=int, default=2, help="auto/off pairs, run ABBA (default 2)")
    ap.add_argument("--mtbp", type=float, default=600.0,
                    help="train.mean_time_between_preemptions_s for auto (default 600 s, so several saves happen)")
    ap.add_argument("--skip-steps", type=int, default=20, help="steps left out of the steady-state data wait")
    ap.add_argument("--store", help="store directory to use and keep (default: a temporary one, deleted)")
    ap.add_argument("--json", help="also write the figures to this JSON file")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    if args.threads > 0:
        torch.set_num_threads(args.threads)

    store_root = Path(args.store) if args.store else Path(tempfile.mkdtemp(prefix="thrifty-bench-"))
    try:
        recipe = resolve_recipe("codelm")
        params = recipe.parse_params(RECIPE_PARAMS)
        cache = ensure_shards(open_store(str(store_root)), recipe, params)  # once, outside every timed run
        hit = ensure_shards(open_store(str(store_root)), recipe, params)
        print(f"codelm preprocessing: {cache.seconds:.2f} s ({'hit' if cache.hit else 'miss'}), "
              f"cache hit after: {hit.seconds * 1000:.1f} ms; torch threads: {torch.get_num_threads()}, "
              f"cpus: {os.cpu_count()}; {args.steps} steps x {args.micro_batch} windows per run, "
              f"mtbp {args.mtbp:.0f} s; {args.device} {args.precision}"
              + (f" ({torch.cuda.get_device_name()})" if args.device == "cuda" else ""), flush=True)

        runs = []
        stamp = time.strftime("%H%M%S")
        for r in range(args.repeats):
            order = [("auto", "auto"), ("off", OFF)]
            if r % 2:
                order.reverse()  # ABBA
            for label, every in order:
                res = one_run(store_root, f"bench-{stamp}-{label}-{r}", every, args)
                res["arm"] = label
                runs.append(res)
                print(f"  {res['run']}: wall {res['wall_s']:.1f} s, {res['checkpoints']} checkpoints, "
                      f"step {res['mean_step_s'] * 1000:.0f} ms, eval {res['eval_s']:.1f} s, other {res['other_s']:.2f} s", flush=True)

        auto = [x for x in runs if x["arm"] == "auto"]
        off = [x for x in runs if x["arm"] == "off"]
        pair_ratios = [a["wall_s"] / o["wall_s"] for a, o in zip(auto, off)]
        wall_ratio = sum(a["wall_s"] for a in auto) / sum(o["wall_s"] for o in off)
        # optimizer steps exclude saves, so their speed should match between arms; when it does not, other load on
        # the machine moved, and the raw wall ratio measures that drift rather than checkpointing
        step_ratio = sum(a["step_time_sum_s"] for a in auto) / sum(o["step_time_sum_s"] for o in off)
        drift = abs(step_ratio - 1) > CHECKPOINT_GOAL / 2
        ckpt_frac = statistics.mean(a["checkpoint_time_fraction"] for a in auto)
        # auto's extra time outside steps and validation, over auto's wall: blind to step-speed drift
        extra_other = (statistics.mean(a["other_s"] for a in auto) - statistics.mean(o["other_s"] for o in off)) \
            / statistics.mean(a["wall_s"] for a in auto)
        wait_steady = max(x["data_wait_steady"] for x in runs)
        wait_summary = max(x["data_wait_fraction"] for x in runs)
        results = {
            "checkpoint_time_fraction_auto": round(ckpt_frac, 5),
            "wall_ratio_auto_over_off": round(wall_ratio, 4),
            "wall_ratio_per_pair": [round(x, 4) for x in pair_ratios],
            "step_time_ratio_auto_over_off": round(step_ratio, 4),
            "wall_ratio_disturbed_by_drift": drift,
            "extra_other_time_fraction": round(extra_other, 5),
            "checkpoints_auto": [a["checkpoints"] for a in auto],
            "checkpoints_off": [o["checkpoints"] for o in off],
            "auto_interval_steps": [a["auto_interval_steps"] for a in auto],
            "data_wait_steady_max": round(wait_steady, 6),
            "data_wait_fraction_summary_max": round(wait_summary, 6),
            "val_loss_mean": round(statistics.mean(x["val_loss"] for x in runs), 4),
            "unigram_entropy_nats": runs[0]["unigram_entropy_nats"],
        }

        rows = [
            ("checkpoint time / wall (auto, summary)", f"{ckpt_frac:.2%}", f"< {CHECKPOINT_GOAL:.0%}",
             ckpt_frac < CHECKPOINT_GOAL),
            ("wall auto / wall off (all pairs)", f"{wall_ratio:.4f}", f"< {1 + CHECKPOINT_GOAL:.2f}",
             "drift" if drift else wall_ratio < 1 + CHECKPOINT_GOAL),
            ("  per pair", ", ".join(f"{x:.4f}" for x in pair_ratios), "", None),
            ("  step time auto / off (1 = no drift)", f"{step_ratio:.4f}", "", None),
            ("time outside steps+eval, auto minus off", f"{extra_other:+.2%}", f"< {CHECKPOINT_GOAL:.0%}",
             extra_other < CHECKPOINT_GOAL),
            ("checkpoints written auto / off", f"{results['checkpoints_auto']} / {results['checkpoints_off']}", "", None),
            ("data wait / step time (steady, worst run)", f"{wait_steady:.3%}", f"< {DATA_WAIT_GOAL:.0%}",
             wait_steady < DATA_WAIT_GOAL),
            ("data wait / wall (summary, worst run)", f"{wait_summary:.3%}", f"< {DATA_WAIT_GOAL:.0%}",
             wait_summary < DATA_WAIT_GOAL),
            ("val loss vs unigram entropy (nats)", f"{results['val_loss_mean']:.3f} vs {results['unigram_entropy_nats']:.3f}",
             "below", results["val_loss_mean"] < results["unigram_entropy_nats"]),
        ]
        width = max(len(r[0]) for r in rows)
        print(f"\n{'measure':<{width}}  {'value':>22}  {'goal':>8}  ok")
        for name, value, goal, ok in rows:
            print(f"{name:<{width}}  {value:>22}  {goal:>8}  {'' if ok is None else ok if isinstance(ok, str) else ('yes' if ok else 'NO')}")

        if args.json:
            Path(args.json).write_text(json.dumps({"args": vars(args), "results": results, "runs": runs}, indent=2))
            print(f"\nwrote {args.json}")
        return 0
    finally:
        if not args.store:
            shutil.rmtree(store_root, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
