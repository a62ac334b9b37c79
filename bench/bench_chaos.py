"""Chaos at scale: tests/test_chaos.py with many more kills, on a file store and on S3 (moto), with its tally.

Each store's run is killed ``--kills`` times at random (kill -9 at a step, inside a checkpoint's
data, between data and commit, after a commit, from outside) and SIGTERMed twice; it must end
bit-identical to a run never killed, redo at most one checkpoint interval per kill and nothing on
SIGTERM, and leave nothing behind. Prints the kills tried, those inside writes, and the worst redo.

    python bench/bench_chaos.py --kills 60      # ~15 min on a 2-core CPU
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kills", type=int, default=60, help="kills per store (plus two SIGTERMs)")
    args = parser.parse_args()
    env = {**os.environ, "THRIFTY_CHAOS_KILLS": str(args.kills)}
    cmd = [sys.executable, "-m", "pytest", "-q", "-s", "-p", "no:cacheprovider", "-o", "timeout=7200",
           "tests/test_chaos.py"]
    proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True)
    lines = [line for line in proc.stdout.splitlines() if line.startswith("chaos on") or "passed" in line
             or "failed" in line]
    print("\n".join(lines) if proc.returncode == 0 else proc.stdout[-5000:] + proc.stderr[-2000:])
    return proc.returncode


if __name__ == "__main__":
    sys.exit(main())
