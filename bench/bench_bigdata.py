"""Data larger than memory: preprocess a synthetic set in chunks and train on it from a file store under a memory limit.

The set (float32 rows of the ``synthetic`` recipe) is made >= 10x the limit. The process first
trains a tiny run (so the code pages torch and the loop fault in are in the baseline, not
counted as data), then preprocesses the big set in chunks and trains a small MLP for
``--steps`` steps over it through the real loop, printing peak RSS growth against the limit,
preprocess MB/s and training samples/s. Side by side, the same optimizer steps are timed on
the big set's shards (read with preadv) and on an in-memory copy of a slice that fits, in
alternating rounds: the ratio is what reading from shards costs.

    python bench/bench_bigdata.py                      # 2 GiB vs a 192 MiB limit, ~3 min on a 2-core CPU
    python bench/bench_bigdata.py --gib 0.5 --limit-mib 48
"""

from __future__ import annotations

import argparse
import json
import resource
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

import numpy as np  # noqa: E402
import torch  # noqa: E402

import training.data as data  # noqa: E402
import training.shard_write as shard_write  # noqa: E402
from thrifty.config import build_config  # noqa: E402
from thrifty.storage import FileStore  # noqa: E402
from training.data import ShardedArray, Split, ensure_shards, epoch_permutation, load_split  # noqa: E402
from training.loop import train  # noqa: E402
from training.recipes import synthetic  # noqa: E402

MIB = 2**20
RECIPE = "training.recipes.synthetic:recipe"


def peak_rss_bytes() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux reports KiB


def config(run: str, store: str, params: dict, steps: int, batch: int) -> object:
    return build_config({"run_name": run, "store": store, "recipe": RECIPE, "recipe_params": params,
                         "train": {"max_epochs": 1, "max_steps": steps, "micro_batch": batch, "precision": "fp32",
                                   "checkpoint_every": 1000000, "early_stopping": {"enabled": False},
                                   "log_every": 100, "lr": 0.003}})


