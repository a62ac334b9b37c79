"""What the deadline policies cost, side by side: the paper's ML setting over synthetic availability traces.

Wu et al., "Can't Be Late" (NSDI '24): 48 h of work on p3.2xlarge, deadlines 53.3 h and 64 h (job fractions 0.9 and
0.75), a 0.2 h changeover. One synthetic trace per shipped p3.2xlarge zone (generated from the zone's run-length
statistics: no raw trace is shipped), the same start points for every policy. Prints each policy's mean cost and its
ratio to on-demand and to greedy, deadlines met, spot's share; both as the watch loop sees the spot market (an
on-demand job learns that spot is back by going there) and as the paper assumes (it sees it).

    python bench/bench_deadline.py [--starts 300] [--trace-hours 2000] [--seed 0] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from thrifty.money.pricing import find_instance  # noqa: E402
from thrifty.spot.deadline import POLICIES, Margins  # noqa: E402
from thrifty.spot.deadline_sim import DeadlineJob, run_study  # noqa: E402
from thrifty.spot.traces import synthetic_trace, zone_rows  # noqa: E402

H = 3600.0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--starts", type=int, default=300)
    ap.add_argument("--trace-hours", type=float, default=2000.0)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", help="also write the figures here")
    args = ap.parse_args(argv)
    row = find_instance("aws", "p3.2xlarge")
    rows = zone_rows("aws", "p3.2xlarge")
    traces = [synthetic_trace(r, args.trace_hours, seed=args.seed + i) for i, r in enumerate(rows)]
    print(f"{len(traces)} synthetic traces ({', '.join(f'{r.zone}/{r.dataset}' for r in rows)}), "
          f"{args.starts} starts each; p3.2xlarge spot ${row.spot_usd_per_hour}/h, on-demand "
          f"${row.on_demand_usd_per_hour}/h\n")
    print(f"{'deadline':>9} {'spot seen':>9} {'policy':<17} {'mean $':>8} {'/ o-d':>6} {'/ greedy':>8} {'met':>6} "
          f"{'spot':>5}")
    out = []
    t0 = time.perf_counter()
    for deadline_h in (53.3, 64.0):
        job = DeadlineJob(48 * H, deadline_h * H, 0.2 * H, row.spot_usd_per_hour, row.on_demand_usd_per_hour,
                          Margins.default(0.2 * H))
        for visible in (False, True):
            study = run_study(job, traces, list(POLICIES), args.starts, spot_visible=visible)
            greedy = study.pooled("greedy")["usd"]
            for policy in POLICIES:
                s = study.pooled(policy)
                out.append({"deadline_h": deadline_h, "spot_visible": visible, "policy": policy, **s,
                            "vs_on_demand": s["usd"] / job.on_demand_usd, "vs_greedy": s["usd"] / greedy})
                print(f"{deadline_h:>9g} {'yes' if visible else 'no':>9} {policy:<17} {s['usd']:>8.2f} "
                      f"{s['usd'] / job.on_demand_usd:>6.3f} {s['usd'] / greedy:>8.3f} {s['met']:>6.1%} "
                      f"{s['spot_share']:>5.0%}")
    print(f"\n{time.perf_counter() - t0:.1f} s")
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
