"""The speed-and-scale table of issue 11, measured in one run (not a test; the numbers
go to BENCHMARKS.md with the machine they were measured on).

Every figure is the median of --repeat whole processes (`python -m capturelint.cli`, the
torch import included, as a user runs it), with the peak resident memory of the process
and its workers. Each is also given as a ratio to the unit measured in the same run: an
untraced `capturelint engine run --runner v1 --mode PIECEWISE` (one configuration and
its eager twin, no tracer), so the figures survive a noisy machine.

    python bench/bench_matrix.py [--repeat 3] [--skip-61] [--jobs N]
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import subprocess
import sys

UNIT = ["engine", "run", "--runner", "v1", "--mode", "PIECEWISE"]
WORKLOADS = [
    ("check --runner all (8 configurations, 4 layers, 24 steps)", ["check", "--runner", "all"], 10.0, None),
    ("check --runner v1 --layers 61 (4 modes)", ["check", "--runner", "v1", "--layers", "61"], 45.0, 1024.0),
    ("check --runner v1 --layers 8", ["check", "--runner", "v1", "--layers", "8"], 9.0, None),
]


# A fresh process per measurement, whose RUSAGE_CHILDREN peak covers capturelint and its
# workers only (the benchmark's own children accumulate across measurements).
_MEASURE = """
import resource, subprocess, sys, time
t0 = time.perf_counter()
done = subprocess.run(sys.argv[1:], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
wall = time.perf_counter() - t0
print(done.returncode, wall, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)
sys.stderr.write(done.stderr[-500:])
"""


def run(argv: list[str]) -> tuple[float, float]:
    """Wall seconds and peak RSS (MiB, the largest of the process and its workers)."""
    done = subprocess.run([sys.executable, "-c", _MEASURE, sys.executable, "-m", "capturelint.cli", *argv],
                          capture_output=True, text=True)
    code, wall, peak_kib = done.stdout.split()
    if int(code) not in (0, 1):
        raise SystemExit(f"{' '.join(argv)} failed ({code}): {done.stderr.strip()}")
    return float(wall), int(peak_kib) / 1024.0


def measure(argv: list[str], repeat: int) -> tuple[float, float, list[float]]:
    walls, peaks = [], []
    for _ in range(repeat):
        wall, peak = run(argv)
        walls.append(wall)
        peaks.append(peak)
    return statistics.median(walls), max(peaks), walls


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--skip-61", action="store_true", help="leave out the 61-layer workload (minutes)")
    ap.add_argument("--jobs", type=int, default=None, help="--jobs for the checks (default: capturelint's default)")
    args = ap.parse_args()
    extra = ["--format", "json"] + ([] if args.jobs is None else ["--jobs", str(args.jobs)])
    unit, _, unit_runs = measure(UNIT, args.repeat)
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    print(f"machine: {platform.machine()} {platform.processor() or ''}, {cores} usable cores, Python "
          f"{platform.python_version()}; medians of {args.repeat} processes")
    print(f"unit: `capturelint {' '.join(UNIT)}` (untraced, with its eager twin): {unit:.2f} s "
          f"(runs {', '.join(f'{w:.2f}' for w in unit_runs)})\n")
    print("| workload | goal | median wall (s) | runs (s) | / unit | peak RSS (MiB) | met |")
    print("|---|---|---:|---|---:|---:|---|")
    for name, argv, goal_s, goal_mib in WORKLOADS:
        if args.skip_61 and "61" in argv:
            continue
        wall, peak, walls = measure(argv + extra, args.repeat)
        goal = f"<= {goal_s:g} s" + (f", <= {goal_mib / 1024:g} GiB" if goal_mib else "")
        met = wall <= goal_s and (goal_mib is None or peak <= goal_mib)
        print(f"| `capturelint {' '.join(argv)}` | {goal} | {wall:.1f} | {', '.join(f'{w:.1f}' for w in walls)} | "
              f"{wall / unit:.1f} | {peak:.0f} | {'yes' if met else 'no'} |")


if __name__ == "__main__":
    main()
