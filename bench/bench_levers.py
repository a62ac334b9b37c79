"""The in-loop levers, each against off, in one run: compile, activation checkpointing, utilisation sampling and
profiling (issue 24), and the loop's own bookkeeping against a raw torch loop. Runs the four benches one after
another on the same machine, each of which times its arms interleaved (ABAB) so the machine's drift falls on every
arm alike, and prints one table of ratios to off.
Runs unchanged on a GPU (``--device cuda`` reaches the benches that take it; sampling and profiling measure the
device they find).

    python bench/bench_levers.py [--device cpu|cuda] [--quick]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

BENCH = Path(__file__).resolve().parent


def run(args: list[str]) -> str:
    done = subprocess.run([sys.executable, *args], cwd=BENCH.parent, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise SystemExit(f"{args[0]} failed ({done.returncode}):\n{done.stderr[-3000:]}")
    return done.stdout


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    ap.add_argument("--quick", action="store_true", help="fewer steps and rounds (a smoke run of the bench)")
    args = ap.parse_args()
    rows: list[tuple[str, str, str, str]] = []  # lever, workload, step time x off, memory x off

    compile_args = [str(BENCH / "bench_levers_compile.py"), "--device", args.device, "--json"]
    if args.quick:
        compile_args += ["--steps", "3", "--rounds", "2", "--recipes", "digits"]
    for line in run(compile_args).splitlines():
        if line.startswith("{"):
            r = json.loads(line)
            rows.append(("compile on (after compiling)", r["recipe"], f"{r['compiled_step_s'] / r['eager_step_s']:.3f}",
                         f"- (compile {r['compile_s']:.1f} s once)"))

    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "memory.json"
        memory_args = [str(BENCH / "bench_levers_memory.py"), "--device", args.device, "--json", str(out)]
        if args.quick:
            memory_args += ["--steps", "3", "--layers", "2"]
        run(memory_args)
        for r in json.loads(out.read_text())["rows"][1:]:
            rows.append((f"activation checkpointing {r['mode']}", "codelm", f"{r['compute_ratio']:.3f}",
                         f"{r['memory_ratio']:.3f} ({r['batch_multiplier']:.1f}x the micro-batch)"))
        out = Path(tmp) / "measure.json"
        run([str(BENCH / "bench_levers_measure.py"), "--rounds", "2" if args.quick else "5", "--json", str(out)])
        for recipe, arms in json.loads(out.read_text()).items():
            for arm, r in arms.items():
                if isinstance(r, dict) and "step_ratio" in r and arm != "off":
                    rows.append((f"{arm} (telemetry)", recipe, f"{r['step_ratio']:.3f}", f"- (run CPU x{r['cpu_ratio']:.3f})"))

    loop_args = [str(BENCH / "bench_loop_overhead.py"), "--device", args.device, "--json"]
    if args.quick:
        loop_args += ["--rounds", "2", "--short", "100", "--long", "600"]
    r = json.loads(run(loop_args).splitlines()[-1])
    rows.append(("the loop's own bookkeeping (vs raw)", "digits", f"{1 + r['overhead_share']:.3f}",
                 f"- ({r['overhead_us']:.1f} us a step; goal <= 1.050)"))

    print(f"\n{'lever':<36} {'workload':<9} {'step time x off':>16}  memory x off")
    for lever, workload, time_ratio, memory_ratio in rows:
        print(f"{lever:<36} {workload:<9} {time_ratio:>16}  {memory_ratio}")


if __name__ == "__main__":
    main()
