"""Issue 29's speed table, measured in one run (not a test: the numbers go to
BENCHMARKS.md with the machine and its load).

Every figure is a whole process (`python -m capturelint.cli ...`, the torch import
included, as a user runs it): its wall time, the user CPU time of it and its workers,
and the peak resident memory of the largest of them. The unit, measured in the same run
(first and last, the median of those runs taken), is one untraced
`capturelint engine run --runner v2 --mode FULL` (one configuration and its eager twin,
no tracer); every workload is also printed as a ratio to it, or to the check it is
compared with, so the table survives a noisy, shared machine better than seconds do.

    python bench/bench_speed.py [--repeat 2] [--skip-61] [--skip-suggest] [--skip-suite]

The whole table is the one command without options: last it times `python -m pytest -q`
(the default suite, the README's command: the whole process's wall time, and the CPU
of it and its workers) and `python -m pytest -q -m slow` (the opt-in matrices), each from the
repository root; ``--skip-suite`` leaves those out (minutes).
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
UNIT = ["engine", "run", "--runner", "v2", "--mode", "FULL"]
MATRIX = ["check", "--runner", "all", "--format", "json"]
LAYERS_61 = ["check", "--runner", "v1", "--layers", "61", "--format", "json"]
ONE_CHECK = ["check", "--runner", "v1", "--eager-region", "narrow", "--format", "json"]
STATIC = ["check", "--static", "--runner", "v1", "--eager-region", "narrow", "--format", "json"]
SUGGEST = ["suggest", "--runner", "v1", "--eager-region", "narrow", "--format", "json"]

# A fresh process per measurement, whose RUSAGE_CHILDREN covers the command and its
# workers only (the benchmark's own children accumulate across measurements).
_MEASURE = """
import resource, subprocess, sys, time
t0 = time.perf_counter()
done = subprocess.run(sys.argv[1:], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, cwd=None)
wall = time.perf_counter() - t0
r = resource.getrusage(resource.RUSAGE_CHILDREN)
print(done.returncode, wall, r.ru_utime + r.ru_stime, r.ru_maxrss)
sys.stderr.write(done.stderr[-800:])
"""


@dataclass
class Run:
    wall: float
    cpu: float  # CPU seconds (user + system) of the process and its workers
    peak_mib: float  # the largest resident set among them
    code: int


def run(argv: list[str], module: bool = True) -> Run:
    cmd = [sys.executable, "-m", "capturelint.cli", *argv] if module else argv
    done = subprocess.run([sys.executable, "-c", _MEASURE, *cmd], capture_output=True, text=True, cwd=ROOT)
    try:
        code, wall, cpu, peak_kib = done.stdout.split()
    except ValueError:
        raise SystemExit(f"{' '.join(argv)}: the measurement failed: {done.stderr.strip()[-500:]}") from None
    if module and int(code) not in (0, 1):
        raise SystemExit(f"{' '.join(argv)} failed (exit {code}): {done.stderr.strip()[-500:]}")
    return Run(float(wall), float(cpu), int(peak_kib) / 1024.0, int(code))


def runs(argv: list[str], repeat: int, module: bool = True) -> list[Run]:
    return [run(argv, module) for _ in range(repeat)]


def med(rs: list[Run], field: str = "wall") -> float:
    return statistics.median(getattr(r, field) for r in rs)


def fmt(rs: list[Run]) -> str:
    return ", ".join(f"{r.wall:.1f}" for r in rs)


def load() -> str:
    try:
        return "load average " + " ".join(open("/proc/loadavg").read().split()[:3])
    except OSError:
        return "load average unknown"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeat", type=int, default=2, help="processes per workload (default 2)")
    ap.add_argument("--skip-61", action="store_true", help="leave out the 61-layer check (minutes)")
    ap.add_argument("--skip-suggest", action="store_true", help="leave out suggest (minutes)")
    ap.add_argument("--skip-suite", action="store_true", help="leave out the test suite, default and -m slow (minutes)")
    a = ap.parse_args()
    if a.repeat < 1:
        raise SystemExit("--repeat must be at least 1")
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    print(f"machine: {platform.machine()} {platform.processor() or ''}, {cores} usable cores, Python "
          f"{platform.python_version()}, {load()} at the start; {a.repeat} process(es) per row, medians")

    unit_runs = runs(UNIT, a.repeat)
    matrix = runs(MATRIX, a.repeat)
    deep = None if a.skip_61 else run(LAYERS_61)
    full, static = [], []
    for _ in range(a.repeat):  # alternating, so both see the same load
        full.append(run(ONE_CHECK))
        static.append(run(STATIC))
    sug = None if a.skip_suggest else run(SUGGEST)
    unit_runs.extend(runs(UNIT, a.repeat))  # the unit again, after: the load may have moved
    u = med(unit_runs)

    uc = med(unit_runs, "cpu")
    print(f"unit: `capturelint {' '.join(UNIT)}` (untraced, with its eager twin): {u:.2f} s wall, {uc:.2f} s CPU "
          f"(runs {fmt(unit_runs)})\n")
    print("Ratios: wall / wall and CPU / CPU of the same runs (CPU time survives a loaded machine better).\n")
    print("| workload | measured (wall) | CPU | peak RSS | ratio wall | ratio CPU | goal |")
    print("|---|---|---:|---:|---:|---:|---|")

    def row(name: str, rs: list[Run], base_wall: float, base_cpu: float, goal: str, what: str = "x unit") -> None:
        print(f"| {name} | {med(rs):.1f} s ({fmt(rs)}) | {med(rs, 'cpu'):.1f} s | {max(r.peak_mib for r in rs):.0f} MiB "
              f"| {med(rs) / base_wall:.2f} {what} | {med(rs, 'cpu') / base_cpu:.2f} {what} | {goal} |")

    row("`check --runner all` (8 configurations)", matrix, u, uc, "<= 2.0 x")
    if deep is not None:
        row("`check --runner v1 --layers 61`", [deep], u, uc, "<= 8.5 x, <= 1 GiB")
    row("`check --static` (v1, narrow)", static, med(full), med(full, "cpu"), "<= 0.3", "x full check")
    row("the full check (v1, narrow)", full, u, uc, "(the base of the two rows around it)")
    if sug is not None:
        row("`suggest --runner v1 --eager-region narrow`", [sug], med(full), med(full, "cpu"), "<= 4", "x full check")

    if not a.skip_suite:
        env_note = "two pytest workers (-n auto)" if cores == 2 else f"-n auto on {cores} cores"
        suite = run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider"], module=False)
        slow = run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-m", "slow"], module=False)
        print(f"\nsuite ({env_note}): `python -m pytest -q` {suite.wall:.0f} s wall, {suite.cpu:.0f} s CPU (exit "
              f"{suite.code}); `python -m pytest -q -m slow` {slow.wall:.0f} s wall, {slow.cpu:.0f} s CPU (exit "
              f"{slow.code}); {load()} at the end")
    else:
        print(f"\n{load()} at the end")


if __name__ == "__main__":
    main()