def timed_steps(split: Split, steps: int, batch: int, features: int, seed: int) -> tuple[float, float]:
    """(samples/s of whole optimizer steps, seconds per batch gather) over ``split`` in epoch order."""
    torch.manual_seed(seed)
    params = synthetic.SyntheticParams(features=features)
    model = synthetic.build_model(params, {"features": features, "classes": params.classes})
    opt = torch.optim.AdamW(model.parameters(), lr=0.003)
    perm = epoch_permutation(split.n, seed, 0)
    gather = 0.0
    t0 = time.perf_counter()
    for i in range(steps):
        tg = time.perf_counter()
        b = split.batch(perm[i * batch : (i + 1) * batch], torch.device("cpu"))
        gather += time.perf_counter() - tg
        opt.zero_grad(set_to_none=True)
        synthetic.step(model, b).loss.backward()
        opt.step()
    return steps * batch / (time.perf_counter() - t0), gather / steps


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gib", type=float, default=2.0, help="training set size (GiB of float32 rows)")
    ap.add_argument("--limit-mib", type=float, default=192, help="the memory limit: peak RSS growth must stay under")
    ap.add_argument("--features", type=int, default=256, help="float32 features per row")
    ap.add_argument("--chunk-mib", type=float, default=16, help="rows per chunk preprocess yields (MiB)")
    ap.add_argument("--shard-mib", type=float, default=32, help="SHARD_BYTES (MiB)")
    ap.add_argument("--resident-mib", type=float, default=32, help="RESIDENT_BYTES: arrays up to this are mapped, larger ones read with preadv (MiB)")
    ap.add_argument("--steps", type=int, default=2000, help="optimizer steps of the training run")
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--compare-steps", type=int, default=300, help="steps per side-by-side round")
    ap.add_argument("--store", help="keep the store here (default: a temp dir, deleted)")
    ap.add_argument("--json", help="write the figures here")
    args = ap.parse_args()
    torch.set_num_threads(1)
    row_bytes = 4 * args.features
    rows = int(args.gib * 2**30) // row_bytes
    val_rows = max(args.batch, rows // 100)
    params = {"rows": rows, "val_rows": val_rows, "features": args.features,
              "chunk_rows": max(1, int(args.chunk_mib * MIB) // row_bytes)}
    data_bytes = (rows + val_rows) * row_bytes
    limit = int(args.limit_mib * MIB)
    shard_write.SHARD_BYTES = int(args.shard_mib * MIB)
    data.RESIDENT_BYTES = int(args.resident_mib * MIB)
    root = Path(args.store) if args.store else Path(tempfile.mkdtemp(prefix="thrifty-bench-bigdata-"))
    try:
        # warm-up: code pages, allocator pools and the loop's first-use costs land in the baseline
        train(config("warm", str(root / "warm"), {**params, "rows": 4096, "val_rows": 1024, "chunk_rows": 1024},
                     50, args.batch))
        base = peak_rss_bytes()
        store = FileStore(root / "store")
        recipe = synthetic.recipe()
        t0 = time.perf_counter()
        cache = ensure_shards(store, recipe, recipe.parse_params(params))
        pre_s = time.perf_counter() - t0
        pre_growth = peak_rss_bytes() - base
        written = sum(s["bytes"] for arrays in cache.manifest["splits"].values() for spec in arrays.values()
                      for s in spec["shards"])
        result = train(config("big", str(root / "store"), params, args.steps, args.batch))
        growth = peak_rss_bytes() - base
        s = result.summary
        loop_sps = s.steps * args.batch / s.wall_time_s

        # side by side: the big set's shards against an in-memory copy of a slice, the same steps, alternating
        big = load_split(store, cache.manifest, "train")
        n_slice = min(rows, max(args.batch * args.compare_steps, limit // 4 // row_bytes))
        mem = Split({name: ShardedArray([np.array(arr.take(np.arange(n_slice)))]) for name, arr in big.arrays.items()})
        n = args.compare_steps
        timed_steps(mem, min(n, 50), args.batch, args.features, 0)  # warm
        rounds = {"shards": [], "memory": []}
        for r in range(4):
            for name in (("shards", "memory") if r % 2 == 0 else ("memory", "shards")):
                split = big if name == "shards" else mem
                rounds[name].append(timed_steps(split, min(n, split.n // args.batch), args.batch, args.features, r))
        sps = {k: statistics.median(v[0] for v in vs) for k, vs in rounds.items()}
        gather_ms = {k: 1000 * statistics.median(v[1] for v in vs) for k, vs in rounds.items()}
        figures = {
            "data_bytes": data_bytes, "limit_bytes": limit, "data_over_limit": data_bytes / limit,
            "shards_train_x": len(cache.manifest["splits"]["train"]["x"]["shards"]),
            "baseline_rss_bytes": base, "peak_rss_growth_preprocess_bytes": pre_growth,
            "peak_rss_growth_bytes": growth, "preprocess_s": pre_s, "preprocess_mb_s": written / MIB / pre_s,
            "train_steps": s.steps, "train_samples_s": loop_sps, "data_wait_fraction": s.data_wait_fraction,
            "val_accuracy": s.final_metrics.get("val_accuracy"),
            "steps_samples_s_shards": sps["shards"], "steps_samples_s_memory": sps["memory"],
            "gather_ms_shards": gather_ms["shards"], "gather_ms_memory": gather_ms["memory"],
            "slice_rows": n_slice,
        }
    finally:
        if not args.store:
            shutil.rmtree(root, ignore_errors=True)
    ok = growth < limit and data_bytes >= 10 * limit
    print(f"data set: {data_bytes / MIB:.0f} MiB ({rows} train + {val_rows} val rows of {row_bytes} B) in "
          f"{figures['shards_train_x']} shards of {args.shard_mib:g} MiB; limit {args.limit_mib:g} MiB "
          f"({figures['data_over_limit']:.1f}x smaller)")
    print(f"baseline RSS after warm-up: {base / MIB:.0f} MiB")
    print(f"preprocess: {pre_s:.1f} s, {figures['preprocess_mb_s']:.0f} MB/s written, peak RSS growth "
          f"{pre_growth / MIB:.1f} MiB")
    print(f"train ({s.steps} steps x {args.batch}, real loop): {loop_sps:.0f} samples/s, data wait "
          f"{s.data_wait_fraction:.1%}, val_accuracy {figures['val_accuracy']:.3f}")
    print(f"peak RSS growth, preprocess + train: {growth / MIB:.1f} MiB against the {args.limit_mib:g} MiB limit: "
          f"{'PASS' if ok else 'FAIL'}")
    print(f"same steps side by side (median of 4 rounds): shards {sps['shards']:.0f} samples/s "
          f"(gather {gather_ms['shards']:.2f} ms/batch), in-memory slice of {n_slice} rows {sps['memory']:.0f} "
          f"samples/s (gather {gather_ms['memory']:.2f} ms/batch): ratio {sps['shards'] / sps['memory']:.2f}")
    if args.json:
        Path(args.json).write_text(json.dumps(figures, indent=1))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
