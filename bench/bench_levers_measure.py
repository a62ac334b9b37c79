"""What measuring costs: utilisation sampling and the profiler's cost map, side by side in one run.

Arms, on digits (an MLP) and codelm (a small GPT), on CPU, interleaved round after round in a rotating order:

- ``off``: ``utilisation_every_s: null``, ``profile_steps: 0`` (the baseline);
- ``sample``: sampling at the default (every 2 s) and ``sample-fast`` (every 0.05 s, 40x the default rate);
- ``profile``: ``profile_steps: 5`` (torch.profiler over 5 steps once per epoch).

The profiler's one-time start-up in a process (kineto, ~1 s) is measured once and kept out of the ratios.
The measure is the loop's own step time (from the metric lines' ``samples_per_s``, median over the windows) and the
wall time and the process's CPU time (every thread: the sampler's included) of the whole run; a ratio is the
arm's over ``off``'s (1.000 = no cost). On a shared machine the CPU ratio is the steadier one. Then the bookkeeping itself,
timed directly: one ``Telemetry.window`` call (once per metric line) and one ``sample`` (on the sampler thread),
as a share of a step. The goal: sampling and bookkeeping under 0.5 % of step time; profiling off costs nothing
(it builds no profiler: tests/test_utilisation.py).

    python bench/bench_levers_measure.py              # ~3 min on a 2-core CPU
    python bench/bench_levers_measure.py --rounds 5 --json out.json
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
from typing import Any

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

import torch  # noqa: E402

from thrifty.config import build_config  # noqa: E402
from thrifty.runs import read_metrics  # noqa: E402
from thrifty.storage import open_store  # noqa: E402
from training.loop import train  # noqa: E402
from training.telemetry import Telemetry  # noqa: E402

ARMS: dict[str, dict[str, Any]] = {
    "off": {"utilisation_every_s": None, "profile_steps": 0},
    "sample": {"utilisation_every_s": 2.0, "profile_steps": 0},
    "sample-fast": {"utilisation_every_s": 0.05, "profile_steps": 0},
    "profile": {"utilisation_every_s": None, "profile_steps": 5},
}
RECIPES: dict[str, dict[str, Any]] = {
    "digits": {"recipe_params": {"hidden": 128}, "train": {"micro_batch": 32, "max_epochs": 20}},
    "codelm": {"recipe_params": {"max_bytes": 200_000, "vocab_size": 512, "seq_len": 64, "n_layer": 2,
                                 "n_head": 2, "n_embd": 64},
               "train": {"micro_batch": 16, "max_steps": 120, "max_epochs": 100}},
}


def run_arm(store: str, recipe: str, arm: str, i: int) -> dict[str, float]:
    spec = RECIPES[recipe]
    name = f"{recipe}-{arm}-{i}"
    cfg = build_config({"run_name": name, "recipe": recipe, "store": store, "recipe_params": spec["recipe_params"],
                        "train": {"precision": "fp32", "device": "cpu", "checkpoint_every": 10**6, "log_every": 5,
                                  "eval_every": 10**6, "early_stopping": {"enabled": False}, **spec["train"],
                                  **ARMS[arm]}})
    t0, c0 = time.perf_counter(), time.process_time()
    train(cfg)
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    lines = [m for m in read_metrics(open_store(store), name) if m.get("event") is None and "samples_per_s" in m]
    try:
        windows = json.loads(open_store(store).get_bytes(f"runs/{name}/profile.json"))["windows"]
    except Exception:  # noqa: BLE001 - not profiled
        windows = 0
    # samples_per_s has the finer grain: step_time_s is rounded to 10 us, 2 % of a digits step
    batch = spec["train"]["micro_batch"]
    return {"step_s": statistics.median(batch / m["samples_per_s"] for m in lines), "wall_s": wall, "cpu_s": cpu,
            "windows": windows}


def bookkeeping(step_s: float, log_every: int = 10, every_s: float = 2.0, calls: int = 20_000) -> dict[str, float]:
    """The telemetry's own cost, timed directly: a window per metric line, a sample per ``every_s`` (NVML absent
    here: a sample is the CPU clock and the lock)."""
    t = Telemetry(every_s, read_gpu=lambda: {})
    t0 = time.perf_counter()
    for _ in range(calls):
        t.window(log_every, log_every * step_s, 0.01 * step_s, 0.0)
    window_s = (time.perf_counter() - t0) / calls
    t0 = time.perf_counter()
    for _ in range(calls):
        t.sample()
    sample_s = (time.perf_counter() - t0) / calls
    # per step: its share of one window; the sampler thread's work per second of steps
    share = window_s / log_every / step_s + sample_s / every_s
    return {"window_us": window_s * 1e6, "sample_us": sample_s * 1e6, "share_of_step": share}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    torch.set_num_threads(1)
    logging.disable(logging.WARNING)
    store = tempfile.mkdtemp(prefix="bench-levers-")
    out: dict[str, Any] = {}
    for recipe in RECIPES:
        run_arm(store, recipe, "off", -1)  # warm: the preprocessing cache, torch's first-call costs
        first = run_arm(store, recipe, "profile", -1)["cpu_s"] - run_arm(store, recipe, "profile", -2)["cpu_s"]
        got: dict[str, list[dict[str, float]]] = {a: [] for a in ARMS}
        arms = list(ARMS)
        for r in range(args.rounds):
            for arm in arms[r % len(arms):] + arms[:r % len(arms)]:  # rotating order: drift hits every arm alike
                got[arm].append(run_arm(store, recipe, arm, r))
        base_step = statistics.median(x["step_s"] for x in got["off"])
        base_wall = statistics.median(x["wall_s"] for x in got["off"])
        base_cpu = statistics.median(x["cpu_s"] for x in got["off"])
        print(f"\n{recipe}: the process's first profiler costs {first:.2f} s once (kineto's start-up; not in the "
              "ratios below)")
        print(f"{recipe}: median step {base_step * 1e3:.3f} ms, run {base_wall:.2f} s with everything off "
              f"({args.rounds} rounds)")
        print(f"{'arm':<12} {'step ms':>9} {'step ratio':>11} {'wall s':>8} {'wall ratio':>11} {'CPU s':>7} "
              f"{'CPU ratio':>10}")
        out[recipe] = {}
        for arm in ARMS:
            step = statistics.median(x["step_s"] for x in got[arm])
            wall = statistics.median(x["wall_s"] for x in got[arm])
            cpu = statistics.median(x["cpu_s"] for x in got[arm])
            out[recipe][arm] = {"step_s": step, "wall_s": wall, "cpu_s": cpu, "step_ratio": step / base_step,
                                "wall_ratio": wall / base_wall, "cpu_ratio": cpu / base_cpu}
            print(f"{arm:<12} {step * 1e3:>9.3f} {step / base_step:>11.3f} {wall:>8.2f} {wall / base_wall:>11.3f} "
                  f"{cpu:>7.2f} {cpu / base_cpu:>10.3f}")
        prof = got["profile"]
        per_window = statistics.median((x["cpu_s"] - base_cpu) / max(x["windows"], 1) for x in prof)
        out[recipe]["profile_window_s"] = per_window
        print(f"profile: {prof[0]['windows']} window(s) a run, {per_window * 1e3:.0f} ms each (5 steps recorded, then the "
              "trace parsed and summed by operator)")
        cost = bookkeeping(base_step)
        out[recipe]["bookkeeping"] = cost
        print(f"bookkeeping: window {cost['window_us']:.2f} us per metric line, sample {cost['sample_us']:.2f} us "
              f"every 2 s: {cost['share_of_step']:.4%} of step time (goal < 0.5 %)")
    if args.json:
        args.json.write_text(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
