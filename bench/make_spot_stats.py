"""Regenerate ``thrifty/data/spot_stats.json`` (the spot preemption statistics Thrifty ships) from a ``summary.csv``.

The statistics were derived from skypilot-org/spot-traces (commit 221da1ab9bdfe7966da296265d7694d52dc0c5a6; the
traces of Wu et al., "Can't Be Late", NSDI '24). The repository has no license, so no raw trace is shipped: only
numbers computed from it, one row per trace (cloud, zone, instance, hours observed, preemptions, mean time between
preemptions, run-length quantiles). The product reads the JSON this writes, never the CSV.

    python bench/make_spot_stats.py PATH/TO/spot-traces/summary.csv   # writes thrifty/data/spot_stats.json
"""

from __future__ import annotations

import argparse
import csv
import json
import re
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
OUT = REPO / "thrifty" / "data" / "spot_stats.json"
SOURCE = {
    "repository": "https://github.com/skypilot-org/spot-traces",
    "commit": "221da1ab9bdfe7966da296265d7694d52dc0c5a6",
    "paper": "Wu et al., Can't Be Late: Optimizing Spot Instance Savings under Deadlines, NSDI '24",
    "license": "none upstream: derived statistics only, no raw trace",
    "derived_by": "bench/make_spot_stats.py from the traces' summary.csv",
    "definitions": "M_hours = alive hours / preemption events (exponential MLE); up_p50_h, up_p90_h: quantiles of "
                   "alive-run lengths; out_p50_h, out_p90_h: quantiles of outage lengths (capacity gone, then back); kind 'preemption' = a real instance kept alive, 'availability' = launch probes "
                   "(a proxy); N-node rows count a gang as alive only when all N are",
}


def instances(label: str) -> tuple[list[str], int]:
    """'p2.xlarge/p2.2xlarge (1xK80)' -> (['p2.xlarge', 'p2.2xlarge'], 1); '16 x p3.2xlarge' -> (['p3.2xlarge'], 16)."""
    nodes = 1
    m = re.match(r"(\d+) x (.+)", label)
    if m:
        nodes, label = int(m.group(1)), m.group(2)
    return label.split(" (")[0].split("/"), nodes


def num(v: str) -> float | None:
    return round(float(v), 4) if v not in ("", None) else None


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("summary_csv", help="the spot-traces summary.csv")
    ap.add_argument("--out", default=str(OUT), help=f"where to write (default {OUT.relative_to(REPO)})")
    args = ap.parse_args(argv)
    rows = []
    with open(args.summary_csv, newline="") as f:
        for r in csv.DictReader(f):
            names, nodes = instances(r["instance"])
            rows.append({
                "cloud": r["cloud"].lower(), "zone": r["zone"], "instances": names, "nodes": nodes,
                "kind": r["kind"], "dataset": r["dataset"], "hours": num(r["hours"]),
                "alive_hours": round(float(r["hours"]) * float(r["avail_frac"]), 4),
                "preemptions": int(r["preemptions"]), "M_hours": num(r["M_hours"]),
                "up_p50_h": num(r["up_p50_h"]), "up_p90_h": num(r["up_p90_h"]),
                "mean_outage_hours": num(r["mean_outage_hours"]),
                "out_p50_h": num(r["out_p50_h"]), "out_p90_h": num(r["out_p90_h"]),
            })
    body = ",\n  ".join(json.dumps(r) for r in rows)  # a row a line: reviewable diffs
    Path(args.out).write_text(f'{{"source": {json.dumps(SOURCE, indent=2)},\n "rows": [\n  {body}\n ]}}\n')
    print(f"wrote {len(rows)} rows to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
