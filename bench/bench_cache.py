"""Preprocessing cache: cold (preprocess and write shards) against warm (a manifest read), codelm, side by side.

Each round preprocesses into a fresh store (cold) and then asks the same store again (warm),
through the same ``ensure_shards`` the Prefect task calls. The result is the ratio of medians.
Goal: warm >= 20x faster than cold.

    python bench/bench_cache.py             # ~1 min on a 2-core CPU
    python bench/bench_cache.py --rounds 5
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from thrifty.storage import FileStore  # noqa: E402
from training.data import ensure_shards  # noqa: E402
from training.recipes.base import resolve_recipe  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--recipe", default="codelm")
    args = parser.parse_args()
    recipe = resolve_recipe(args.recipe)
    params = recipe.parse_params({})
    cold, warm = [], []
    for _ in range(args.rounds):
        root = Path(tempfile.mkdtemp(prefix="thrifty-bench-cache-"))
        try:
            store = FileStore(root)
            t0 = time.perf_counter()
            first = ensure_shards(store, recipe, params)
            cold.append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            second = ensure_shards(store, recipe, params)
            warm.append(time.perf_counter() - t0)
            assert not first.hit and second.hit and first.key == second.key
        finally:
            shutil.rmtree(root, ignore_errors=True)
    c, w = statistics.median(cold), statistics.median(warm)
    print(f"recipe {args.recipe}, {args.rounds} rounds")
    print(f"cold (preprocess + write shards): median {c:.3f} s  {[round(x, 3) for x in cold]}")
    print(f"warm (cache key + manifest read): median {w:.4f} s  {[round(x, 4) for x in warm]}")
    print(f"warm is {c / w:.0f}x faster (goal >= 20x): {'PASS' if c / w >= 20 else 'FAIL'}")
    return 0 if c / w >= 20 else 1


if __name__ == "__main__":
    sys.exit(main())
