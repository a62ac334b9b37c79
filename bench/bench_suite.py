"""Where the test suite's time goes: its wall time, how busy the cores were minute by minute, and its CPU seconds by
the kind of process that spent them (pytest's workers, training jobs, Prefect flow-run processes, servers, the
browser) and by test file.

    python bench/bench_suite.py [--json out.json] [-- PYTEST_ARGS...]

Runs the suite as `make test` does (the same pytest arguments unless others follow ``--``) and, beside it, reads
/proc every quarter second: the machine's CPU counters, and each process's command line, the test it was started
under (PYTEST_CURRENT_TEST in its environment) and its CPU seconds so far. A process is counted at its last reading,
so one that lives under a quarter second, or its last quarter second, is missed or short: the totals are a floor.
Linux only; run it on an otherwise idle machine.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import threading
import time
from collections import defaultdict
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from thrifty.procs import stat_fields  # noqa: E402
TICK_S = 0.25
CLK = os.sysconf("SC_CLK_TCK")

# (kind, what its command line contains), first match wins
KINDS = [
    ("pytest worker", "exec(eval(sys.stdin.readline()))"),
    ("pytest", "-m pytest"),
    ("training job (python -m training)", "-m training"),
    ("Prefect flow-run process", "prefect.runner._workspace"),
    ("Prefect flow-run process", "prefect/runner/_workspace"),
    ("Prefect flow-run process", "prefect.engine"),
    ("Prefect test server", "uvicorn --app-dir"),
    ("Prefect server", "server start"),
    ("Prefect worker", "worker start"),
    ("prefect/thrifty CLI", "bin/prefect "),
    ("prefect/thrifty CLI", "prefect/__main__.py"),
    ("prefect/thrifty CLI", "bin/thrifty "),
    ("prefect/thrifty CLI", "-m thrifty.cli"),
    ("torchrun", "torch.distributed.run"),
    ("MLflow server", "mlflow"),
    ("MLflow server", "huey"),
    ("chromium", "chromium"),
    ("PostgreSQL", "postgres"),
    ("object-store stand-ins", "moto"),
    ("object-store stand-ins", "gcp-storage-emulator"),
    ("object-store stand-ins", "azurite"),
    ("other Python (scripts the tests run)", "python"),
]


def make_test_args() -> list[str]:
    """pytest's arguments in the Makefile's `test` target, so this runs what `make test` runs."""
    for line in (REPO / "Makefile").read_text().splitlines():
        if line.startswith("\t$(BIN)/python -m pytest"):
            return line.split("-m pytest", 1)[1].split()
    raise SystemExit("no `$(BIN)/python -m pytest` line in the Makefile's test target")


def kind_of(cmdline: str) -> str:
    return next((kind for kind, needle in KINDS if needle in cmdline), "other")


class Sampler(threading.Thread):
    def __init__(self) -> None:
        super().__init__(daemon=True)
        self.stop = threading.Event()
        self.procs: dict[tuple[int, str], dict] = {}  # (pid, start time) -> cmdline, test, cpu
        self.cpu_ticks: list[tuple[float, int, int]] = []  # (time, busy ticks, all ticks), the machine's

    def run(self) -> None:
        while not self.stop.is_set():
            self.read()
            self.stop.wait(TICK_S)
        self.read()

    def read(self) -> None:
        with open("/proc/stat") as f:
            ticks = [int(x) for x in f.readline().split()[1:9]]
        self.cpu_ticks.append((time.time(), sum(ticks) - ticks[3] - ticks[4], sum(ticks)))
        for entry in os.scandir("/proc"):
            if not entry.name.isdigit():
                continue
            fields = stat_fields(int(entry.name))
            if len(fields) <= 19:
                continue  # gone
            key = (int(entry.name), fields[19])
            proc = self.procs.get(key)
            if proc is None or proc["reads"] < 4:  # read again in its first second: a fork shows its parent's until exec
                try:
                    with open(f"/proc/{entry.name}/cmdline", "rb") as f:
                        cmdline = f.read().replace(b"\0", b" ").decode(errors="replace").strip()
                    with open(f"/proc/{entry.name}/environ", "rb") as f:
                        env = f.read().split(b"\0")
                except OSError:
                    continue
                if proc is not None and not cmdline:  # a zombie's is empty: keep what it ran
                    cmdline, env = proc["cmdline"], []
                test = next((e[20:].decode(errors="replace") for e in env if e.startswith(b"PYTEST_CURRENT_TEST=")), "")
                test = test.split("::")[0] or (proc["test"] if proc else "")
                proc = self.procs[key] = {"cmdline": cmdline, "test": test, "cpu": 0.0,
                                          "reads": proc["reads"] if proc else 0}
            proc["reads"] += 1
            proc["cpu"] = (int(fields[11]) + int(fields[12])) / CLK  # utime + stime


def main() -> int:
    if not Path("/proc/stat").exists():
        print("bench_suite reads /proc: Linux only", file=sys.stderr)
        return 2
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--json", type=Path, help="write the figures here too")
    ap.add_argument("pytest_args", nargs="*", help="after --: pytest's arguments (default: the Makefile's)")
    args = ap.parse_args()
    sampler = Sampler()
    before = set(int(p.name) for p in os.scandir("/proc") if p.name.isdigit())
    sampler.start()
    t0 = time.time()
    rc = subprocess.call([sys.executable, "-m", "pytest", *(args.pytest_args or make_test_args())], cwd=REPO)
    wall = time.time() - t0
    sampler.stop.set()
    sampler.join()

    procs = [p for (pid, _), p in sampler.procs.items() if pid not in before]  # what the suite started
    by_kind: dict[str, list[float]] = defaultdict(lambda: [0, 0.0])
    by_file: dict[str, float] = defaultdict(float)
    for p in procs:
        k = by_kind[kind_of(p["cmdline"])]
        k[0] += 1
        k[1] += p["cpu"]
        by_file[p["test"] or "(session: workers, shared servers)"] += p["cpu"]
    total = sum(p["cpu"] for p in procs)
    minutes: dict[int, list[float]] = defaultdict(list)
    for (t_a, busy_a, all_a), (t_b, busy_b, all_b) in zip(sampler.cpu_ticks, sampler.cpu_ticks[1:]):
        if all_b > all_a:
            minutes[int((t_b - t0) // 60)].append((busy_b - busy_a) / (all_b - all_a))
    cores = os.cpu_count() or 1
    busy = [100 * cores * sum(v) / len(v) for _, v in sorted(minutes.items())]
    mean_busy = sum(busy) / len(busy) if busy else 0.0

    print(f"\n[bench_suite] pytest exit {rc}; wall {wall:.0f} s; {total:.0f} CPU-s in the processes it started "
          f"({total / wall * 100:.0f} % of one core on average); all cores busy {mean_busy:.0f} % of "
          f"{100 * cores} % on average")
    print("[bench_suite] machine CPU by minute (%): " + " ".join(f"{b:.0f}" for b in busy))
    print("[bench_suite] CPU-s by kind of process:")
    for kind, (n, cpu) in sorted(by_kind.items(), key=lambda kv: -kv[1][1]):
        print(f"  {cpu:8.1f}  {cpu / total * 100:4.1f} %  {int(n):4d} processes  {kind}")
    print("[bench_suite] CPU-s of processes each test file started (15 most):")
    for name, cpu in sorted(by_file.items(), key=lambda kv: -kv[1])[:15]:
        print(f"  {cpu:8.1f}  {name}")
    if args.json:
        args.json.write_text(json.dumps({"rc": rc, "wall_s": wall, "cpu_s": total, "busy_by_minute": busy,
                                         "by_kind": {k: {"processes": int(n), "cpu_s": c} for k, (n, c) in by_kind.items()},
                                         "by_file": by_file}, indent=2))
    return rc


if __name__ == "__main__":
    sys.exit(main())
